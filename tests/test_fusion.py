"""ONNX Runtime's transformer fusions as a search dimension, on a real encoder and real ONNX Runtime."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import optuna
import pytest
from onnx import TensorProto, helper, numpy_helper
from optuna.trial import TrialState

from gpt_optuna.cli import main
from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.core.space import Knob
from gpt_optuna.graph import feeds as mf
from gpt_optuna.graph import model as m
from gpt_optuna.graph.fusion import (
    FUSED_VERSION,
    FUSION_VALUES,
    FUSIONS,
    fused_ops,
    fused_path,
    fused_within,
    fusion_knobs,
    graph_ops,
)
from gpt_optuna.graph.model_cache import TransformFailed
from gpt_optuna.graph.precision import PrecisionSetting, transform
from gpt_optuna.protocol.accuracy import parse_criterion
from gpt_optuna.protocol.jobs import EvaluateJob, SpaceJob
from gpt_optuna.protocol.outcome import Outcome
from gpt_optuna.worker.reference import fp32_outputs

SHAPES = {name: m.ShapeRange((1, 32), (1, 32), (1, 32)) for name in ("input_ids", "attention_mask", "token_type_ids")}


def encoder_feeds(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = np.ones((1, 32), np.int64)
    mask[0, 24:] = 0  # padding, so that the mask path is exercised
    return {
        "input_ids": rng.integers(1000, 20000, (1, 32)),
        "attention_mask": mask,
        "token_type_ids": np.zeros((1, 32), np.int64),
    }


def knobs(info: m.ModelInfo, fusions: tuple[str, ...], cache_dir: Path) -> tuple[list[Knob], list[str]]:
    """The fusion knobs for a model, and the notes on what was left out."""
    notes: list[str] = []
    return fusion_knobs(info, fusions, cache_dir, graph_ops(onnx.load(str(info.path))), notes.append), notes


def run(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, feeds)[0], np.float64)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a.ravel() @ b.ravel() / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.slow
def test_transformer_fusion_rewrites_a_real_encoder_and_keeps_its_outputs(minilm_path: Path, tmp_path: Path) -> None:
    info = m.load_model_info(minilm_path)
    fused = fused_path(minilm_path, info.sha256, "transformer", tmp_path / "models")
    graph = onnx.load(str(fused))
    ops = Counter(node.op_type for node in graph.graph.node)
    assert ops["SkipLayerNormalization"] == 12  # 6 layers x (attention, feed-forward) residual + LayerNorm
    assert ops["BiasGelu"] == 6
    assert ops["Attention"] == 6  # the dynamo export's attention, rewritten into the fusable form
    assert len(graph.graph.node) < len(onnx.load(str(minilm_path)).graph.node)
    assert {node.domain for node in graph.graph.node if node.op_type == "BiasGelu"} == {"com.microsoft"}
    feeds = encoder_feeds()
    original = run(minilm_path, feeds)
    assert np.abs(run(fused, feeds) - original).max() < 1e-4
    mtime = fused.stat().st_mtime_ns
    assert fused_path(minilm_path, info.sha256, "transformer", tmp_path / "models") == fused
    assert fused.stat().st_mtime_ns == mtime  # made once, then read from the cache
    assert fused_path(minilm_path, info.sha256, "none", tmp_path / "models") == minilm_path
    # the fused graph is a base for the precision transforms: fp16 of its contrib ops runs and agrees
    fp16 = transform(fused, m.load_model_info(fused).sha256, PrecisionSetting("fp16"), [], [], "", tmp_path / "models")
    fp16_ops = {n.op_type for n in onnx.load(str(fp16)).graph.node}
    assert {"SkipLayerNormalization", "BiasGelu"} <= fp16_ops
    assert cosine(run(fp16, feeds), original) > 0.9999


@pytest.mark.slow
def test_fusion_is_offered_only_where_it_changes_the_model_and_the_backend_runs_it(
    minilm_path: Path, cnn_path: Path, tmp_path: Path
) -> None:
    minilm, cnn = m.load_model_info(minilm_path), m.load_model_info(cnn_path)
    assert knobs(minilm, (), tmp_path / "none") == ([], [])  # a backend that cannot run com.microsoft operators
    assert not (tmp_path / "none").exists()
    (knob,), _ = knobs(minilm, ("transformer", "transformer-mha"), tmp_path / "models")
    assert (knob.name, knob.choices, knob.default) == (
        "graph_fusion",
        ("none", "transformer", "transformer-mha"),
        "none",
    )
    # the fused model made while looking is the one candidates use: not made again
    fused = fused_path(minilm_path, minilm.sha256, "transformer", tmp_path / "models")
    mtime = fused.stat().st_mtime_ns
    assert json.loads(fused.with_suffix(".json").read_text()) == {
        "Attention": 6,
        "SkipLayerNormalization": 12,
        "BiasGelu": 6,
    }
    mha = fused_path(minilm_path, minilm.sha256, "transformer-mha", tmp_path / "models")
    assert json.loads(mha.with_suffix(".json").read_text())["MultiHeadAttention"] == 6
    # a backend without the MultiHeadAttention variant gets the knob without it
    (plain,), _ = knobs(minilm, ("transformer",), tmp_path / "models")
    assert plain.choices == ("none", "transformer")
    # nothing to fuse in a CNN: the optimizer is not even run, and the user is told
    assert knobs(cnn, ("transformer",), tmp_path / "cnn") == (
        [],
        ["graph_fusion not searched: the model has no layer norm, GELU or softmax for the transformer fusions"],
    )
    assert not (tmp_path / "cnn").exists()
    # a LayerNormalization the model already has is not something the fusion did
    norm = helper.make_graph(
        [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"])],
        "norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        [
            numpy_helper.from_array(np.ones(8, np.float32), "gamma"),
            numpy_helper.from_array(np.zeros(8, np.float32), "beta"),
        ],
    )
    onnx.save(helper.make_model(norm, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "norm.onnx")
    assert knobs(m.load_model_info(tmp_path / "norm.onnx"), ("transformer",), tmp_path / "models") == (
        [],
        ["graph_fusion transformer not searched: it fuses nothing in this model"],
    )
    space, _, _ = SpaceJob("onnxruntime", minilm, SHAPES, tmp_path / "models")()
    assert "graph_fusion" in [k.name for k in space.knobs]
    assert fused.stat().st_mtime_ns == mtime
    cnn_space, _, _ = SpaceJob("onnxruntime", cnn, {}, tmp_path / "models")()
    assert "graph_fusion" not in [k.name for k in cnn_space.knobs]


@pytest.mark.slow
def test_a_search_runs_fused_fp16_candidates_with_nodes_ranked_on_the_fused_graph(
    minilm_path: Path, tmp_path: Path
) -> None:
    config = tmp_path / "tune.toml"
    config.write_text(
        '[measure]\nbudget_s = 0.1\n[space]\ngraph_fusion = "transformer"\nprecision = "fp16"\n'
        'keep_fp32_nodes = [0, 2]\nprovider = "default"\n'
    )
    shapes = [f"--shape={name}:1x32" for name in SHAPES]
    argv = ["tune", str(minilm_path), *shapes, "--config", str(config), "--n-trials", "4", "--quiet"]
    argv += ["--study-name", "model-onnxruntime"]
    assert main([*argv, "--accuracy", "cosine>=0.9999", "--sampler", "random", "--seed", "3"]) == 0
    study = optuna.load_study(study_name="model-onnxruntime", storage="sqlite:///studies/model-onnxruntime.db")
    tuned = [t for t in study.get_trials() if t.number > 0 and "reused_from" not in t.user_attrs]
    assert tuned and all(t.state is TrialState.COMPLETE for t in tuned), [t.user_attrs for t in tuned]
    assert all(t.user_attrs["transformed_model"].startswith("fp16-") for t in tuned)
    assert all(t.user_attrs["accuracy"]["cosine"] > 0.9999 for t in tuned)
    folder = Path("studies/model-onnxruntime")
    (fused,) = folder.glob(f"models/transformer-{FUSED_VERSION}-*.onnx")
    assert "SkipLayerNormalization" in {n.op_type for n in onnx.load(str(fused)).graph.node}
    if any(t.params["keep_fp32_nodes"] for t in tuned):  # ranked on the graph the candidate converts
        assert (folder / f"sensitivity-transformer-{m.load_model_info(minilm_path).sha256[:16]}.json").is_file()


@pytest.mark.gpu
def test_fused_fp16_encoder_runs_on_the_cuda_provider_through_a_cuda_graph(minilm_path: Path, tmp_path: Path) -> None:
    info = m.load_model_info(minilm_path)
    mf.save_npz(tmp_path / "inputs.npz", mf.stack([encoder_feeds()]))  # the study's layout: a sample axis
    mf.save_npz(tmp_path / "reference.npz", mf.stack([fp32_outputs(info, [encoder_feeds()])[0]]))
    space, _, _ = SpaceJob("onnxruntime", info, SHAPES, tmp_path / "models")()
    base = space.default()
    assert base["provider"] == "CUDAExecutionProvider"
    results = {}
    for fusion in ("none", "transformer", "transformer-mha"):
        candidate = {**base, "graph_fusion": fusion, "precision": "fp16", "cuda.enable_cuda_graph": True}
        job = EvaluateJob(
            backend="onnxruntime",
            model=info,
            candidate=candidate,
            workdir=tmp_path,
            shapes=SHAPES,
            feeds_path=tmp_path / "inputs.npz",
            reference_path=tmp_path / "reference.npz",
            criterion=parse_criterion("cosine>=0.999"),
            settings=MeasureSettings(budget_s=1.0),
        )
        results[fusion] = job()
        assert results[fusion].outcome is Outcome.OK, results[fusion].detail
    fused = results["transformer"]
    assert fused.build.transformed_model.startswith("fp16-")
    print({f: (r.latency.median_ms, r.verdict.metrics["cosine"]) for f, r in results.items()})


def test_a_graph_the_optimizer_fails_on_keeps_its_failure_for_the_space_check(tmp_path: Path) -> None:
    """The knob is offered so that checking the space drops it with the reason; the failure is kept
    beside the would-be model, with its traceback, and raised again without redoing the work."""
    graph = helper.make_graph(
        [
            helper.make_node("Mystery", ["x"], ["m"], domain="example.custom"),
            helper.make_node("Softmax", ["m"], ["y"]),  # something the optimizer would look at
        ],
        "unknown_op",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("example.custom", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    path = tmp_path / "mystery.onnx"
    onnx.save(model, path)
    info = m.load_model_info(path)
    assert [k.name for k in knobs(info, ("transformer",), tmp_path / "models")[0]] == ["graph_fusion"]
    with pytest.raises(TransformFailed) as first:
        fused_path(path, info.sha256, "transformer", tmp_path / "models")
    assert "Traceback" in first.value.log and "Mystery" in str(first.value)
    kept = list((tmp_path / "models").glob("*.failed.json"))
    assert len(kept) == 1 and not list((tmp_path / "models").glob("*.tmp*"))
    stamp = kept[0].stat().st_mtime_ns
    with pytest.raises(TransformFailed) as again:
        fused_path(path, info.sha256, "transformer", tmp_path / "models")
    assert str(again.value) == str(first.value) and kept[0].stat().st_mtime_ns == stamp


BERT_EXPORT = Path(__file__).parent / "data" / "bert_dynamo_export.onnx"
"""A two-layer BERT from ``transformers`` (seeded weights, hidden 32, 4 heads), exported by torch's
dynamo exporter at batch 2 x 16 tokens, as a user exports it today."""


def bert_feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    mask = np.ones((2, 16), np.int64)
    mask[1, 11:] = 0
    return {"input_ids": rng.integers(0, 128, (2, 16)), "attention_mask": mask}


def test_each_maintained_fusion_is_a_value_where_it_fuses_the_model_otherwise(tmp_path: Path) -> None:
    """On a real exporter's graph: every value offered fuses something, none fuses it as another
    does, what is left out is said, attention is fused by one of them, and each fused model
    computes what the export computes."""
    info = m.load_model_info(BERT_EXPORT)
    fusions = FUSIONS[1:]
    (knob,), notes = knobs(info, fusions, tmp_path / "models")
    offered = knob.choices[1:]
    counts = {f: fused_ops(fused_path(BERT_EXPORT, info.sha256, f, tmp_path / "models")) for f in offered}
    assert all(counts.values())
    assert len({json.dumps(c, sort_keys=True) for c in counts.values()}) == len(offered)
    fitting = [f.name for f in FUSION_VALUES if f.fits(graph_ops(onnx.load(str(BERT_EXPORT))))]
    for fusion in set(fitting) - set(offered) - {"transformer-mha"}:  # -mha: said only where it differs
        assert any(note.startswith(f"graph_fusion {fusion} not searched: ") for note in notes), (fusion, notes)
    assert any({"Attention", "MultiHeadAttention"} & set(c) for c in counts.values()), counts
    feeds = bert_feeds()
    original = run(BERT_EXPORT, feeds)
    for fusion in offered:
        assert (
            np.abs(run(fused_path(BERT_EXPORT, info.sha256, fusion, tmp_path / "models"), feeds) - original).max()
            < 1e-4
        )


def rms_norm_model() -> onnx.ModelProto:
    """Two RMSNorm + projection blocks, as a Llama-style decoder writes them."""
    rng = np.random.default_rng(0)
    hidden, nodes, weights, x = 64, [], [], "x"
    for i in range(2):
        weights += [
            numpy_helper.from_array(np.array(2.0, np.float32), f"two{i}"),
            numpy_helper.from_array(np.array(1e-6, np.float32), f"eps{i}"),
            numpy_helper.from_array((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32), f"gain{i}"),
            numpy_helper.from_array((0.1 * rng.standard_normal((hidden, hidden))).astype(np.float32), f"w{i}"),
        ]
        nodes += [
            helper.make_node("Pow", [x, f"two{i}"], [f"square{i}"]),
            helper.make_node("ReduceMean", [f"square{i}"], [f"mean{i}"], axes=[-1]),
            helper.make_node("Add", [f"mean{i}", f"eps{i}"], [f"shifted{i}"]),
            helper.make_node("Sqrt", [f"shifted{i}"], [f"rms{i}"]),
            helper.make_node("Div", [x, f"rms{i}"], [f"normed{i}"]),
            helper.make_node("Mul", [f"normed{i}", f"gain{i}"], [f"scaled{i}"]),
            helper.make_node("MatMul", [f"scaled{i}", f"w{i}"], [f"y{i}"]),
        ]
        x = f"y{i}"
    graph = helper.make_graph(
        nodes,
        "rms",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, hidden])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, [2, 8, hidden])],
        weights,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_rms_norms_fused_into_onnxruntime_operators_of_onnx_domain_load_and_run_in_fp16(tmp_path: Path) -> None:
    """ONNX Runtime writes SimplifiedLayerNormalization in ONNX's own domain, which ONNX's checker
    knows not: the fused model is still read, and its fp16 copy types the operator by ONNX
    Runtime's schema (a cast where it meets fp16 neighbours)."""
    onnx.save(rms_norm_model(), tmp_path / "rms.onnx")
    info = m.load_model_info(tmp_path / "rms.onnx")
    fused = fused_path(info.path, info.sha256, "transformer", tmp_path / "models")
    assert fused_ops(fused) == {"SimplifiedLayerNormalization": 2}
    fused_info = m.load_model_info(fused)
    fp16 = transform(fused, fused_info.sha256, PrecisionSetting("fp16"), [], [], "", tmp_path / "models")
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 8, 64)).astype(np.float32)}
    original = run(info.path, feeds)
    assert np.abs(run(fused, feeds) - original).max() < 1e-4
    assert cosine(run(fp16, feeds), original) > 0.9999


def test_making_fused_models_stops_once_its_share_of_the_time_is_spent(tmp_path: Path) -> None:
    info = m.load_model_info(BERT_EXPORT)
    notes: list[str] = []
    ops = graph_ops(onnx.load(str(BERT_EXPORT)))
    assert fusion_knobs(info, FUSIONS[1:], tmp_path / "models", ops, notes.append, budget_s=-1.0) == []
    assert not (tmp_path / "models").exists()
    assert notes and all("no time left for it in preparation's share of --timeout" in note for note in notes)
    # a value a configuration the search must run uses is made whatever the time
    (knob,) = fusion_knobs(info, FUSIONS[1:], tmp_path / "models", ops, [].append, -1.0, frozenset({"onnxscript"}))
    assert knob.choices == ("none", "onnxscript")


def test_a_fused_model_whose_making_outlasts_its_share_is_stopped_and_leaves_nothing(tmp_path: Path) -> None:
    """The fusion libraries cannot be interrupted: a making still running at the end of its share
    is stopped in its own process, said, and leaves no model behind; with time, the same call makes it."""
    info = m.load_model_info(BERT_EXPORT)
    cache = tmp_path / "models"
    assert fused_within(BERT_EXPORT, info.sha256, "transformer", cache, 0.0) is None
    assert not [p for p in cache.glob("*") if not p.name.endswith(".lock")]
    notes: list[str] = []
    ops = graph_ops(onnx.load(str(BERT_EXPORT)))
    assert fusion_knobs(info, ("transformer",), cache, ops, notes.append, budget_s=1e-3) == []
    assert notes == [
        "graph_fusion transformer not searched: not made within preparation's share of --timeout (0 s for fused"
        " models); a longer --timeout makes it"
    ]
    made = fused_within(BERT_EXPORT, info.sha256, "transformer", cache, 300.0)
    assert made is not None and fused_ops(made) == fused_ops(fused_path(BERT_EXPORT, info.sha256, "transformer", cache))


@pytest.mark.slow
def test_a_study_whose_preparation_was_cut_short_resumes_with_the_space_it_was_made_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A first run with little time leaves fused models and checks out; a resume with more time
    makes and checks what the study has, not more, so the space it finds is the study's."""
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "bert.onnx"
    model.write_bytes(BERT_EXPORT.read_bytes())
    argv = ["tune", str(model), "--storage", "b.db", "--study-name", "b", "--quiet"]
    main([*argv, "--timeout", "2s"])
    assert "no time left for it in preparation's share of --timeout" in capsys.readouterr().err
    study = optuna.load_study(study_name="b", storage="sqlite:///b.db")
    space = study.user_attrs["gpt_optuna"]["space"]
    assert main([*argv, "--timeout", "60s", "--n-trials", str(len(study.trials) + 2)]) == 0
    err = capsys.readouterr().err
    assert "resuming study b" in err and "not searched: no time left" not in err
    assert optuna.load_study(study_name="b", storage="sqlite:///b.db").user_attrs["gpt_optuna"]["space"] == space
