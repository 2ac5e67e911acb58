"""A space valid by construction: every transform it can offer, on graphs with the patterns other
projects' exporters write; the space checked before the search; failures the sampler learns from."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import optuna
import pytest
from conftest import SYNTHETIC, load, save, synthetic_config, tune
from optuna.trial import TrialState

from gpt_optuna.backends import BuildError, KnobLimit
from gpt_optuna.backends.tensorrt.backend import TensorRTRTXBackend
from gpt_optuna.cli import main
from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.core.space import Condition, Knob, Space
from gpt_optuna.graph import feeds as mf
from gpt_optuna.graph import model as m
from gpt_optuna.graph.model_cache import with_distinct_dims
from gpt_optuna.graph.precision import KEEP_GROUPS, KEEP_NODE_COUNTS, PrecisionSetting, precision_knobs, transform
from gpt_optuna.graph.transforms import is_transform_knob
from gpt_optuna.protocol.accuracy import parse_criterion
from gpt_optuna.protocol.jobs import CheckJob, EvaluateJob
from gpt_optuna.protocol.outcome import Outcome, TrialResult
from gpt_optuna.search.ledger import refusal_causes
from gpt_optuna.search.sampling import FreshSampler
from gpt_optuna.search.space_check import check_space
from gpt_optuna.testing.pattern_graphs import PATTERNS
from gpt_optuna.testing.small_cnn import small_cnn
from gpt_optuna.worker.reference import fp32_outputs
from gpt_optuna.worker.sensitivity import rank_sensitive_nodes

ALL = ("fp32", "fp16", "bf16", "int8", "fp8")


def prepared(name: str, tmp_path: Path) -> tuple[m.ModelInfo, m.Feeds, m.Feeds]:
    builder, flags = PATTERNS[name]
    info = with_distinct_dims(m.load_model_info(save(builder(), tmp_path / f"{name}.onnx")), tmp_path / "dims")
    feeds = mf.synthetic_feeds(info, m.resolve_shapes(info, m.parse_shapes(flags)))
    return info, feeds, fp32_outputs(info, [feeds])[0]


def settings(model: onnx.ModelProto, ranking: list[str]) -> list[PrecisionSetting]:
    """Every precision setting the space can offer for this model: each keep-set of fp16 and bf16,
    each quantized op set of int8 and fp8."""
    knobs = {k.name: k for k in precision_knobs(model, ALL)}
    groups = [name.removeprefix("keep_fp32.") for name in knobs if name.startswith("keep_fp32.")]
    subsets = [c for n in range(len(groups) + 1) for c in itertools.combinations(groups, n)]
    found = [
        PrecisionSetting(precision, tuple(sorted(subset)), nodes, io)
        for precision in ("fp16", "bf16")
        for subset in subsets
        for nodes in knobs["keep_fp32_nodes"].choices
        for io in (True, False)
        if nodes <= len(ranking)
    ]
    quantize = knobs["quantize_ops"].choices if "quantize_ops" in knobs else ()
    return found + [PrecisionSetting(p, quantize=tuple(q.split("+"))) for p in ("int8", "fp8") for q in quantize]


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_every_transform_the_space_can_offer_passes_the_checker_and_loads(name: str, tmp_path: Path) -> None:
    """fp16 and int8 graphs load and run in ONNX Runtime on the CPU; bf16 and fp8 ones (TensorRT's)
    are parsed by TensorRT-RTX; all pass the full ONNX checker (transform() runs it)."""
    info, feeds, reference = prepared(name, tmp_path)
    ranking = rank_sensitive_nodes(info.path, feeds, reference)
    samples = [feeds]
    rtx = TensorRTRTXBackend()
    fused_ops = name == "fused_contrib"  # TensorRT cannot read ONNX Runtime's contrib operators
    made = 0
    for setting in settings(onnx.load(str(info.path)), ranking):
        out = transform(info.path, info.sha256, setting, ranking, samples, "c", tmp_path / "models")
        made += 1
        if setting.precision in ("fp16", "int8"):
            session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
            inputs = {
                i.name: feeds[i.name].astype(np.float16 if "16" in i.type else feeds[i.name].dtype)
                for i in session.get_inputs()
            }
            assert all(np.isfinite(o.astype(np.float64)).all() for o in session.run(None, inputs)), setting
        elif not fused_ops:
            rtx._parse(
                m.load_model_info(out), EnginePaths.under(tmp_path), {}
            )  # a strongly typed network, as builds make
    assert made >= 8
    assert not list((tmp_path / "models").glob("*.tmp*"))


def test_fp16_keeps_readers_of_out_of_range_weights_in_fp32(tmp_path: Path) -> None:
    """The Paddle graph's batch-norm variance (1e5) is beyond fp16: clipping it to 65504 would change
    the output, so the batch norm stays fp32 and the fp16 graph still agrees with fp32."""
    info, feeds, reference = prepared("paddle_cnn", tmp_path)
    out = transform(info.path, info.sha256, PrecisionSetting("fp16"), [], [], "", tmp_path / "models")
    graph = onnx.load(str(out)).graph
    variance = next(n for n in graph.node if n.op_type == "Constant" and n.output[0] == "var")
    assert variance.attribute[0].t.data_type == onnx.TensorProto.FLOAT
    conv = next(i for i in graph.node if i.op_type == "Constant" and i.output[0] == "w1")
    assert conv.attribute[0].t.data_type == onnx.TensorProto.FLOAT16  # the rest is fp16
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, reference["probs"], atol=2e-3)


def test_opset_11_graphs_are_raised_for_per_channel_int8(tmp_path: Path) -> None:
    info, feeds, _ = prepared("paddle_cnn", tmp_path)
    out = transform(info.path, info.sha256, PrecisionSetting("int8", quantize=("conv",)), [], [feeds], "c", tmp_path)
    model = onnx.load(str(out))
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 13
    dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and any(a.name == "axis" for a in n.attribute)]
    assert dq  # per-channel weights


def test_the_space_check_drops_what_cannot_be_made_or_loaded_and_says_why(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The engine crashes on fp16 graphs and refuses int8 ones: both are dropped before the search,
    each with one line; mem_pattern is offered only where the engine said it works."""
    config = tmp_path / "tune.toml"
    config.write_text('[measure]\nbudget_s = 0.05\n[space]\nintra_op_num_threads = "default"\n')
    argv = ["tune", str(cnn_path), "--backend", "picky_backend:PickyBackend", "--config", str(config)]
    assert main([*argv, "--n-trials", "6", "--quiet", "--confirm-top", "0"]) == 0
    err = capsys.readouterr().err
    assert "precision fp16 not searched: worker killed by SIGSEGV" in err
    assert "precision int8 not searched: no int8 kernels here" in err
    assert "mem_pattern offered only with graph_optimization_level: any at ORT_ENABLE_ALL; elsewhere picky" in err
    study = optuna.load_study(study_name="cnn-pickybackend", storage="sqlite:///studies/cnn-pickybackend.db")
    space = {k["name"]: k for k in study.user_attrs["gpt_optuna"]["space"]}
    assert space["precision"]["choices"] == ["fp32"] and "keep_fp32_nodes" not in space
    assert space["mem_pattern"]["when"] == {"graph_optimization_level": ["ORT_ENABLE_ALL"]}
    for trial in study.get_trials():
        assert ("mem_pattern" in trial.params) is (trial.params["graph_optimization_level"] == "ORT_ENABLE_ALL")
        assert trial.state is TrialState.COMPLETE


def test_failures_are_pruned_with_their_traceback_and_grouped_by_cause(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = synthetic_config(tmp_path, 'mode = ["ok", "build_error"]\ndelay_us = [0]\nbuild_ms = [0]')
    assert tune(str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--n-trials", "12", "--seed", "2") == 0
    failed = [t for t in load("cnn-syntheticbackend").get_trials() if t.params["mode"] == "build_error"]
    assert failed and all(t.state is TrialState.PRUNED and t.constraints["failure"] > 0 for t in failed)
    assert all("Traceback" in t.user_attrs["log"] and "synthetic builder log" in t.user_attrs["log"] for t in failed)
    worker_log = Path("studies/cnn-syntheticbackend/worker.log").read_text()
    assert "Traceback" in worker_log and "synthetic build error" in worker_log
    capsys.readouterr()
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert f"{len(failed)} failed" in out
    assert f"failures by cause:\n  {len(failed)} x build_error: synthetic build error" in out


def test_no_candidate_is_proposed_twice_until_the_space_is_covered(cnn_path: Path, tmp_path: Path) -> None:
    """A space of 48 candidates: TPE repeats itself in spaces this small, FreshSampler does not."""
    config = synthetic_config(tmp_path, 'mode = ["ok"]\ndelay_us = [0, 50]\nbuild_ms = [0]\nb = [0]')
    assert tune(str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--n-trials", "24", "--seed", "0") == 0
    params = [json.dumps(t.params, sort_keys=True) for t in load("cnn-syntheticbackend").get_trials()]
    assert len(params) == 24 and len(set(params)) == 24


def test_a_failed_transform_rules_out_every_candidate_that_shares_it() -> None:
    space = Space(
        [
            Knob("precision", ("fp32", "fp16", "int8"), "fp32"),
            Knob("keep_io_fp32", (True, False), True),
            Knob("threads", tuple(range(6)), 0),
        ]
    )
    sampler = FreshSampler(optuna.samplers.TPESampler(seed=0, n_startup_trials=2), space, is_transform_knob, 0)
    study = optuna.create_study(sampler=sampler)
    dists = {k.name: optuna.distributions.CategoricalDistribution(k.choices) for k in space.knobs}
    failed = {"precision": "int8", "keep_io_fp32": True, "threads": 0}
    study.add_trial(
        optuna.trial.create_trial(
            state=TrialState.PRUNED,
            params=failed,
            distributions=dists,
            user_attrs={"outcome": "transform_error", "failure": "int8 transform failed"},
        )
    )
    study.optimize(lambda t: float(space.suggest(t)["threads"]), n_trials=30)
    proposed = [t.params for t in study.get_trials()[1:]]
    assert not [p for p in proposed if p["precision"] == "int8" and p["keep_io_fp32"]]
    assert len({json.dumps(p, sort_keys=True) for p in proposed}) == 30


CUDNN_REFUSED = (
    "the engine cannot run it: Non-zero status code returned while running Conv node. Name:'/conv1/Conv' "
    "Status Message: Failed to initialize CUDNN Frontend"
)
"""How ONNX Runtime 1.31 refused ResNet-50 in fp16, NCHW, with the cuDNN conv-bias fusion, on an H200."""


def test_the_cause_of_refusals_is_what_those_with_one_error_share_and_no_candidate_that_ran_has() -> None:
    def key(**settings: object) -> frozenset[tuple[str, object]]:
        return frozenset(settings.items())

    refused = [key(precision="fp16", nhwc=False, fuse=True, level=level) for level in ("basic", "all")]
    ran = [key(precision="fp16", nhwc=True, fuse=True, level="basic")]
    assert refusal_causes({CUDNN_REFUSED: refused}, ran) == [key(precision="fp16", nhwc=False, fuse=True)]
    assert refusal_causes({CUDNN_REFUSED: refused[:1]}, ran) == []  # one refusal: only that candidate
    assert refusal_causes({CUDNN_REFUSED: refused}, [*ran, key(precision="fp16", nhwc=False, fuse=True)]) == []
    assert refusal_causes({"one error": refused[:1], "another": refused[1:]}, ran) == []  # not one cause
    unrelated = [key(precision="fp16", nhwc=False), key(precision="int8", nhwc=True)]
    assert refusal_causes({CUDNN_REFUSED: unrelated}, ran) == []  # nothing shared


def test_settings_refused_twice_with_one_error_are_not_proposed_again() -> None:
    space = Space(
        [
            Knob("precision", ("fp32", "fp16", "int8"), "fp32"),
            Knob("nhwc", (False, True), False),
            Knob("fuse", (False, True), False),
            Knob("threads", tuple(range(4)), 0),
        ]
    )
    sampler = FreshSampler(optuna.samplers.TPESampler(seed=0, n_startup_trials=2), space, is_transform_knob, 0)
    study = optuna.create_study(sampler=sampler)
    dists = {k.name: optuna.distributions.CategoricalDistribution(k.choices) for k in space.knobs}
    for threads, outcome, nhwc in ((0, "build_error", False), (3, "build_error", False), (1, "ok", True)):
        study.add_trial(
            optuna.trial.create_trial(
                state=TrialState.PRUNED if outcome == "build_error" else TrialState.COMPLETE,
                params={"precision": "fp16", "nhwc": nhwc, "fuse": True, "threads": threads},
                distributions=dists,
                user_attrs={"outcome": outcome, "failure": CUDNN_REFUSED if outcome == "build_error" else ""},
                value=None if outcome == "build_error" else 1.0,
            )
        )
    study.optimize(lambda t: float(space.suggest(t)["threads"]), n_trials=40)
    proposed = [t.params for t in study.get_trials()[3:]]
    assert not [p for p in proposed if p["precision"] == "fp16" and not p["nhwc"] and p["fuse"]]
    assert [p for p in proposed if p["precision"] == "fp16" and not p["nhwc"]]  # the rest of fp16 NCHW stays
    assert [p for p in proposed if not p["nhwc"] and p["fuse"]]  # and NCHW with the fusion elsewhere
    assert len({json.dumps(p, sort_keys=True) for p in proposed}) == 40


def test_keep_groups_name_real_operators() -> None:
    knobs = precision_knobs(small_cnn(), ALL)
    assert all(k.name.removeprefix("keep_fp32.") in KEEP_GROUPS for k in knobs if k.name.startswith("keep_fp32."))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["torch_encoder_block", "resize_head", "paddle_cnn"])
def test_cuda_graphs_are_offered_exactly_where_a_session_captures_one(name: str, tmp_path: Path) -> None:
    """The check's verdict per graph level and layout against what ONNX Runtime does: a refused
    setting fails to create a capturing session; an offered one captures, replays and gives the
    fp32 outputs."""
    from gpt_optuna.backends.onnxruntime.backend import OnnxRuntimeBackend
    from gpt_optuna.backends.onnxruntime.settings import CUDA, CUDA_GRAPH, GRAPH_LEVEL, NHWC

    info, feeds, reference = prepared(name, tmp_path)
    shapes = m.resolve_shapes(info, m.parse_shapes(PATTERNS[name][1]))
    backend = OnnxRuntimeBackend()
    space = backend.space(info, shapes)
    base = space.default()
    assert base["provider"] == CUDA
    limits = backend.check_model(info, space, base, EnginePaths.under(tmp_path), shapes)
    limit = next((x for x in limits if x.knob == CUDA_GRAPH), None)
    settings = list(itertools.product(space.choices(GRAPH_LEVEL), space.choices(NHWC)))
    offered = settings if limit is None else list(limit.allowed.combos() if limit.allowed else ())
    print(name, "CUDA graphs refused at", [s for s in settings if s not in offered])
    for level, nhwc in settings:
        candidate = {**base, GRAPH_LEVEL: level, NHWC: nhwc, CUDA_GRAPH: True}
        if (level, nhwc) not in offered:
            with pytest.raises(BuildError):
                backend.build(info, candidate, EnginePaths.under(tmp_path), shapes)
            continue
        with backend.open(
            backend.build(info, candidate, EnginePaths.under(tmp_path), shapes), feeds, reference
        ) as runner:
            for _ in range(3):  # the first run captures, the next ones replay
                outputs = runner.infer()
            for key, value in reference.items():
                np.testing.assert_allclose(outputs[key], value, rtol=1e-2, atol=1e-3)


def test_a_knob_is_limited_to_the_settings_where_it_works() -> None:
    from gpt_optuna.backends.onnxruntime.knobs import where_it_works

    knobs = {k.name: k for k in (Knob("level", ("basic", "all"), "all"), Knob("nhwc", (False, True), False))}
    refused = {("basic", False): "no plan", ("all", False): "no plan"}
    limit = where_it_works("fuse", ("level", "nhwc"), knobs, lambda s: refused.get((s["level"], s["nhwc"])))
    assert limit is not None and limit.allowed is not None
    assert limit.allowed.combos() == (("basic", True), ("all", True))
    assert limit.reason == "level=basic, nhwc=False; level=all, nhwc=False: no plan"
    assert where_it_works("fuse", ("level", "nhwc"), knobs, lambda s: None) is None
    nowhere = where_it_works("fuse", ("nhwc",), knobs, lambda s: "no plan")
    assert nowhere is not None and nowhere.allowed is None and nowhere.reason == "with any nhwc: no plan"
    alone = where_it_works("fuse", (), knobs, lambda s: "no plan")
    assert alone is not None and alone.allowed is None and alone.reason == "no plan"


def fp16_convolution(tmp_path: Path) -> Path:
    """ResNet's stem in fp16 (8x3x224x224, 7x7 stride 2, bias, ReLU): in NCHW, cuDNN's frontend
    finds no plan for it with the conv-bias fusion on an H200."""
    rng = np.random.default_rng(0)
    weights = [
        onnx.numpy_helper.from_array((rng.standard_normal((64, 3, 7, 7)) * 0.1).astype(np.float16), "w"),
        onnx.numpy_helper.from_array(rng.standard_normal(64).astype(np.float16), "b"),
    ]
    nodes = [
        onnx.helper.make_node("Conv", ["x", "w", "b"], ["y"], kernel_shape=[7, 7], strides=[2, 2], pads=[3] * 4),
        onnx.helper.make_node("Relu", ["y"], ["z"]),
    ]
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT16, [8, 3, 224, 224])
    z = onnx.helper.make_tensor_value_info("z", onnx.TensorProto.FLOAT16, [8, 64, 112, 112])
    model = onnx.helper.make_model(
        onnx.helper.make_graph(nodes, "stem", [x], [z], weights), opset_imports=[onnx.helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    return save(model, tmp_path / "stem.onnx")


@pytest.mark.gpu
def test_conv_bias_fusion_is_offered_exactly_where_a_session_runs_it(tmp_path: Path) -> None:
    """The check's verdict per layout against what ONNX Runtime does: a refused layout fails at
    the first inference; an offered one runs and gives the unfused outputs."""
    from gpt_optuna.backends.onnxruntime.backend import OnnxRuntimeBackend
    from gpt_optuna.backends.onnxruntime.settings import CUDA, FUSE_CONV_BIAS, NHWC

    info = m.load_model_info(fp16_convolution(tmp_path))
    shapes = m.resolve_shapes(info, {})
    feeds = mf.synthetic_feeds(info, shapes)
    backend = OnnxRuntimeBackend()
    space = backend.space(info, shapes)
    base = space.default()
    assert base["provider"] == CUDA and FUSE_CONV_BIAS in {k.name for k in space.knobs}
    limits = backend.check_model(info, space, base, EnginePaths.under(tmp_path), shapes)
    limit = next((x for x in limits if x.knob == FUSE_CONV_BIAS), None)
    layouts = space.choices(NHWC)
    offered = [n for n in layouts if limit is None or (limit.allowed is not None and limit.allowed.holds({NHWC: n}))]
    print("conv-bias fusion refused at", [n for n in layouts if n not in offered], limit)
    for nhwc in layouts:
        session, _ = backend.build(info, {**base, NHWC: nhwc}, EnginePaths.under(tmp_path), shapes).engine
        (expected,) = session.run(None, feeds)
        fused, _ = backend.build(
            info, {**base, NHWC: nhwc, FUSE_CONV_BIAS: True}, EnginePaths.under(tmp_path), shapes
        ).engine
        if nhwc not in offered:
            with pytest.raises(Exception, match="Non-zero status code returned while running"):
                fused.run(None, feeds)
            continue
        (outputs,) = fused.run(None, feeds)
        np.testing.assert_allclose(outputs.astype(np.float32), expected.astype(np.float32), rtol=2e-2, atol=2e-2)


OCR = "rapidocr-onnxruntime==1.4.4"
REAL_MODELS = {
    "ppocr_det": (OCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", ["x:1x3x64x96"]),
    "ppocr_rec": (OCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", ["x:1x3x48x96"]),
    "ppocr_cls": (OCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", ["x:2x3x48x96"]),
    "magika": ("magika==1.0.3", "magika/models/standard_v3_3/model.onnx", ["bytes:2x2048"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(REAL_MODELS))
def test_transforms_of_models_other_projects_exported_pass_the_checker_and_load(name: str, tmp_path: Path) -> None:
    """PaddleOCR (opset 11/12, weights in Constant nodes, a batch norm beyond fp16's range, Resize)
    and magika (tf2onnx, Cast to float): each fp16 keep-group set with no and with the most kept
    nodes, both I/O types, and each int8 op set, pass the full checker and run on ONNX Runtime."""
    from conftest import registry_model

    package, member, flags = REAL_MODELS[name]
    info = with_distinct_dims(m.load_model_info(registry_model(package, member)), tmp_path / "dims")
    feeds = mf.synthetic_feeds(info, m.resolve_shapes(info, m.parse_shapes(flags)))
    reference = fp32_outputs(info, [feeds])[0]
    ranking = rank_sensitive_nodes(info.path, feeds, reference, limit=8)
    graph = onnx.load(str(info.path))
    most = max(c for c in KEEP_NODE_COUNTS if c <= len(ranking))
    for setting in settings(graph, ranking):
        if setting.precision in ("bf16", "fp8") or setting.keep_nodes not in (0, most):
            continue
        out = transform(info.path, info.sha256, setting, ranking, [feeds], "c", tmp_path / "models")
        session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        inputs = {
            i.name: feeds[i.name].astype(np.float16 if "16" in i.type else feeds[i.name].dtype)
            for i in session.get_inputs()
        }
        outputs = session.run(None, inputs)
        assert all(np.isfinite(o.astype(np.float64)).all() for o in outputs), setting
        if setting == PrecisionSetting("fp16"):  # agrees with fp32: PP-OCRv4 det's overflowing batch norm stays fp32
            criterion = parse_criterion("max_abs<=0.02")  # outputs are probabilities; on noise, mostly 0
            assert criterion.evaluate(dict(zip(reference, outputs, strict=True)), reference).feasible


def test_fp16_types_follow_the_operator_schemas(tmp_path: Path) -> None:
    """Resize's scales stay fp32 (constant or computed from shapes), ConstantOfShape values take
    fp16 with their node (one had no value at all), a Cast to float of integer ids becomes a cast
    to fp16, and a weight read by a kept node and by a converted one is stored in both types."""
    resize, _, _ = prepared("resize_head", tmp_path)
    graph = onnx.load(str(transform(resize.path, resize.sha256, PrecisionSetting("fp16"), [], [], "", tmp_path))).graph
    weights = {i.name: i.data_type for i in graph.initializer}
    assert weights["scales"] == onnx.TensorProto.FLOAT and weights["w"] == onnx.TensorProto.FLOAT16
    ratio = next(n for n in graph.node if n.output[0] == "ratio")
    assert ratio.op_type == "Div"  # shape arithmetic: computed in fp32, no Cast in front of it
    tf, _, _ = prepared("tf_nhwc_pad_concat", tmp_path)
    graph = onnx.load(str(transform(tf.path, tf.sha256, PrecisionSetting("fp16"), [], [], "", tmp_path))).graph
    blocks = [n for n in graph.node if n.op_type == "ConstantOfShape"]
    assert len(blocks) == 2 and all(n.attribute[0].t.data_type == onnx.TensorProto.FLOAT16 for n in blocks)
    encoder, _, _ = prepared("torch_encoder_block", tmp_path)
    kept = PrecisionSetting("fp16", keep_nodes=1)
    out = transform(encoder.path, encoder.sha256, kept, ["MatMul_16"], [], "", tmp_path)
    graph = onnx.load(str(out)).graph
    cast = next(n for n in graph.node if n.output[0] == "ids_f")
    assert cast.attribute[0].i == onnx.TensorProto.FLOAT16
    shared = {i.name: i.data_type for i in graph.initializer if i.name.startswith("shared")}
    assert sorted(shared.values()) == [onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16]


class _LoadsEverything:
    """Stands in for the worker in the check's schedule: every graph loads, and what is checked
    is counted (the loading itself is tested above, for real)."""

    def __init__(self) -> None:
        self.checked: list[tuple[str, str]] = []

    def run(self, job: CheckJob, timeout: float | None, on_progress: object = None) -> TrialResult:
        self.checked.append((job.job.candidate["graph_fusion"], job.job.candidate["precision"]))
        return TrialResult(Outcome.OK, limits=())


class _LoadsWithLimits(_LoadsEverything):
    """Every graph loads; the unfused graphs run no attention operator, and the int8 graph
    captures CUDA graphs only at the basic level."""

    def run(self, job: CheckJob, timeout: float | None, on_progress: object = None) -> TrialResult:
        super().run(job, timeout, on_progress)
        fusion, precision = self.checked[-1]
        limits = []
        if fusion == "none":
            limits.append(KnobLimit("sdpa", None, "no Attention operator runs in this graph", by_operators=True))
        if precision == "int8":
            limits.append(KnobLimit("cuda_graph", Condition("level", ("basic",)), "level=all: nodes on the CPU"))
        return TrialResult(Outcome.OK, limits=tuple(limits))


def test_a_pair_not_checked_is_offered_a_limited_knob_where_its_checked_graphs_allow_it(cnn_path: Path) -> None:
    """A fused graph at a precision left unchecked (the check was cut) gets the settings that both
    the fused graph and its precision's checked graph allow; a limit by operator types follows
    the fused graph alone (converting the precision keeps the operators)."""
    space = Space(
        [
            Knob("graph_fusion", ("none", "transformer"), "none"),
            Knob("precision", ("fp32", "fp16", "int8"), "fp32"),
            Knob("level", ("basic", "all"), "all"),
            Knob("cuda_graph", (False, True), False),
            Knob("sdpa", (0, 1), 0),
        ]
    )
    info = m.load_model_info(cnn_path)
    template = EvaluateJob(
        "onnxruntime",
        info,
        {},
        cnn_path.parent,
        {},
        cnn_path,
        cnn_path,
        parse_criterion("cosine>=0.99"),
        MeasureSettings(),
    )
    worker, notes = _LoadsWithLimits(), []
    always = {("none", "fp16"), ("none", "int8"), ("transformer", "fp32")}
    late = time.monotonic() - 1
    checked, complete = check_space(space, template, worker, 60.0, notes.append, deadline=late, always=always)  # type: ignore[arg-type]
    assert (
        not complete and ("transformer", "fp16") not in worker.checked and ("transformer", "int8") not in worker.checked
    )
    knobs = {k.name: k for k in checked.knobs}

    def offered(knob: str, fusion: str, precision: str, level: str) -> bool:
        return knobs[knob].active({"graph_fusion": fusion, "precision": precision, "level": level})

    assert offered("cuda_graph", "transformer", "fp16", "all") and offered("cuda_graph", "transformer", "int8", "basic")
    assert not offered("cuda_graph", "transformer", "int8", "all") and not offered("cuda_graph", "none", "int8", "all")
    assert offered("sdpa", "transformer", "fp16", "all") and offered("sdpa", "transformer", "int8", "basic")
    assert not offered("sdpa", "none", "fp16", "all")
    judged = "transformer/fp16, transformer/int8 not checked: judged by the checked graphs"
    assert sum(judged in n for n in notes) == 2, notes


def test_a_space_check_cut_short_keeps_some_of_each_knob_and_offers_only_what_it_checked(cnn_path: Path) -> None:
    """Past its deadline only the default is still checked; before it, the checks go diagonally,
    the unfused graph at other precisions before fused ones at a tie, so a cut keeps some of each."""
    space = Space(
        [
            Knob("graph_fusion", ("none", "transformer", "onnxscript"), "none"),
            Knob("precision", ("fp32", "fp16", "int8"), "fp32"),
        ]
    )
    info = m.load_model_info(cnn_path)
    criterion = parse_criterion("cosine>=0.99")
    template = EvaluateJob(
        "onnxruntime", info, {}, cnn_path.parent, {}, cnn_path, cnn_path, criterion, MeasureSettings()
    )
    worker = _LoadsEverything()
    notes: list[str] = []
    late = time.monotonic() - 1
    checked, complete = check_space(space, template, worker, 60.0, notes.append, deadline=late)  # type: ignore[arg-type]
    assert worker.checked == [("none", "fp32")] and not complete
    assert checked.choices("graph_fusion") == ("none",) and checked.choices("precision") == ("fp32",)
    assert len(notes) == 4 and all("not checked within preparation's share of --timeout" in n for n in notes)
    worker = _LoadsEverything()  # what a configuration the search must run needs is checked whatever the time
    always = {("onnxscript", "fp16")}
    checked, _ = check_space(space, template, worker, 60.0, [].append, deadline=late, always=always)  # type: ignore[arg-type]
    assert worker.checked == [("none", "fp32"), ("onnxscript", "fp32"), ("onnxscript", "fp16")]
    assert checked.choices("graph_fusion") == ("none", "onnxscript") and checked.choices("precision") == (
        "fp32",
        "fp16",
    )
    worker = _LoadsEverything()
    checked, complete = check_space(space, template, worker, 60.0, [].append)  # type: ignore[arg-type]
    assert complete and len(worker.checked) == 9 and checked.choices("precision") == ("fp32", "fp16", "int8")
    assert worker.checked[:4] == [("none", "fp32"), ("none", "fp16"), ("transformer", "fp32"), ("none", "int8")]
