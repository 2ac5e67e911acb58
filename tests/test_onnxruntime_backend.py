"""The ONNX Runtime backend against the real library: CPU here, CUDA on a GPU machine."""

from pathlib import Path

import numpy as np
import optuna
import pytest
from conftest import cpu_count

from gpt_optuna.backends.base import BuildError
from gpt_optuna.backends.onnxruntime.backend import OPERATOR_FAILED, OnnxRuntimeBackend
from gpt_optuna.backends.onnxruntime.knobs import (
    applicable_cuda_options,
    discover_knobs,
    model_ops,
    operator_limits,
    optimized_ops,
)
from gpt_optuna.backends.onnxruntime.settings import (
    CPU,
    CUDA,
    CUDA_OPTIONS,
    TENSORRT,
    cuda_option_keys,
    provider_options,
    session_options,
    session_settings,
    thread_choices,
    usable_providers,
)
from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.core.space import Space
from gpt_optuna.graph import feeds as mf
from gpt_optuna.graph import model as m
from gpt_optuna.protocol.accuracy import parse_criterion
from gpt_optuna.protocol.jobs import EvaluateJob
from gpt_optuna.protocol.outcome import Outcome
from gpt_optuna.worker.measure import measure
from gpt_optuna.worker.reference import fp32_outputs

LEVELS = ["ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL"]


def test_thread_choices_are_bounded_by_the_machine() -> None:
    assert thread_choices(1) == (0, 1)
    assert thread_choices(6) == (0, 1, 2, 4, 6)
    assert max(thread_choices(cpu_count())) == cpu_count()


def test_cpu_space_has_threading_knobs_and_no_gpu_knobs() -> None:
    knobs = {k.name: k for k in discover_knobs([CPU], LEVELS, 4)}
    assert knobs["provider"].choices == (CPU,)
    assert knobs["intra_op_num_threads"].choices == (0, 1, 2, 4)
    assert knobs["inter_op_num_threads"].condition.parent == "execution_mode"
    assert not any(name.startswith(("cuda.", "trt.")) for name in knobs)


def test_gpu_space_searches_gpu_providers_and_keeps_cpu_knobs_for_overrides() -> None:
    space = Space(discover_knobs([CUDA, TENSORRT, CPU], LEVELS, 16))
    knobs = {k.name: k for k in space.knobs}
    assert knobs["provider"].choices == (CUDA, TENSORRT) and knobs["provider"].default == CUDA
    assert knobs["cuda.prefer_nhwc"].condition.values == (CUDA,)
    assert knobs["trt.builder_optimization_level"].condition.values == (TENSORRT,)
    assert "intra_op_num_threads" not in space.default()
    cpu_only = space.with_overrides({"provider": CPU}).default()
    assert cpu_only["provider"] == CPU and cpu_only["intra_op_num_threads"] == 0


def test_only_providers_that_create_a_session_are_offered() -> None:
    usable = usable_providers()
    assert CPU in usable
    assert "AzureExecutionProvider" not in usable


def test_session_options_mapping() -> None:
    options = session_options(
        {
            "provider": CPU,
            "graph_optimization_level": "ORT_ENABLE_BASIC",
            "mem_pattern": False,
            "execution_mode": "ORT_PARALLEL",
            "intra_op_num_threads": 2,
            "inter_op_num_threads": 1,
            "intra_op_spinning": False,
            "cpu_mem_arena": False,
            "denormal_as_zero": True,
        }
    )
    assert str(options.graph_optimization_level).endswith("ORT_ENABLE_BASIC")
    assert str(options.execution_mode).endswith("ORT_PARALLEL")
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 1)
    assert options.enable_mem_pattern is False and options.enable_cpu_mem_arena is False
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.get_session_config_entry("session.set_denormal_as_zero") == "1"


def test_provider_options_mapping(tmp_path: Path) -> None:
    cuda = provider_options(
        {
            "provider": CUDA,
            "cuda.cudnn_conv_algo_search": "HEURISTIC",
            "cuda.use_tf32": False,
            "cuda.prefer_nhwc": True,
            "cuda.enable_cuda_graph": True,
            "cuda.cudnn_conv_use_max_workspace": True,
        },
        1234,
        tmp_path,
    )
    assert cuda == {
        "device_id": "0",
        "cudnn_conv_algo_search": "HEURISTIC",
        "use_tf32": "0",
        "prefer_nhwc": "1",
        "enable_cuda_graph": "1",
        "cudnn_conv_use_max_workspace": "1",
        "has_user_compute_stream": "1",
        "user_compute_stream": "1234",
    }
    trt = provider_options(
        {
            "provider": TENSORRT,
            "trt.builder_optimization_level": 5,
            "trt.fp16": True,
            "trt.cuda_graph": False,
            "trt.auxiliary_streams": 2,
        },
        None,
        tmp_path,
    )
    assert trt["trt_builder_optimization_level"] == "5" and trt["trt_fp16_enable"] == "1"
    assert trt["trt_auxiliary_streams"] == "2" and trt["trt_timing_cache_path"] == str(tmp_path)
    assert provider_options({"provider": CPU}, None, tmp_path) == {}


ALL_KEYS = frozenset(key for option in CUDA_OPTIONS for key in option.keys)


def test_extra_cuda_options_apply_where_the_version_has_them_and_the_model_uses_them() -> None:
    def names(keys: frozenset[str], ops: set[str], version: tuple[int, int] = (1, 31)) -> set[str]:
        return {o.knob for o in applicable_cuda_options(keys, version, frozenset(ops))}

    cnn = {"Conv", "Relu", "Gemm", "GlobalAveragePool"}
    encoder = {"MatMul", "Softmax", "LayerNormalization", "Gather", "Erf"}
    assert names(ALL_KEYS, cnn) == {"cuda.fuse_conv_bias", "cuda.gemm_auto_tune", "cuda.unified_stream"}
    assert names(ALL_KEYS, encoder) == {
        "cuda.sdpa_kernel",
        "cuda.skip_layer_norm_strict",
        "cuda.unified_stream",
        "cuda.gemm_auto_tune",
        "cuda.gelu_approximation",
    }
    assert "cuda.conv1d_pad_to_nc1d" in names(ALL_KEYS, {"Conv", "Conv1D"})
    older = ALL_KEYS - {"fuse_conv_bias"}  # a version without it, and without the GEMM tuner
    assert names(older, cnn, (1, 24)) == {"cuda.unified_stream"}
    extras = applicable_cuda_options(ALL_KEYS, (1, 31), frozenset(encoder))
    knobs = {k.name: k for k in discover_knobs([CUDA, CPU], LEVELS, 4, extras)}
    assert knobs["cuda.sdpa_kernel"].choices == (0, 1, 2, 4, 8, 16) and knobs["cuda.sdpa_kernel"].default == 0
    assert knobs["cuda.gemm_auto_tune"].condition.values == (CUDA,)


def test_model_ops_tell_one_dimensional_convolutions(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 2, 3), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])],
        "conv1d",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 14])],
        [w],
    )
    path = tmp_path / "conv1d.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert model_ops(path) == {"Conv", "Conv1D"}


def test_attention_settings_are_offered_from_a_softmax_and_kept_where_an_attention_operator_runs() -> None:
    extras = applicable_cuda_options(ALL_KEYS, (1, 31), frozenset({"MatMul", "Softmax", "Erf"}))
    space = Space(discover_knobs([CUDA], LEVELS, 4, extras))
    assert "cuda.sdpa_kernel" in {k.name for k in space.knobs}
    (limit,) = operator_limits(space, frozenset({"MatMul", "Softmax", "Erf"}))  # a plain Softmax: no kernel to pick
    assert limit.knob == "cuda.sdpa_kernel" and limit.allowed is None and "Attention" in limit.reason
    assert operator_limits(space, frozenset({"MatMul", "Attention", "BiasGelu"})) == []
    assert "cuda.sdpa_kernel" not in {o.knob for o in applicable_cuda_options(ALL_KEYS, (1, 31), frozenset({"MatMul"}))}


def test_optimized_ops_include_what_onnx_runtime_fuses_at_session_creation(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    constants = [
        numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("r2", 2**0.5), ("one", 1.0), ("half", 0.5))
    ]
    nodes = [  # Gelu written out: 0.5 * x * (1 + erf(x / sqrt(2)))
        helper.make_node("Div", ["x", "r2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("Add", ["e", "one"], ["a"]),
        helper.make_node("Mul", ["x", "a"], ["p"]),
        helper.make_node("Mul", ["p", "half"], ["y"]),
    ]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 8]) for n in ("x", "y")]
    path = tmp_path / "gelu.onnx"
    model = helper.make_model(
        helper.make_graph(nodes, "gelu", io[:1], io[1:], constants), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    onnx.save(model, path)
    info = m.load_model_info(path)
    backend = OnnxRuntimeBackend()
    candidate = backend.space(info, {}).default()
    assert "Gelu" not in model_ops(path)
    assert {"Gelu", "Erf"} <= optimized_ops(info, candidate, tmp_path)  # the graph's own, and the fused one
    basic = optimized_ops(info, {**candidate, "graph_optimization_level": "ORT_ENABLE_BASIC"}, tmp_path)
    assert "Gelu" not in basic
    assert list(tmp_path.iterdir()) == [path]  # the optimized copy is gone


def test_extra_cuda_options_map_onto_the_providers_keys(tmp_path: Path) -> None:
    base = {
        "provider": CUDA,
        "cuda.cudnn_conv_algo_search": "EXHAUSTIVE",
        "cuda.use_tf32": True,
        "cuda.prefer_nhwc": False,
        "cuda.cudnn_conv_use_max_workspace": True,
    }
    extra = {"cuda.gemm_auto_tune": True, "cuda.sdpa_kernel": 8, "cuda.unified_stream": False}
    options = provider_options({**base, **extra}, None, tmp_path)
    assert options["sdpa_kernel"] == "8" and options["use_ep_level_unified_stream"] == "0"
    assert "fuse_conv_bias" not in provider_options(base, None, tmp_path)
    settings = session_settings({**base, **extra, "graph_optimization_level": "ORT_ENABLE_ALL", "mem_pattern": True})
    assert settings["session_config_entries"] == {"ep.cuda.enable_gemm_auto_tune": "1"}


def _prepare(path: Path, flags: list[str]):
    info = m.load_model_info(path)
    shapes = m.resolve_shapes(info, m.parse_shapes(flags))
    feeds = mf.synthetic_feeds(info, shapes)
    return info, shapes, feeds, fp32_outputs(info, [feeds])[0]


def test_every_sampled_cpu_candidate_builds_runs_and_matches_the_reference(cnn_path: Path, tmp_path: Path) -> None:
    info, shapes, feeds, reference = _prepare(cnn_path, [])
    backend = OnnxRuntimeBackend()
    space = backend.space(info, {})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    criterion = parse_criterion("cosine>=0.99999 and max_abs<=1e-3")
    seen = set()
    for candidate in [space.default()] + [space.suggest(study.ask()) for _ in range(12)]:
        built = backend.build(info, candidate, EnginePaths.under(tmp_path), shapes)
        assert built.build_s > 0
        with backend.open(built, feeds, reference) as runner:
            verdict = criterion.evaluate(runner.infer(), reference)
            assert verdict.feasible, (candidate, verdict.reason)
            stats = measure(runner, MeasureSettings(budget_s=0.2))
            assert stats.median_ms > 0 and stats.samples >= 10
        seen.add(candidate["graph_optimization_level"])
    assert len(seen) > 1


def test_unsupported_model_is_a_build_error(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"], domain="com.example")],
        "bad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    path = tmp_path / "bad.onnx"
    onnx.save(model, path)
    info = m.load_model_info(path)
    backend = OnnxRuntimeBackend()
    with pytest.raises(BuildError, match="could not create the session"):
        backend.build(info, backend.space(info, {}).default(), EnginePaths.under(tmp_path), {})


def out_of_bounds_gather(path: Path) -> Path:
    """A graph ONNX Runtime loads and then refuses to run: its Gather reads index 5 of 3."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "index"], ["y"], axis=1)],
        "gather",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
        [numpy_helper.from_array(np.array([5], np.int64), "index")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_an_operator_that_fails_on_its_inputs_is_the_candidates_refusal_and_memory_is_not(tmp_path: Path) -> None:
    import onnxruntime as ort

    session = ort.InferenceSession(str(out_of_bounds_gather(tmp_path / "gather.onnx")), providers=[CPU])
    with pytest.raises(Exception) as plain:
        session.run(None, {"x": np.zeros((1, 3), np.float32)})
    binding = session.io_binding()
    binding.bind_cpu_input("x", np.zeros((1, 3), np.float32))
    binding.bind_output("y")
    with pytest.raises(RuntimeError) as bound:
        session.run_with_iobinding(binding)
    backend = OnnxRuntimeBackend()
    for error in (plain.value, bound.value):
        reason = backend.refused_run(error)
        assert reason is not None and reason.startswith("Non-zero status code returned while running Gather node")
        assert "out of data bounds" in reason
    oom = RuntimeError(
        f"Error in execution: {OPERATOR_FAILED} Conv node. Status Message: CUDA failure 2: out of memory"
    )
    assert backend.refused_run(oom) is None
    assert backend.refused_run(ValueError("a fault of ours")) is None


def test_a_candidate_the_engine_refuses_to_run_fails_as_deterministically_as_a_build(tmp_path: Path) -> None:
    info = m.load_model_info(out_of_bounds_gather(tmp_path / "gather.onnx"))
    shapes = m.resolve_shapes(info, {})
    mf.save_npz(tmp_path / "inputs.npz", mf.stack([{"x": np.zeros((1, 3), np.float32)}]))
    mf.save_npz(tmp_path / "reference.npz", mf.stack([{"y": np.zeros((1, 1), np.float32)}]))
    job = EvaluateJob(
        backend="onnxruntime",
        model=info,
        candidate={**OnnxRuntimeBackend().space(info, shapes).default(), "provider": CPU},
        workdir=tmp_path,
        shapes=shapes,
        feeds_path=tmp_path / "inputs.npz",
        reference_path=tmp_path / "reference.npz",
        criterion=parse_criterion("cosine>=0.99"),
        settings=MeasureSettings(budget_s=0.05),
    )
    result = job()
    assert result.outcome is Outcome.BUILD_ERROR and result.outcome.is_deterministic
    assert result.detail.startswith("the engine cannot run it: Non-zero status code returned while running Gather")
    assert "Traceback" in result.log


@pytest.mark.gpu
def test_cuda_candidates_run_on_cupy_buffers_and_stream(cnn_path: Path, tmp_path: Path) -> None:
    import cupy

    info, shapes, feeds, reference = _prepare(cnn_path, [])
    backend = OnnxRuntimeBackend()
    space = backend.space(info, {})
    assert space.default()["provider"] == CUDA
    criterion = parse_criterion("cosine>=0.999")
    base = space.default()
    variants = [
        base,
        {**base, "cuda.enable_cuda_graph": True},
        {**base, "cuda.prefer_nhwc": True, "cuda.use_tf32": False},
    ]
    for candidate in variants:
        built = backend.build(info, candidate, EnginePaths.under(tmp_path), shapes)
        with backend.open(built, feeds, reference) as runner:
            assert isinstance(runner.stream, cupy.cuda.Stream) and runner.stream.ptr != 0
            verdict = criterion.evaluate(runner.infer(), reference)
            assert verdict.feasible, (candidate, verdict.reason)
            stats = measure(runner, MeasureSettings(budget_s=0.5))
            assert 0 < stats.median_ms < 50


@pytest.mark.gpu
def test_the_installed_version_has_the_extra_cuda_options_and_each_value_runs(cnn_path: Path, tmp_path: Path) -> None:
    keys = cuda_option_keys()  # 1.31.1 has these; strict SkipLayerNorm mode went before it
    assert {"fuse_conv_bias", "sdpa_kernel", "use_ep_level_unified_stream", "cudnn_conv1d_pad_to_nc1d"} <= keys
    info, shapes, feeds, reference = _prepare(cnn_path, [])
    backend = OnnxRuntimeBackend()
    space = backend.space(info, {})
    base = space.default()
    criterion = parse_criterion("cosine>=0.999")
    offered = [k for k in space.knobs if k.name in {o.knob for o in CUDA_OPTIONS}]
    assert {k.name for k in offered} >= {"cuda.fuse_conv_bias", "cuda.unified_stream"}
    for knob in offered:
        for value in knob.choices:
            built = backend.build(info, {**base, knob.name: value}, EnginePaths.under(tmp_path), shapes)
            with backend.open(built, feeds, reference) as runner:
                verdict = criterion.evaluate(runner.infer(), reference)
                assert verdict.feasible, (knob.name, value, verdict.reason)


@pytest.mark.gpu
def test_cuda_graph_replays_each_new_sample_not_the_first(cnn_path: Path, tmp_path: Path) -> None:
    info, shapes, _, _ = _prepare(cnn_path, [])
    samples = [mf.synthetic_feeds(info, shapes, seed=seed) for seed in range(3)]
    references = fp32_outputs(info, samples)
    backend = OnnxRuntimeBackend()
    base = backend.space(info, {}).default()
    criterion = parse_criterion("cosine>=0.999 and max_abs<=1e-2")
    for candidate in (base, {**base, "cuda.enable_cuda_graph": True}):
        built = backend.build(info, candidate, EnginePaths.under(tmp_path), shapes)
        with backend.open(built, samples[0], references[0]) as runner:
            outputs = []
            for feeds in samples:
                runner.set_inputs(feeds)
                outputs.append(runner.infer())
            verdict = criterion.evaluate(outputs, references)
            assert verdict.feasible, (candidate, verdict.reason)
            assert not np.allclose(outputs[0]["logits"], outputs[1]["logits"], atol=1e-3)


@pytest.mark.gpu
def test_checking_a_plain_softmax_graph_on_cuda_drops_the_attention_kernel_setting(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.eye(8, dtype=np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["s"]), helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 8]) for n in ("x", "y")]
    model = helper.make_model(
        helper.make_graph(nodes, "softmax", io[:1], io[1:], [w]), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    path = tmp_path / "softmax.onnx"
    onnx.save(model, path)
    info = m.load_model_info(path)
    backend = OnnxRuntimeBackend()
    space = backend.space(info, {})
    assert "cuda.sdpa_kernel" in {k.name for k in space.knobs}  # offered from the Softmax, then checked
    limits = backend.check_model(info, space, space.default(), EnginePaths.under(tmp_path), {})
    assert [(x.knob, x.allowed) for x in limits if x.knob == "cuda.sdpa_kernel"] == [("cuda.sdpa_kernel", None)]
