"""--baseline-config: the user's own configuration, read in the engine's terms, measured beside the
engine's defaults by a real ONNX Runtime search, and named by the verdict, ``best`` and the export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import load, tune
from optuna.trial import TrialState

from gpt_optuna.backends.onnxruntime.backend import OnnxRuntimeBackend
from gpt_optuna.backends.onnxruntime.user_settings import knob_values
from gpt_optuna.backends.tensorrt.trtexec_flags import fitted_to
from gpt_optuna.backends.tensorrt.trtexec_flags import knob_values as trtexec_values
from gpt_optuna.cli import main
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.space import Condition, Knob, Space
from gpt_optuna.search.your_configuration import holding_yours, your_candidate
from gpt_optuna.study.trial_record import YOURS_ATTR

ORT = OnnxRuntimeBackend()
SILERO = """providers = ["CPUExecutionProvider"]
[session_options]
intra_op_num_threads = 1
inter_op_num_threads = 1
"""


def test_onnxruntime_settings_map_to_the_knobs_that_set_them() -> None:
    settings = {
        "providers": [
            ["CUDAExecutionProvider", {"device_id": "0", "cudnn_conv_algo_search": "HEURISTIC", "use_tf32": "0"}]
        ],
        "session_options": {"graph_optimization_level": 2, "enable_mem_pattern": False},
        "session_config_entries": {"session.intra_op.allow_spinning": "0"},
    }
    assert knob_values(settings, "f") == {
        "provider": "CUDAExecutionProvider",
        "cuda.cudnn_conv_algo_search": "HEURISTIC",
        "cuda.use_tf32": 0,
        "graph_optimization_level": "ORT_ENABLE_EXTENDED",
        "mem_pattern": False,
        "intra_op_spinning": 0,
    }
    assert knob_values({"providers": ["CPUExecutionProvider"]}, "f") == {"provider": "CPUExecutionProvider"}


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        ({"session_options": {"enable_profiling": True}}, "'enable_profiling', which the tuner cannot set"),
        ({"session_options": {"execution_mode": "FAST"}}, "execution_mode = 'FAST': give one of"),
        ({"providers": ["OpenVINOExecutionProvider"]}, "provider 'OpenVINOExecutionProvider' is not one"),
        ({"providers": [["CPUExecutionProvider", "x"]]}, "providers must list names"),
        ({"session": {}}, "unknown table 'session'"),
    ],
)
def test_settings_no_knob_sets_are_refused_in_one_line(settings: dict[str, object], said: str) -> None:
    with pytest.raises(UserError, match="^f: ") as caught:
        knob_values(settings, "f")
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_trtexec_flags_map_to_the_builder_knobs() -> None:
    flags = [
        "--onnx=m.onnx", "--fp16", "--noTF32", "--builderOptimizationLevel=5", "--memPoolSize=workspace:1G",
        "--tacticSources=-CUDNN,+CUBLAS", "--tilingOptimizationLevel=2", "--useCudaGraph", "--saveEngine=m.plan",
    ]  # fmt: skip
    values = trtexec_values(flags, "f")
    assert values == {
        "flag.FP16": True,
        "flag.TF32": False,
        "builder_optimization_level": 5,
        "workspace_mib": 1024,
        "tactic.CUDNN": False,
        "tactic.CUBLAS": True,
        "tiling_optimization_level": "MODERATE",
        "runtime.cuda_graph": True,
    }
    strategy = fitted_to(values, {"runtime.cuda_graph_strategy"})
    assert strategy["runtime.cuda_graph_strategy"] == "WHOLE_GRAPH_CAPTURE" and "runtime.cuda_graph" not in strategy
    for bad in ("--best", "--builderOptimizationLevel=high", "--memPoolSize=dlaSRAM:1M", "--tacticSources=CUDNN"):
        with pytest.raises(UserError, match="^f: "):
            trtexec_values([bad], "f")


def test_trtexec_flags_read_as_the_installed_trtexec_reads_them() -> None:
    assert "runtime.cuda_graph" not in trtexec_values(["--fp16"], "f", major=10)  # trtexec 10: no graph
    assert trtexec_values(["--fp16"], "f", major=11)["runtime.cuda_graph"] is True  # trtexec 11's default
    assert trtexec_values(["--noCudaGraph"], "f", major=11)["runtime.cuda_graph"] is False


def test_a_value_the_space_does_not_offer_is_added_for_the_configuration_alone() -> None:
    space = Space(
        [
            Knob("provider", ("CUDAExecutionProvider",), "CUDAExecutionProvider", selects_engine=True),
            Knob("threads", (0, 2), 0, condition=Condition("provider", ("CPUExecutionProvider",))),
            Knob("spin", (True, False), True),
        ]
    )
    held = holding_yours(
        space, {"provider": "CPUExecutionProvider", "threads": 1, "spin": 0}, ORT, "--baseline-config f"
    )
    restricted = held.restricted("spin", (True, False))  # as the space check does: the CPU's knobs stay
    assert [k.name for k in restricted.knobs] == ["provider", "threads", "spin"]
    assert held.fitted({"provider": "CPUExecutionProvider", "threads": 1, "spin": False}) == {
        "provider": "CPUExecutionProvider",
        "threads": 1,
        "spin": False,
    }
    assert [k.search_choices for k in held.knobs] == [("CUDAExecutionProvider",), (0, 2), (True, False)]
    notes: list[str] = []
    candidate = your_candidate(held, {"threads": 1, "tf32": True, "spin": "no"}, ORT, "--baseline-config f", notes)
    assert candidate == {"provider": "CUDAExecutionProvider", "spin": True}
    assert notes == [
        "--baseline-config f: threads = 1 takes no effect here: it applies where provider is CPUExecutionProvider",
        "--baseline-config f: tf32 = True cannot be used with this model here; it is left out",
        "--baseline-config f: spin = no cannot be used with this model here; measured at True",
    ]
    with pytest.raises(UserError, match='--baseline-config f spin = "no": give true or false'):
        space.including({"spin": "no"}, "--baseline-config f")
    with pytest.raises(UserError, match="sets tf32, which no knob"):
        space.including({"tf32": True}, "--baseline-config f")


@pytest.mark.slow
def test_a_search_measures_your_configuration_and_the_verdict_names_it(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = tmp_path / "silero.toml"
    mine.write_text(SILERO)
    fp32 = tmp_path / "tune.toml"
    fp32.write_text('[measure]\nbudget_s = 0.05\nmin_samples = 5\n[space]\nprecision = "fp32"\n')
    args = [str(cnn_path), "--baseline-config", str(mine), "--config", str(fp32), "--confirm-processes", "2"]
    assert tune(*args, "--n-trials", "4", "--confirm-top", "2") == 0
    out = capsys.readouterr().out
    study = load("cnn-onnxruntime")
    trials = study.get_trials()
    yours = [t for t in trials if YOURS_ATTR in t.user_attrs]
    assert len(yours) == 1 and yours[0].number == 1 and yours[0].user_attrs[YOURS_ATTR] == "silero.toml"
    assert yours[0].params["intra_op_num_threads"] == 1 and yours[0].state is TrialState.COMPLETE
    confirmed = study.user_attrs["confirmed"]
    assert confirmed["yours"]["number"] == 1
    assert {r["number"] for r in confirmed["yours"]["versus"]} == {0, *confirmed["finalists"]} - {1}
    first = out.splitlines()[[line.startswith("verdict:") for line in out.splitlines()].index(True)]
    assert "your configuration (silero.toml, trial 1)" in first
    assert "your configuration (trial 1, silero.toml): " in out

    capsys.readouterr()
    assert main(["best", "--storage", "sqlite:///studies/cnn-onnxruntime.db", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)
    record = best["your_configuration"]
    assert record["trial"] == 1 and record["file"] == "silero.toml" and record["params"]["intra_op_num_threads"] == 1
    assert isinstance(record["faster"], bool)
    assert record["is_this_trial"] or record["speedup"] == pytest.approx(record["latency_ms"] / best["latency_ms"])

    other = tmp_path / "other.toml"
    other.write_text(SILERO.replace("intra_op_num_threads = 1", "intra_op_num_threads = 2"))
    capsys.readouterr()
    assert tune(str(cnn_path), "--baseline-config", str(other), "--config", str(fp32), "--n-trials", "5") == 2
    err = capsys.readouterr().err
    assert "your configuration (--baseline-config)" in err and "resume it with the same settings" in err
