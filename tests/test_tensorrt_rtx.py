"""Real TensorRT-RTX engine builds on the CPU: knobs, failures, profiles, dry-run studies, artifacts."""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.artifacts import FileSystemArtifactStore, download_artifact
from optuna.trial import TrialState

from gpt_optuna.backends.base import BuildError
from gpt_optuna.backends.tensorrt.backend import TensorRTRTXBackend, _capturing_logger
from gpt_optuna.backends.tensorrt.knobs import RouteKnob, configure
from gpt_optuna.cli import main
from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.graph import model as m
from gpt_optuna.study.artifacts import kept_engine

trt = pytest.importorskip("tensorrt_rtx", reason="the rtx extra (tensorrt-rtx-cu13) is not installed")


def load(name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///studies/{name}.db")


def test_space_is_discovered_from_the_library(cnn_path: Path) -> None:
    info = m.load_model_info(cnn_path)
    space = TensorRTRTXBackend().space(info, m.resolve_shapes(info, {}))
    knobs = {k.name: k for k in space.knobs}
    assert knobs["builder_optimization_level"].default == 3
    assert set(knobs["tiling_optimization_level"].choices) == set(trt.TilingOptimizationLevel.__members__)
    assert {f"tactic.{name}" for name in trt.TacticSource.__members__} <= knobs.keys()
    assert "runtime.cuda_graph_strategy" in knobs
    assert not [name for name in knobs if name.startswith("route.")]  # RTX's all_build_routes is empty
    assert not {"flag.FP16", "flag.BF16", "flag.INT8"} & knobs.keys()  # strongly typed only


def test_many_sampled_candidates_build_real_engines(cnn_path: Path, tmp_path: Path) -> None:
    info = m.load_model_info(cnn_path)
    shapes = m.resolve_shapes(info, {})
    backend = TensorRTRTXBackend()
    space = backend.space(info, shapes)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    sizes = set()
    for _ in range(16):
        trial = study.ask()
        candidate = space.suggest(trial)
        if candidate["workspace_mib"] != "default" and int(candidate["workspace_mib"]) < 256:
            continue
        built = backend.build(info, candidate, EnginePaths.under(tmp_path), shapes)
        plan = backend.serialize(built)
        assert plan is not None and len(plan) == built.facts.engine_bytes > 1000
        assert built.facts.engine_sha256 == hashlib.sha256(plan).hexdigest()
        sizes.add(len(plan))
        study.tell(trial, built.build_s)
    assert sizes


def test_parse_error_names_the_node_and_op(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["h"], name="relu0"),
            helper.make_node("Mystery", ["h"], ["y"], name="odd", domain="com.example"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    onnx.save(model, tmp_path / "odd.onnx")
    info = m.load_model_info(tmp_path / "odd.onnx")
    backend = TensorRTRTXBackend()
    with pytest.raises(BuildError, match=r"node 'odd' \(op Mystery\)"):
        backend.build(info, backend.space(info, {}).default(), EnginePaths.under(tmp_path), m.resolve_shapes(info, {}))


def test_dynamic_batch_builds_with_one_profile(mlp_path: Path, tmp_path: Path) -> None:
    info = m.load_model_info(mlp_path)
    shapes = m.resolve_shapes(info, m.parse_shapes(["x:1x16/4x16/8x16"]))
    backend = TensorRTRTXBackend()
    space = backend.space(info, shapes)
    assert "runtime.dynamic_shapes_kernel_specialization" in {k.name for k in space.knobs}
    assert backend.build(info, space.default(), EnginePaths.under(tmp_path), shapes).facts.engine_bytes > 0


def dry_run(cnn_path: Path, *flags: str) -> int:
    return main(["tune", str(cnn_path), "--backend", "tensorrt-rtx", "--dry-run", "--quiet", *flags])


def test_dry_run_study_end_to_end_with_engine_artifacts(cnn_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert dry_run(cnn_path, "--n-trials", "10", "--seed", "0") == 0
    study = load("cnn-tensorrt-rtx")
    trials = study.get_trials()
    assert trials[0].user_attrs["baseline"] and trials[0].params["builder_optimization_level"] == 3
    complete = [t for t in trials if t.state is TrialState.COMPLETE]
    assert len(complete) >= 8
    store = FileSystemArtifactStore("studies/cnn-tensorrt-rtx/artifacts")
    for t in complete:
        assert t.value == t.user_attrs["build_s"] > 0
        if "reused_from" in t.user_attrs:
            continue
        path = Path(f"engine-{t.number}.plan")
        download_artifact(artifact_store=store, artifact_id=t.user_attrs["engine_artifact"], file_path=str(path))
        data = path.read_bytes()
        assert len(data) == t.user_attrs["engine_bytes"]
        assert hashlib.sha256(data).hexdigest() == t.user_attrs["engine_sha256"]
    assert not list(Path("studies/cnn-tensorrt-rtx/engines").iterdir())  # temporary files are gone
    kept = next(t for t in complete if "reused_from" not in t.user_attrs)
    saved, gone = kept_engine(study, kept)  # what a re-measurement, compare and check load, not rebuild
    assert saved is not None and gone is None
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == kept.user_attrs["engine_sha256"]
    saved.unlink()
    assert kept_engine(study, kept) == (None, f"trial {kept.number}'s kept engine ({saved}) is gone: it is built again")
    capsys.readouterr()
    assert main(["best", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["dry_run"] is True and record["latency_ms"] is None and record["build_s"] > 0
    assert dry_run(cnn_path, "--n-trials", "12", "--seed", "0") == 0  # resumes
    assert len(load("cnn-tensorrt-rtx").get_trials()) == 12


def test_a_build_that_returns_no_engine_is_pruned_as_a_failure_and_the_study_goes_on(
    cnn_path: Path, tmp_path: Path
) -> None:
    """A build error would fail again: the trial is PRUNED with a failure constraint, so samplers
    steer away from it, and no candidate is evaluated twice in a space of four."""
    config = tmp_path / "tune.toml"
    config.write_text(
        '[space]\nprecision = "fp32"\nworkspace_mib = ["default", 0]\nbuilder_optimization_level = [3, 4]\n'
    )
    argv = ["--n-trials", "4", "--config", str(config), "--sampler", "random", "--seed", "1", "--no-seeds"]
    assert dry_run(cnn_path, *argv) == 0
    trials = load("cnn-tensorrt-rtx").get_trials()
    assert len({tuple(sorted(t.params.items())) for t in trials}) == 4
    failed = [t for t in trials if t.params["workspace_mib"] == 0]
    assert len(failed) == 2 and all(t.state is TrialState.PRUNED for t in failed)
    for trial in failed:
        assert trial.user_attrs["outcome"] == "build_error"
        assert trial.user_attrs["failure"].startswith("TensorRT built no engine: ")
        assert "workspace" in trial.user_attrs["log"] and "Traceback" in trial.user_attrs["log"]
        assert trial.constraints["failure"] > 0
    assert all(t.state is TrialState.COMPLETE for t in trials if t not in failed)


def test_rtx_timing_cache_records_nothing_so_none_is_kept(cnn_path: Path) -> None:
    """Why a second RTX build is not faster: RTX records no timings (its timing-cache API is a no-op
    since RTX 1.2, and loading a cache needs a GPU), so the backend keeps no cache for it."""
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    assert trt.OnnxParser(network, logger).parse_from_file(str(cnn_path))
    config = builder.create_builder_config()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        cache = config.create_timing_cache(b"")
        empty = bytes(cache.serialize())
        config.set_timing_cache(cache, False)
        assert builder.build_serialized_network(network, config) is not None
        assert bytes(cache.serialize()) == empty
    assert dry_run(cnn_path, "--n-trials", "3") == 0
    assert not Path("studies/cnn-tensorrt-rtx/timing.cache").exists()


def test_space_command_prints_the_space_with_overrides_and_builds_nothing(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "tune.toml"
    config.write_text('[space]\nbuilder_optimization_level = "default"\nmax_aux_streams = [0, 2]\n')
    assert main(["space", str(cnn_path), "--backend", "tensorrt-rtx", "--config", str(config), "--json"]) == 0
    knobs = {k["name"]: k for k in json.loads(capsys.readouterr().out)["knobs"]}
    assert knobs["builder_optimization_level"]["choices"] == [3]
    assert knobs["max_aux_streams"] == {  # searched: 0 and 2; the engine's default -1 for the baseline
        "name": "max_aux_streams",
        "choices": [-1, 0, 2],
        "default": -1,
        "searched": [0, 2],
    }
    assert main(["space", str(cnn_path), "--backend", "tensorrt-rtx"]) == 0
    text = capsys.readouterr().out
    assert "builder_optimization_level" in text and "default 3" in text and "knobs," in text
    assert not Path("studies").exists()


def test_running_engines_without_cupy_stops_with_one_line_and_keeps_the_candidate(
    cnn_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed here")
    except ImportError:
        pass
    assert main(["tune", str(cnn_path), "--backend", "tensorrt-rtx", "--n-trials", "3", "--quiet"]) == 2
    assert "pip install 'gpt-optuna[gpu]'" in capsys.readouterr().err
    trials = load("cnn-tensorrt-rtx").get_trials()
    assert trials[0].state is TrialState.FAIL and trials[0].user_attrs["interrupted"].startswith("stopped: CuPy")
    retry = next(t for t in trials if t.system_attrs.get("failed_trial") == 0)
    assert retry.state is TrialState.WAITING and retry.user_attrs["baseline"] is True


def test_every_graph_precision_builds_a_real_engine_in_a_dry_run(cnn_path: Path, tmp_path: Path) -> None:
    config = tmp_path / "tune.toml"
    config.write_text('[space]\nprecision = ["fp16", "bf16", "int8", "fp8"]\nkeep_fp32_nodes = [0]\n')
    flags = ["--n-trials", "12", "--config", str(config), "--sampler", "random", "--seed", "0"]
    assert dry_run(cnn_path, *flags) == 0
    trials = load("cnn-tensorrt-rtx").get_trials()
    outcomes = {}
    for t in trials:
        if "reused_from" not in t.user_attrs:
            outcomes[t.params["precision"]] = (t.state, t.user_attrs.get("failure", ""))
    assert {p: state for p, (state, _) in outcomes.items()} == dict.fromkeys(  # fp32: the baseline
        ("fp32", "fp16", "bf16", "int8", "fp8"), TrialState.COMPLETE
    ), outcomes
    for t in trials:
        if t.state is TrialState.COMPLETE and t.params["precision"] != "fp32":
            assert t.user_attrs["transformed_model"].startswith(t.params["precision"] + "-")
        if t.state is TrialState.COMPLETE:  # what the builder itself made the engine take and return
            assert t.user_attrs["engine_io"] == {"inputs": {"input": "float32"}, "outputs": {"logits": "float32"}}
    fp16 = next(t for t in trials if t.state is TrialState.COMPLETE and t.params["precision"] == "fp16")
    assert main(["export", "--trial", str(fp16.number), "-o", "fp16"]) == 0
    interface = json.loads(Path("fp16.plan.json").read_text())["interface"]
    assert not interface["changed"] and interface["engine"] == fp16.user_attrs["engine_io"]
    assert [(t["name"], t["dtype"]) for t in interface["inputs"]] == [("input", "float32")]


def test_the_network_is_strongly_typed_and_every_builder_shares_one_logger(cnn_path: Path, tmp_path: Path) -> None:
    info = m.load_model_info(cnn_path)
    rtx = TensorRTRTXBackend()
    candidate = rtx.space(info, m.resolve_shapes(info, {})).default()
    _, network, _, logger = rtx._parse(info, EnginePaths.under(tmp_path), candidate)
    assert network.get_flag(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    assert rtx._parse(info, EnginePaths.under(tmp_path), candidate)[3] is logger


def test_a_build_route_the_library_does_not_take_is_a_build_error() -> None:
    config = trt.Builder(_capturing_logger(trt)).create_builder_config()
    route = RouteKnob("-kgen:tiling", ("0", "2"), "0", open_ended=False)
    with pytest.raises(BuildError, match="did not take the build route '-kgen:tiling=2'"):
        configure(trt, config, {"route.kgen:tiling": "2"}, [route])  # RTX reads any route back as ''


def test_an_unreadable_timing_cache_is_told_from_an_empty_one(tmp_path: Path) -> None:
    config = trt.Builder(_capturing_logger(trt)).create_builder_config()
    path = tmp_path / "timing.cache"
    path.write_bytes(b"\x00garbage" * 64)  # the library makes an empty cache of it, not None
    logger = _capturing_logger(trt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # RTX's timing cache calls are no-ops
        TensorRTRTXBackend._load_timing_cache(config, path, logger)
    assert not path.exists() and (tmp_path / "timing.cache.corrupt").is_file()
    assert any("set the unreadable timing cache aside" in line for line in logger.messages)
