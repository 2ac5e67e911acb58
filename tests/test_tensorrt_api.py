"""The TensorRT backend against the API names of TensorRT 10.16, 11.4 and RTX 1.7.

A strict fake built from the names read off the real bindings (tests/data/tensorrt_api.json)
runs every code path of the backend, space discovery, every knob value, build and runtime, so any
attribute or enum member the backend touches that a version lacks fails here. The same fake
records calls, which checks the knob -> API mapping for the 10.x and 11.x paths no library here
can run. Nothing here shows that an engine works: tests/test_tensorrt_rtx.py builds real ones.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from fake_tensorrt import ROUTES_JSON, VERSIONS, FakeCuPy, FakeTensorRT

from gpt_optuna.backends.base import BuildError, Profiling
from gpt_optuna.backends.tensorrt.backend import TensorRTBackend, TensorRTRTXBackend
from gpt_optuna.backends.tensorrt.knobs import MIB, parse_build_routes, route_string
from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.core.space import Space
from gpt_optuna.graph import model as m


def backend(fake: FakeTensorRT) -> TensorRTBackend:
    instance = TensorRTRTXBackend() if fake.version == "rtx" else TensorRTBackend()
    instance._trt = fake  # type: ignore[assignment]
    return instance


@pytest.fixture(params=VERSIONS)
def fake(request: pytest.FixtureRequest) -> FakeTensorRT:
    return FakeTensorRT(request.param)


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> FakeCuPy:
    cupy = FakeCuPy()
    monkeypatch.setitem(sys.modules, "cupy", cupy)  # type: ignore[arg-type]
    return cupy


def space_of(fake: FakeTensorRT, path: Path) -> tuple[m.ModelInfo, Space]:
    info = m.load_model_info(path)
    return info, backend(fake).space(info, m.resolve_shapes(info, {}))


def test_space_follows_what_each_version_has(fake: FakeTensorRT, cnn_path: Path) -> None:
    _, space = space_of(fake, cnn_path)
    knobs = {k.name: k for k in space.knobs}
    defaults = space.default()
    assert defaults["builder_optimization_level"] == 3 and defaults["flag.TF32"] is True
    assert knobs["tiling_optimization_level"].choices == ("NONE", "FAST", "MODERATE", "FULL")
    assert defaults["tactic.JIT_CONVOLUTIONS"] is True
    weak = {"flag.FP16", "flag.BF16"} & knobs.keys()
    if fake.version == "10.x":
        assert weak == {"flag.FP16", "flag.BF16"} and "tactic.CUBLAS" not in knobs  # not in the wheels
        assert "flag.INT8" not in knobs  # no Q/DQ in the graph: INT8 alone would be nonsense
    else:
        assert not weak and "tactic.CUBLAS" not in knobs
    routes = {name: k for name, k in knobs.items() if name.startswith("route.")}
    if fake.version == "11.x":
        assert routes["route.kgen:tiling"].choices == ("0", "1", "2")
        assert routes["route.conv_use_long_w"].choices == ("off", "on")
        assert routes["route.cask_fusion:num_tactics"].choices == ("10",)  # open-ended: fixed unless listed
        screened = {name for name, knob in knobs.items() if knob.screened}  # the route screen's knobs
        assert screened == {"route.kgen:tiling", "route.conv_use_long_w"}
    else:
        assert not routes
    if fake.version == "rtx":
        assert knobs["runtime.cuda_graph_strategy"].choices == ("DISABLED", "WHOLE_GRAPH_CAPTURE")
    else:
        assert knobs["runtime.cuda_graph"].choices == (False, True)


def configuration(space: Space, values: dict) -> dict:
    """Every active knob at the given value or its default, as the sampler would propose."""
    params: dict = {}
    for knob in space.knobs:
        if knob.active(params):
            params[knob.name] = values.get(knob.name, knob.default)
    return params


def one_change_candidates(space: Space) -> list[dict]:
    """The default, then every non-default value of every knob, one at a time."""
    out = [space.default()]
    for knob in space.knobs:
        parent = {knob.condition.parent: knob.condition.values[0]} if knob.condition else {}
        out += [configuration(space, {**parent, knob.name: v}) for v in knob.choices if v != knob.default]
    return out


def test_every_knob_value_touches_only_names_the_version_has(
    fake: FakeTensorRT, fake_cupy: FakeCuPy, cnn_path: Path, tmp_path: Path
) -> None:
    info, space = space_of(fake, cnn_path)
    shapes = m.resolve_shapes(info, {})
    feeds = {"x": np.zeros((1, 3, 64, 64), np.float32)}  # the fake engine's I/O tensors are x and y
    trt_backend = backend(fake)
    candidates = one_change_candidates(space)
    assert len(candidates) > 20
    for candidate in candidates:
        built = trt_backend.build(info, candidate, EnginePaths.under(tmp_path), shapes)
        assert built.facts.engine_bytes == len(b"fake plan")
        with trt_backend.open(built, feeds, {"y": np.zeros((1, 10), np.float32)}) as runner:
            assert runner.infer()["y"].shape == (1, 10)
            runner.launch()
            assert runner.facts.device_memory_bytes == 4096


def build_one(fake: FakeTensorRT, path: Path, tmp_path: Path, **changes: object) -> FakeTensorRT:
    info, space = space_of(fake, path)
    fake.calls.clear()
    backend(fake).build(info, configuration(space, changes), EnginePaths.under(tmp_path), m.resolve_shapes(info, {}))
    return fake


@pytest.mark.parametrize("version", VERSIONS)
def test_builder_knobs_map_onto_config_calls(version: str, cnn_path: Path, tmp_path: Path) -> None:
    fake = build_one(
        FakeTensorRT(version),
        cnn_path,
        tmp_path,
        builder_optimization_level=5,
        tiling_optimization_level="FULL",
        max_aux_streams=2,
        workspace_mib=1024,
        **{"flag.TF32": False, "tactic.JIT_CONVOLUTIONS": False},
    )
    assert fake.written("IBuilderConfig.builder_optimization_level") == [5]
    assert [v.name for v in fake.written("IBuilderConfig.tiling_optimization_level")] == ["FULL"]
    assert fake.written("IBuilderConfig.max_aux_streams") == [2]
    ((pool, size),) = fake.written("IBuilderConfig.set_memory_pool_limit")
    assert pool.name == "WORKSPACE" and size == 1024 * MIB
    assert "TF32" in [f.name for (f,) in fake.written("IBuilderConfig.clear_flag")]
    assert fake.written("IBuilderConfig.set_flag") == []
    ((mask,),) = fake.written("IBuilderConfig.set_tactic_sources")
    jit = 1 << fake.api["enum_values"]["TacticSource"]["JIT_CONVOLUTIONS"]
    edge = 1 << fake.api["enum_values"]["TacticSource"]["EDGE_MASK_CONVOLUTIONS"]
    assert mask & jit == 0 and mask & edge  # bits from the version's own enum values
    assert fake.written("IBuilderConfig.build_route") == []  # no route knob changed


def test_weak_typing_flags_only_on_10x(cnn_path: Path, tmp_path: Path) -> None:
    fake = build_one(FakeTensorRT("10.x"), cnn_path, tmp_path, **{"flag.FP16": True})
    assert [f.name for (f,) in fake.written("IBuilderConfig.set_flag")] == ["FP16"]  # TF32 is on already
    with pytest.raises(AttributeError, match="FP16"):
        FakeTensorRT("11.x").BuilderFlag.FP16  # noqa: B018


def test_route_knobs_become_the_build_route_on_11x(cnn_path: Path, tmp_path: Path) -> None:
    fake = build_one(
        FakeTensorRT("11.x"), cnn_path, tmp_path, **{"route.kgen:tiling": "2", "route.conv_use_long_w": "on"}
    )
    assert fake.written("IBuilderConfig.build_route") == ["-kgen:tiling=2 -conv_use_long_w=on"]


def test_route_json_parsing() -> None:
    routes = parse_build_routes(ROUTES_JSON)
    assert [(r.option, r.values, r.default, r.open_ended) for r in routes] == [
        ("-kgen:tiling", ("0", "1", "2"), "0", False),
        ("-conv_use_long_w", ("on", "off"), "off", False),
        ("-cask_fusion:num_tactics", (), "10", True),
    ]
    assert parse_build_routes("") == []
    assert route_string({"route.kgen:tiling": "0", "route.cask_fusion:num_tactics": "20"}, routes) == (
        "-cask_fusion:num_tactics=20"
    )


def test_dynamic_inputs_get_one_profile_from_the_shape_range(mlp_path: Path, tmp_path: Path) -> None:
    fake = FakeTensorRT("11.x")
    info = m.load_model_info(mlp_path)
    shapes = m.resolve_shapes(info, m.parse_shapes(["x:1x16/4x16/8x16"]))
    trt_backend = backend(fake)
    trt_backend.build(info, trt_backend.space(info, shapes).default(), EnginePaths.under(tmp_path), shapes)
    assert fake.written("IOptimizationProfile.set_shape") == [("x", (1, 16), (4, 16), (8, 16))]
    assert len(fake.written("IBuilderConfig.add_optimization_profile")) == 1


def test_runtime_knobs_map_onto_context_calls(fake_cupy: FakeCuPy, cnn_path: Path, tmp_path: Path) -> None:
    for version in VERSIONS:
        fake = FakeTensorRT(version)
        info, space = space_of(fake, cnn_path)
        shapes = m.resolve_shapes(info, {})
        graph = (
            {"runtime.cuda_graph_strategy": "WHOLE_GRAPH_CAPTURE"} if version == "rtx" else {"runtime.cuda_graph": True}
        )
        candidate = {**space.default(), **graph, "runtime.aux_streams": True}
        trt_backend = backend(fake)
        built = trt_backend.build(info, candidate, EnginePaths.under(tmp_path), shapes)
        fake.calls.clear()
        runner = trt_backend.open(built, {"x": np.zeros((1, 3, 64, 64), np.float32)}, {"y": np.zeros((1, 10))})
        ((streams,),) = fake.written("IExecutionContext.set_aux_streams")
        assert len(streams) == 2 and runner.stream.ptr not in streams
        if version == "rtx":
            assert [s.name for s in fake.written("IRuntimeConfig.cuda_graph_strategy")] == ["WHOLE_GRAPH_CAPTURE"]
            assert runner.stream.captures == 0  # RTX captures by itself
        else:
            assert runner.stream.captures == 1
        assert len(fake.written("IExecutionContext.set_tensor_address")) == 2


def test_strict_fake_rejects_names_a_version_lacks() -> None:
    config11 = FakeTensorRT("11.x").Builder(None).create_builder_config()
    with pytest.raises(AttributeError, match="int8_calibrator"):
        config11.int8_calibrator  # noqa: B018
    config10 = FakeTensorRT("10.x").Builder(None).create_builder_config()
    with pytest.raises(AttributeError, match="build_route"):
        config10.build_route  # noqa: B018
    with pytest.raises(AttributeError, match="CudaGraphStrategy"):
        FakeTensorRT("11.x").CudaGraphStrategy  # noqa: B018


def test_a_build_without_engine_is_a_build_error(cnn_path: Path, tmp_path: Path) -> None:
    fake = FakeTensorRT("11.x", build_ok=False)
    info, space = space_of(fake, cnn_path)
    with pytest.raises(BuildError, match="TensorRT built no engine"):
        backend(fake).build(info, space.default(), EnginePaths.under(tmp_path), {})


def test_timing_cache_is_shared_across_builds_and_a_corrupt_one_is_discarded(cnn_path: Path, tmp_path: Path) -> None:
    fake = FakeTensorRT("11.x")
    info, space = space_of(fake, cnn_path)
    trt_backend = backend(fake)
    cache = tmp_path / "timing.cache"
    trt_backend.build(info, space.default(), EnginePaths.under(tmp_path), {})
    first = cache.read_bytes()
    trt_backend.build(info, space.default(), EnginePaths.under(tmp_path), {})
    second = cache.read_bytes()
    assert set(first[6:].split(b",")) < set(second[6:].split(b","))  # loaded, then merged
    cache.write_bytes(b"\x00garbage")
    built = trt_backend.build(info, space.default(), EnginePaths.under(tmp_path), {})
    assert "set the unreadable timing cache aside" in built.facts.build_log
    assert cache.read_bytes().startswith(b"cache:")
    assert (tmp_path / "timing.cache.corrupt").read_bytes() == b"\x00garbage"  # kept for a look, not used


def test_a_timing_cache_of_another_gpu_or_version_is_left_as_it_is(cnn_path: Path, tmp_path: Path) -> None:
    fake = FakeTensorRT("11.x")
    info, space = space_of(fake, cnn_path)
    backend(fake).build(info, space.default(), EnginePaths.under(tmp_path), {})
    cache = tmp_path / "timing.cache"
    theirs = cache.read_bytes()
    fake.cache_fits = False  # the study folder is used from another GPU or TensorRT version
    built = backend(fake).build(info, space.default(), EnginePaths.under(tmp_path), {})
    assert "made on another GPU or TensorRT version" in built.facts.build_log
    assert cache.read_bytes() == theirs


@pytest.mark.parametrize("version", VERSIONS)
def test_networks_are_strongly_typed_unless_a_weak_typing_flag_is_set(
    version: str, cnn_path: Path, tmp_path: Path
) -> None:
    fake = build_one(FakeTensorRT(version), cnn_path, tmp_path)
    strongly = 1 << fake.api["enum_values"]["NetworkDefinitionCreationFlag"]["STRONGLY_TYPED"]
    assert fake.written("Builder.create_network") == [(strongly,)]  # the graph's types are the engine's
    if version == "10.x":
        for flag in ("flag.FP16", "flag.BF16"):
            assert build_one(FakeTensorRT(version), cnn_path, tmp_path, **{flag: True}).written(
                "Builder.create_network"
            ) == [(0,)]  # the flag picks precisions in a weakly typed network only


@pytest.mark.parametrize("version", VERSIONS)
def test_a_default_candidate_writes_no_setting_so_tensorrts_own_defaults_stay(
    version: str, cnn_path: Path, tmp_path: Path
) -> None:
    fake = build_one(FakeTensorRT(version), cnn_path, tmp_path)
    config_calls = {name for name, value in fake.calls if name.startswith("IBuilderConfig.") and value != "get"}
    written = {n for n in config_calls if n.split(".")[1] not in ("get_flag", "get_tactic_sources")}
    assert written <= {"IBuilderConfig.create_timing_cache", "IBuilderConfig.set_timing_cache"}
    tiled = build_one(FakeTensorRT(version), cnn_path, tmp_path, tiling_optimization_level="FULL")
    assert tiled.written("IBuilderConfig.l2_limit_for_tiling") == []  # tiling's L2 limit left to TensorRT
    assert tiled.written("IBuilderConfig.max_aux_streams") == []


def test_a_build_route_tensorrt_does_not_take_fails_the_build_instead_of_building_the_default(
    cnn_path: Path, tmp_path: Path
) -> None:
    fake = FakeTensorRT("11.x", takes_routes=False)
    info, space = space_of(fake, cnn_path)
    candidate = configuration(space, {"route.kgen:tiling": "2"})
    with pytest.raises(BuildError, match="did not take the build route '-kgen:tiling=2'"):
        backend(fake).build(info, candidate, EnginePaths.under(tmp_path), {})


def test_a_broken_capture_runs_without_a_cuda_graph_and_says_so(
    fake_cupy: FakeCuPy, cnn_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeTensorRT("11.x")
    info, space = space_of(fake, cnn_path)
    built = backend(fake).build(info, {**space.default(), "runtime.cuda_graph": True}, EnginePaths.under(tmp_path), {})
    monkeypatch.setattr(FakeCuPy, "capture_breaks", True)
    runner = backend(fake).open(built, {"x": np.zeros((1, 3, 64, 64), np.float32)}, {"y": np.zeros((1, 10))})
    assert runner.facts.cuda_graph.startswith("not capturable; ran without (RuntimeError: cudaErrorStream")
    fake.calls.clear()
    runner.launch()
    assert fake.written("IExecutionContext.execute_async_v3") == [(runner.stream.ptr,)]  # a plain launch
    runner.close()
    assert fake_cupy.pool_frees == 1  # the blocks CuPy's pool kept for the runner's stream go back


def test_one_logger_serves_every_builder_and_runtime(fake_cupy: FakeCuPy, cnn_path: Path, tmp_path: Path) -> None:
    fake = FakeTensorRT("11.x")
    info, space = space_of(fake, cnn_path)
    trt_backend = backend(fake)
    built = trt_backend.build(info, space.default(), EnginePaths.under(tmp_path), {})
    trt_backend.build(info, space.default(), EnginePaths.under(tmp_path), {})
    trt_backend.open(built, {"x": np.zeros((1, 3, 64, 64), np.float32)}, {"y": np.zeros((1, 10))}).close()
    assert fake.written("ILogger.__init__") == [()]


def test_tactic_sources_the_wheels_cannot_load_are_not_offered(cnn_path: Path) -> None:
    _, space = space_of(FakeTensorRT("10.x"), cnn_path)
    offered = {k.name for k in space.knobs if k.name.startswith("tactic.")}
    assert offered == {"tactic.EDGE_MASK_CONVOLUTIONS", "tactic.JIT_CONVOLUTIONS"}


def test_type_stubs_alone_are_no_tensorrt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stubs = tmp_path / "tensorrt"
    stubs.mkdir()
    (stubs / "__init__.pyi").write_text("class Builder: ...\n")  # what tensorrt-stubs installs
    monkeypatch.syspath_prepend(str(tmp_path))
    missing = TensorRTBackend().missing_library()
    assert missing is not None and "pip install 'gpt-optuna[tensorrt]'" in str(missing)


class TensorRT10Backend(TensorRTBackend):
    """The 10.x path on the strict stand-in, loadable by import path like any backend."""

    def __init__(self) -> None:
        super().__init__()
        self._trt = FakeTensorRT("10.x")  # type: ignore[assignment]


def test_weak_typing_flags_only_apply_while_the_graph_stays_fp32(cnn_path: Path, tmp_path: Path) -> None:
    from gpt_optuna.protocol.jobs import SpaceJob

    info = m.load_model_info(cnn_path)
    space, _, _ = SpaceJob("test_tensorrt_api:TensorRT10Backend", info, m.resolve_shapes(info, {}), tmp_path)()
    knobs = {k.name: k for k in space.knobs}
    assert knobs["precision"].choices == ("fp32", "fp16", "bf16", "int8", "fp8")
    for flag in ("flag.FP16", "flag.BF16"):
        assert knobs[flag].condition.parent == "precision" and knobs[flag].condition.values == ("fp32",)
    fp16_graph = configuration(space, {"precision": "fp16"})
    assert "flag.FP16" not in fp16_graph and "keep_io_fp32" not in knobs  # the model's I/O dtypes stay
    assert "flag.FP16" in configuration(space, {"precision": "fp32"})
    assert knobs["flag.TF32"].condition is None


def test_layer_times_come_from_the_profiler_with_the_onnx_operators_of_each_layer(
    fake_cupy: FakeCuPy, cnn_path: Path, tmp_path: Path
) -> None:
    import onnx

    nodes = onnx.load(str(cnn_path)).graph.node
    conv, relu = (next(n.output[0] for n in nodes if n.op_type == op) for op in ("Conv", "Relu"))
    for version in VERSIONS:
        fake = FakeTensorRT(version)
        fake.layers = [(f"node_of_{conv} + node_of_{relu}", 0.25), ("Reformatting CopyNode for Output Tensor 0", 0.01)]
        info, space = space_of(fake, cnn_path)
        graph = (
            {"runtime.cuda_graph_strategy": "WHOLE_GRAPH_CAPTURE"} if version == "rtx" else {"runtime.cuda_graph": True}
        )
        feeds, outputs = {"x": np.zeros((1, 3, 64, 64), np.float32)}, {"y": np.zeros((1, 10))}
        shapes = m.resolve_shapes(info, {})
        profiling = Profiling(
            info, {**space.default(), **graph}, EnginePaths.under(tmp_path), shapes, feeds, outputs, 3
        )
        found = backend(fake).layer_times(profiling)
        assert [(n.op_type, n.median_ms) for n in found] == [("Conv+Relu", 0.25), ("Reformat", 0.01)]
        assert len(fake.written("IExecutionContext.profiler")) == 1
        assert len(fake.written("IExecutionContext.execute_async_v3")) == 3  # no CUDA graph: each run profiled
        if version == "rtx":
            assert [s.name for s in fake.written("IRuntimeConfig.cuda_graph_strategy")] == ["DISABLED"]
        assert fake.written("Builder.build_serialized_network")  # no plan given: built


def test_a_runner_times_loading_its_plan_which_is_what_a_confirmation_pays_for_it(
    fake_cupy: FakeCuPy, cnn_path: Path, tmp_path: Path
) -> None:
    for version in VERSIONS:
        runner = opened(FakeTensorRT(version), cnn_path, tmp_path, np.zeros((1, 3, 64, 64), np.float32))
        assert runner.facts.rebuild_s >= 0


def test_layer_times_profile_the_trials_kept_plan_without_a_build(
    fake_cupy: FakeCuPy, cnn_path: Path, tmp_path: Path
) -> None:
    fake = FakeTensorRT("11.x")
    fake.layers = [("Conv_0", 0.25)]
    info, space = space_of(fake, cnn_path)
    feeds, outputs = {"x": np.zeros((1, 3, 64, 64), np.float32)}, {"y": np.zeros((1, 10))}
    shapes = m.resolve_shapes(info, {})
    fake.calls.clear()
    paths = EnginePaths.under(tmp_path)
    found = backend(fake).layer_times(
        Profiling(info, space.default(), paths, shapes, feeds, outputs, 2, b"the trial's plan")
    )
    assert [n.median_ms for n in found] == [0.25]
    assert fake.written("Builder.build_serialized_network") == []


def opened(fake: FakeTensorRT, cnn_path: Path, tmp_path: Path, x: np.ndarray) -> Any:
    info, space = space_of(fake, cnn_path)
    built = backend(fake).build(info, space.default(), EnginePaths.under(tmp_path), {})
    return backend(fake).open(built, {"x": x}, {"y": np.zeros((1, 10))})


def test_bf16_and_fp8_engine_io_is_held_as_bits_and_read_back_as_its_type(
    fake_cupy: FakeCuPy, cnn_path: Path, tmp_path: Path
) -> None:
    fake = FakeTensorRT("10.x")
    fake.tensor_types = {"x": "BF16", "y": "FP8"}
    x = np.array([[1.0, -2.5, 3.140625]], np.float32)
    runner = opened(fake, cnn_path, tmp_path, x)
    held = runner._buffers["x"].array
    assert held.dtype == np.uint16 and np.array_equal(held.view(ml_dtypes.bfloat16).astype(np.float32), x)
    out = runner.infer()["y"]
    assert out.dtype == np.dtype(ml_dtypes.float8_e4m3fn) and out.shape == (1, 10)
    runner.set_inputs({"x": 2 * x})
    assert np.array_equal(runner._buffers["x"].array.view(ml_dtypes.bfloat16).astype(np.float32), 2 * x)


def test_engines_no_runner_can_feed_say_why_in_one_line(fake_cupy: FakeCuPy, cnn_path: Path, tmp_path: Path) -> None:
    x = np.zeros((1, 3, 64, 64), np.float32)
    packed = FakeTensorRT("11.x")
    packed.tensor_types = {"y": "FP4"}
    with pytest.raises(RuntimeError, match="'y' is fp4, a packed type"):
        opened(packed, cnn_path, tmp_path, x)
    data_dependent = FakeTensorRT("11.x")
    data_dependent.output_shape = (-1, 4)  # a NonZero's, say
    with pytest.raises(RuntimeError, match="'y' has a data-dependent shape"):
        opened(data_dependent, cnn_path, tmp_path, x)


def test_a_shape_tensor_input_is_given_in_host_memory(fake_cupy: FakeCuPy, cnn_path: Path, tmp_path: Path) -> None:
    fake = FakeTensorRT("11.x")
    fake.host_tensors = {"x"}
    fake.tensor_types = {"x": "INT64"}
    runner = opened(fake, cnn_path, tmp_path, np.array([2, 3], np.int64))
    addresses = dict(fake.written("IExecutionContext.set_tensor_address"))
    assert addresses["x"] == runner._host["x"].ctypes.data and "x" not in runner._buffers
    runner.set_inputs({"x": np.array([2, 3], np.int64)})  # the same values: the outputs fit
    with pytest.raises(RuntimeError, match="shape tensor 'x' changed"):
        runner.set_inputs({"x": np.array([4, 5], np.int64)})
    calls = [name for name, _ in fake.calls]
    first_shape = calls.index("IExecutionContext.get_tensor_shape")
    assert calls.index("IExecutionContext.set_tensor_address") < first_shape  # its values size the outputs


def test_a_kept_plan_is_loaded_without_a_build_and_one_this_gpu_cannot_load_is_built_again(
    cnn_path: Path, tmp_path: Path
) -> None:
    from types import SimpleNamespace

    from gpt_optuna.worker.evaluate import built_or_loaded

    fake = FakeTensorRT("11.x")
    info, space = space_of(fake, cnn_path)
    plan = tmp_path / "kept.plan"
    plan.write_bytes(b"the trial's plan")
    job = SimpleNamespace(
        saved_engine=plan, engine_candidate=space.default(), engine_paths=EnginePaths.under(tmp_path), shapes={}
    )
    fake.calls.clear()
    loaded = built_or_loaded(backend(fake), info, job)  # type: ignore[arg-type]
    assert backend(fake).serialize(loaded) == b"the trial's plan"
    assert fake.written("Builder.build_serialized_network") == []
    fake.loads_plans = False  # a plan of another GPU architecture or TensorRT version
    rebuilt = built_or_loaded(backend(fake), info, job)  # type: ignore[arg-type]
    assert backend(fake).serialize(rebuilt) == b"fake plan" and fake.written("Builder.build_serialized_network")
