"""Precision sets on real ONNX Runtime: fp16 with parts kept fp32, int8 Q/DQ, caching, ranking."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import optuna
import pytest
from conftest import save
from onnx import TensorProto, helper, numpy_helper
from optuna.trial import TrialState

from gpt_optuna.cli import main
from gpt_optuna.core.errors import EXIT_USER_ERROR
from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.graph import feeds as mf
from gpt_optuna.graph import model as m
from gpt_optuna.graph.precision import PrecisionSetting, precision_knobs, transform
from gpt_optuna.protocol.accuracy import parse_criterion
from gpt_optuna.protocol.jobs import EvaluateJob
from gpt_optuna.protocol.outcome import Outcome
from gpt_optuna.testing.small_cnn import small_cnn
from gpt_optuna.worker.reference import fp32_outputs
from gpt_optuna.worker.sensitivity import rank_sensitive_nodes, ranking_session


def overflow_model() -> onnx.ModelProto:
    """x[4,16] -> MatMul (large weights: outputs ~1e5, beyond fp16's 65504) -> Max(., 0) -> LayerNorm
    -> MatMul. In fp16 the first MatMul's output overflows, and the Inf runs through Max and the
    LayerNorm into NaN. (Max and LayerNorm have fp16 kernels on ONNX Runtime's CPU provider, so the
    overflow really happens there; most other CPU kernels compute fp16 graphs in fp32.)
    """
    rng = np.random.default_rng(0)
    signs = rng.choice([1.0, -1.0], (16, 32)) * rng.choice([1.0, 1.2], (16, 32))
    weights = {
        "big": (6000.0 * signs).astype(np.float32),
        "zero": np.zeros(1, np.float32),
        "gamma": np.ones(32, np.float32),
        "beta": np.zeros(32, np.float32),
        "small": rng.standard_normal((32, 8)).astype(np.float32),
    }
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "big"], ["h"], name="blowup"),
            helper.make_node("Max", ["h", "zero"], ["r"], name="rectify"),
            helper.make_node("LayerNormalization", ["r", "gamma", "beta"], ["n"], name="norm"),
            helper.make_node("MatMul", ["n", "small"], ["y"], name="project"),
        ],
        "overflow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture
def overflow_path(tmp_path: Path) -> Path:
    return save(overflow_model(), tmp_path / "overflow.onnx")


def inputs(path: Path) -> tuple[m.ModelInfo, m.Feeds, m.Feeds]:
    info = m.load_model_info(path)
    feeds = mf.synthetic_feeds(info, m.resolve_shapes(info, {}))
    x = np.abs(feeds["x"]) + 1.0  # positive inputs: the first MatMul really reaches ~1e5
    feeds = {"x": x.astype(np.float32)}
    return info, feeds, fp32_outputs(info, [feeds])[0]


def run(path: Path, feeds: m.Feeds) -> np.ndarray:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def test_overflowing_nodes_rank_first(overflow_path: Path) -> None:
    _, feeds, reference = inputs(overflow_path)
    assert np.all(np.isfinite(reference["y"])) and np.abs(reference["y"]).max() < 100
    ranking = rank_sensitive_nodes(overflow_path, feeds, reference)
    assert set(ranking[:3]) == {"blowup", "rectify", "norm"} and ranking[3] == "project"


@pytest.mark.gpu
def test_the_ranking_runs_on_the_gpu_with_fp32_math(overflow_path: Path) -> None:
    _, feeds, reference = inputs(overflow_path)
    model = onnx.load(str(overflow_path))
    assert ranking_session(model, (["y"], feeds)).get_providers()[0] == "CUDAExecutionProvider"
    ranking = rank_sensitive_nodes(overflow_path, feeds, reference)
    assert set(ranking[:3]) == {"blowup", "rectify", "norm"} and ranking[3] == "project"


def test_plain_fp16_overflows_and_keeping_the_ranked_nodes_fixes_it(overflow_path: Path, tmp_path: Path) -> None:
    info, feeds, reference = inputs(overflow_path)
    ranking = rank_sensitive_nodes(overflow_path, feeds, reference)
    criterion = parse_criterion("cosine>=0.999")
    plain = transform(overflow_path, info.sha256, PrecisionSetting("fp16"), ranking, [], "", tmp_path)
    assert not criterion.evaluate({"y": run(plain, feeds)}, reference).feasible
    kept = transform(overflow_path, info.sha256, PrecisionSetting("fp16", keep_nodes=4), ranking, [], "", tmp_path)
    assert criterion.evaluate({"y": run(kept, feeds)}, reference).feasible
    weights = {i.name: i.data_type for i in onnx.load(str(kept)).graph.initializer}
    assert weights["big"] == TensorProto.FLOAT  # the overflowing product reads fp32 weights
    plain_weights = {i.name: i.data_type for i in onnx.load(str(plain)).graph.initializer}
    assert plain_weights["big"] == TensorProto.FLOAT16


@pytest.mark.slow
def test_the_search_finds_the_sensitive_nodes_by_itself(overflow_path: Path, tmp_path: Path) -> None:
    """Nothing names the overflowing nodes: the study ranks them and the sampler finds the count."""
    feeds = tmp_path / "feeds.npz"
    np.savez(feeds, x=inputs(overflow_path)[1]["x"])
    config = tmp_path / "tune.toml"
    config.write_text(
        '[measure]\nbudget_s = 0.05\n[space]\nprecision = ["fp16"]\nprovider = "CPUExecutionProvider"\n'
        'graph_optimization_level = "default"\nexecution_mode = "default"\nintra_op_num_threads = "default"\n'
        'mem_pattern = "default"\nintra_op_spinning = "default"\ncpu_mem_arena = "default"\n'
        'denormal_as_zero = "default"\n'
    )
    argv = ["tune", str(overflow_path), "--inputs", str(feeds), "--config", str(config), "--quiet"]
    assert main([*argv, "--accuracy", "cosine>=0.999", "--n-trials", "16", "--sampler", "random", "--seed", "0"]) == 0
    study = optuna.load_study(study_name="overflow-onnxruntime", storage="sqlite:///studies/overflow-onnxruntime.db")
    trials = study.get_trials()
    assert trials[0].params["precision"] == "fp32"  # the baseline: the engine's defaults
    trials = trials[1:]
    plain = [t for t in trials if t.params["keep_fp32_nodes"] == 0 and not t.params["keep_fp32.normalization"]]
    kept = [t for t in trials if t.params["keep_fp32_nodes"] >= 4]
    assert plain and all(t.state is TrialState.PRUNED for t in plain)
    assert plain[0].user_attrs["infeasible"] == "output 'y' contains NaN"
    assert kept and all(t.state is TrialState.COMPLETE for t in kept)
    models = list(Path("studies/overflow-onnxruntime/models").glob("*.onnx"))
    assert models
    for path in models:  # every cached transform is a valid model that runs
        onnx.checker.check_model(str(path))
        dtype = m.load_model_info(path).inputs[0].dtype
        assert np.isfinite(run(path, {"x": np.load(feeds)["x"].astype(dtype)})).all() or path.name.startswith("fp16")


def test_a_repeated_candidate_names_the_transformed_model_it_ran(
    overflow_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The search has one candidate besides the baseline (fp32, the engine's default), so it ends
    after it, the space covered; that candidate queued again repeats it and copies its result, the
    model it ran included, so that exporting the repeat writes the fp16 graph, not the fp32
    original. The one trial that ranks the nodes by fp16 sensitivity says so before it holds the
    search up. The model and the ranking damaged afterwards: export refuses the model, confirm makes
    both again."""
    fixed = ["graph_optimization_level", "mem_pattern", "execution_mode", "intra_op_num_threads"]
    fixed += ["intra_op_spinning", "cpu_mem_arena", "denormal_as_zero", '"keep_fp32.normalization"']
    config = tmp_path / "tune.toml"
    config.write_text(
        '[measure]\nbudget_s = 0.05\n[space]\nprecision = "fp16"\nkeep_fp32_nodes = 4\n'
        'provider = "CPUExecutionProvider"\n' + "".join(f'{k} = "default"\n' for k in fixed)
    )
    argv = ["tune", str(overflow_path), "--config", str(config), "--quiet", "--n-trials", "4", "--confirm-top", "0"]
    assert main([*argv, "--accuracy", "cosine>=0.999"]) == 0
    err = capsys.readouterr().err.splitlines()
    ranking = "ranking the graph's nodes by fp16 sensitivity first"
    assert [line.split(":")[0] for line in err if ranking in line] == ["trial 1"]
    counted = [line for line in err if "fp16 sensitivity:" in line]  # a counter while it ranks, and its time
    assert counted[0].startswith("trial 1: fp16 sensitivity: 0/") and len(counted) >= 2
    assert re.fullmatch(r"trial 1: fp16 sensitivity: (\d+)/\1 nodes ranked, [\d.]+ s", counted[-1])
    study = optuna.load_study(study_name="overflow-onnxruntime", storage="sqlite:///studies/overflow-onnxruntime.db")
    assert len(study.trials) == 2  # the baseline and the one candidate: the space is covered
    study.enqueue_trial(study.trials[1].params)
    assert main([*argv[:-4], "--n-trials", "3", "--confirm-top", "0", "--accuracy", "cosine>=0.999"]) == 0
    trials = study.trials
    assert [t.user_attrs.get("reused_from") for t in trials] == [None, None, 1]
    ran = trials[1].user_attrs["transformed_model"]
    assert ran.startswith("fp16-") and all(t.user_attrs["transformed_model"] == ran for t in trials[1:])
    assert main(["export", "--trial", "2", "-o", str(tmp_path / "out.onnx")]) == 0
    made = Path("studies/overflow-onnxruntime/models") / ran
    good = made.read_bytes()
    assert (tmp_path / "out.onnx").read_bytes() == good
    # damaged behind the tuner's back: export refuses the model, confirm makes it and the ranking again
    made.write_bytes(good[: len(good) // 2])
    (sensitivity,) = Path("studies/overflow-onnxruntime").glob("sensitivity-*.json")
    sensitivity.write_bytes(b"\xff\xfe not a ranking")
    capsys.readouterr()
    assert main(["export", "--trial", "1", "-o", str(tmp_path / "damaged.onnx")]) == EXIT_USER_ERROR
    assert "the model trial 1 ran is damaged" in capsys.readouterr().err
    assert not list(tmp_path.glob("damaged.onnx*"))
    assert main(["confirm", "--top", "1", "--processes", "1"]) == 0
    assert made.read_bytes() == good and json.loads(sensitivity.read_text())["nodes"]
    assert main(["export", "--trial", "1", "-o", str(tmp_path / "again.onnx")]) == 0


def test_transforms_are_cached_by_content_key(tmp_path: Path) -> None:
    path = save(small_cnn(), tmp_path / "cnn.onnx")
    info = m.load_model_info(path)
    first = transform(path, info.sha256, PrecisionSetting("fp16"), [], [], "", tmp_path / "cache")
    stamp = first.stat().st_mtime_ns
    again = transform(path, info.sha256, PrecisionSetting("fp16"), [], [], "", tmp_path / "cache")
    assert again == first and again.stat().st_mtime_ns == stamp
    other = transform(path, info.sha256, PrecisionSetting("fp16", keep_io=False), [], [], "", tmp_path / "cache")
    assert other != first
    assert m.load_model_info(other).inputs[0].dtype == np.float16
    assert m.load_model_info(first).inputs[0].dtype == np.float32


def test_int8_places_symmetric_qdq_with_per_channel_weights(tmp_path: Path) -> None:
    path = save(small_cnn(), tmp_path / "cnn.onnx")
    info = m.load_model_info(path)
    shapes = m.resolve_shapes(info, {})
    samples = [mf.synthetic_feeds(info, shapes, seed=i) for i in range(4)]
    out = transform(path, info.sha256, PrecisionSetting("int8", quantize=("conv",)), [], samples, "c", tmp_path)
    model = onnx.load(str(out))
    onnx.checker.check_model(model)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    producers = {o: n for n in model.graph.node for o in n.output}
    for conv in convs:
        data, weight = (producers[name] for name in conv.input[:2])
        assert data.op_type == weight.op_type == "DequantizeLinear"
        assert inits[weight.input[1]].shape == (inits[weight.input[0]].shape[0],)  # one scale per output channel
        for dq in (data, weight):
            assert not np.any(inits[dq.input[2]]) if len(dq.input) > 2 and dq.input[2] in inits else True  # symmetric
    assert not [
        n for n in model.graph.node if n.op_type == "Gemm" and producers[n.input[0]].op_type == "DequantizeLinear"
    ]
    reference = fp32_outputs(info, [samples[0]])[0]
    assert parse_criterion("cosine>=0.99").evaluate({"logits": run(out, samples[0])}, reference).feasible


def test_precision_knobs_follow_the_model_and_the_backend() -> None:
    knobs = {k.name: k for k in precision_knobs(small_cnn(), ("fp32", "fp16", "int8"))}
    assert knobs["precision"].choices == ("fp32", "fp16", "int8")
    assert "keep_fp32.normalization" in knobs and "keep_fp32.softmax" not in knobs  # no Softmax in the CNN
    assert knobs["quantize_ops"].choices == ("conv+matmul", "conv", "matmul")
    assert knobs["keep_fp32_nodes"].condition.values == ("fp16",)
    assert precision_knobs(small_cnn(), ("fp32",)) == []
    setting = PrecisionSetting.from_candidate(
        {"precision": "fp16", "keep_fp32.normalization": True, "keep_fp32_nodes": 2, "keep_io_fp32": False}
    )
    assert setting == PrecisionSetting("fp16", ("normalization",), 2, False, ())


def test_a_failing_transform_is_a_failed_candidate_not_a_crash(tmp_path: Path) -> None:
    path = save(small_cnn(), tmp_path / "cnn.onnx")
    info = m.load_model_info(path)
    feeds = mf.synthetic_feeds(info, m.resolve_shapes(info, {}))
    mf.save_npz(tmp_path / "inputs.npz", mf.stack([feeds]))  # the study's layout: a sample axis
    mf.save_npz(tmp_path / "reference.npz", mf.stack([fp32_outputs(info, [feeds])[0]]))
    mf.save_npz(tmp_path / "calibration.npz", {"not_an_input": np.zeros((2, 3), np.float32)})
    job = EvaluateJob(
        backend="onnxruntime",
        model=info,
        candidate={
            "precision": "int8",
            "quantize_ops": "conv",
            "provider": "CPUExecutionProvider",
            "graph_optimization_level": "ORT_ENABLE_ALL",
            "mem_pattern": True,
        },
        workdir=tmp_path,
        shapes=m.resolve_shapes(info, {}),
        feeds_path=tmp_path / "inputs.npz",
        reference_path=tmp_path / "reference.npz",
        criterion=parse_criterion("cosine>=0.99"),
        settings=MeasureSettings(budget_s=0.05),
        calibration_path=tmp_path / "calibration.npz",
    )
    result = job()
    assert result.outcome is Outcome.TRANSFORM_ERROR
    assert result.detail.startswith("int8 transform failed")


@pytest.mark.slow
def test_real_encoder_fp16_and_int8_are_built_validated_and_ranked(minilm_path: Path, tmp_path: Path) -> None:
    config = tmp_path / "tune.toml"
    config.write_text(
        '[measure]\nbudget_s = 0.2\n[space]\nprecision = ["fp16", "int8"]\nkeep_fp32_nodes = [0]\n'
        'quantize_ops = "matmul"\nprovider = "CPUExecutionProvider"\ngraph_optimization_level = "default"\n'
        'mem_pattern = "default"\nexecution_mode = "default"\nintra_op_num_threads = "default"\n'
        'intra_op_spinning = "default"\ncpu_mem_arena = "default"\ndenormal_as_zero = "default"\n'
        'graph_fusion = "default"\n'
        + "".join(f'"keep_fp32.{g}" = "default"\n' for g in ("normalization", "softmax", "exp_pow"))
    )
    shapes = ["--shape", "input_ids:1x64", "--shape", "attention_mask:1x64", "--shape", "token_type_ids:1x64"]
    base = ["tune", str(minilm_path), *shapes, "--config", str(config), "--n-trials", "6", "--quiet"]
    base += ["--sampler", "random", "--seed", "1"]
    assert main([*base, "--accuracy", "cosine>=0.9999", "--study-name", "strict"]) == 0
    assert main([*base, "--accuracy", "cosine>=0.3", "--study-name", "loose"]) == 0
    for name, int8_state in (("strict", TrialState.PRUNED), ("loose", TrialState.COMPLETE)):
        trials = optuna.load_study(study_name=name, storage=f"sqlite:///studies/{name}.db").get_trials()
        by_precision = {t.params["precision"]: t for t in trials if "reused_from" not in t.user_attrs}
        assert by_precision["fp16"].state is TrialState.COMPLETE
        assert by_precision["fp16"].user_attrs["accuracy"]["cosine"] > 0.9999
        assert by_precision["int8"].state is int8_state
        assert 0.3 < by_precision["int8"].user_attrs["accuracy"]["cosine"] < 0.9999
        assert by_precision["int8"].user_attrs["transformed_model"].startswith("int8-")


def test_bf16_keeps_the_fp16_structure_with_weights_rounded_from_fp32(tmp_path: Path) -> None:
    path = save(small_cnn(), tmp_path / "cnn.onnx")
    info = m.load_model_info(path)
    out = transform(path, info.sha256, PrecisionSetting("bf16", keep_io=False), [], [], "", tmp_path)
    model = onnx.load(str(out))
    onnx.checker.check_model(model)
    assert m.load_model_info(out).inputs[0].describe().startswith("input: ")
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.BFLOAT16
    assert not [i for i in model.graph.initializer if i.data_type == TensorProto.FLOAT16]
    assert not [n for n in model.graph.node for a in n.attribute if a.name == "to" and a.i == TensorProto.FLOAT16]
    original = {i.name: numpy_helper.to_array(i) for i in small_cnn().graph.initializer}
    for init in model.graph.initializer:
        if init.data_type == TensorProto.BFLOAT16:
            bits = np.frombuffer(init.raw_data, np.uint16).astype(np.uint32) << 16
            values = bits.view(np.float32).reshape(tuple(init.dims))
            np.testing.assert_allclose(values, original[init.name], rtol=2**-8, atol=1e-30)
