"""``gpt-optuna check`` as a CI gate, against real ONNX Runtime runs on the CPU: an unchanged model
passes, a model made ten times slower fails on latency and one whose outputs changed fails on
accuracy, each with exit 1 and a JUnit <failure>; a check its budget cannot decide says so (exit 5,
<skipped>); a record slower than the model is updated; without the record's model beside it, the
recorded figure is the reference."""

from __future__ import annotations

import json
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import tune
from onnx import numpy_helper

from gpt_optuna.cli import main
from gpt_optuna.core.errors import EXIT_INCONCLUSIVE
from gpt_optuna.testing.slowed import slowed as slowed_by_extra_work

CONFIG = 'confirm_processes = 5\n[measure]\nbudget_s = 0.1\nmin_samples = 5\n[space]\nprecision = "default"\n'


def slowed(model: onnx.ModelProto) -> onnx.ModelProto:
    """The same outputs after two heavy convolutions: about ten times the work of the small CNN."""
    return slowed_by_extra_work(model, 128, layers=1)


def changed(model: onnx.ModelProto) -> onnx.ModelProto:
    """Other outputs: the classifier's weights perturbed."""
    other = onnx.ModelProto()
    other.CopyFrom(model)
    for init in other.graph.initializer:
        if init.name == "fc.w":
            weight = numpy_helper.to_array(init)
            init.CopyFrom(
                numpy_helper.from_array(
                    weight + np.random.default_rng(2).standard_normal(weight.shape).astype(np.float32), "fc.w"
                )
            )
    return other


def junit_failures(path: Path) -> list[str]:
    suite = ET.parse(path).getroot()
    assert suite.tag == "testsuite" and suite.get("tests") == str(len(suite.findall("testcase")))
    return [f.get("message", "") for f in suite.iter("failure")]


def recorded(model: Path, tmp_path: Path, name: str = "record") -> list[str]:
    """A tuned study of ``model`` exported as ``NAME.onnx``; the check command's start against it."""
    (tmp_path / "tune.toml").write_text(CONFIG)
    config = ["--config", str(tmp_path / "tune.toml")]
    study = ["--study-name", name]
    assert tune(str(model), *config, *study, "--n-trials", "6", "--seed", "0", "--confirm-top", "0") == 0
    assert main(["export", *study, "-o", f"{name}.onnx"]) == 0
    assert Path(f"{name}.onnx.inputs.npz").is_file() and Path(f"{name}.onnx.reference.npz").is_file()
    return ["check", "--baseline", f"{name}.onnx.json", "--budget", "20s", "--quiet", *config]


def decided(check: list[str], capsys: pytest.CaptureFixture[str], *more: str) -> tuple[int, str]:
    """The check's exit code and output, its --budget doubled while it answers inconclusive (a busy
    host times fewer processes in one budget), up to eight times the first: what is asserted is the
    verdict given the time to reach one, never one host's speed."""
    args, at = list(check), check.index("--budget") + 1
    first = float(args[at].removesuffix("s"))
    for factor in (1, 2, 4, 8):
        args[at] = f"{first * factor:g}s"
        capsys.readouterr()
        code = main([*args, *more])
        out = capsys.readouterr().out
        if code != EXIT_INCONCLUSIVE:
            break
    return code, out


@pytest.mark.slow
def test_check_passes_the_record_and_fails_a_slower_or_changed_model(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check = recorded(cnn_path, tmp_path)
    # the record's model and the changed one are timed interleaved on this host, so a tolerance of 90% tells
    # the unchanged model from one made ten times slower however busy the host, given the time for two processes
    code, out = decided(check, capsys, str(cnn_path), "--tolerance", "90%", "--junit", "same.xml")
    assert code == 0, out
    assert "ok: latency within 90%: the changed model under the recorded configuration" in out, out
    processes = re.search(r"timed interleaved here in (\d+) processes", out)
    assert processes and int(processes[1]) >= 2 and junit_failures(Path("same.xml")) == []

    model = onnx.load(str(cnn_path))
    onnx.save(slowed(model), "slow.onnx")
    code, out = decided(check, capsys, "slow.onnx", "--tolerance", "90%", "--junit", "slow.xml")
    assert code == 1, out
    assert "FAILED: latency regression" in out and "ok: the model's outputs meet" in out
    (failure,) = junit_failures(Path("slow.xml"))
    assert failure.startswith("latency regression")

    onnx.save(changed(model), "changed.onnx")
    assert main([*check, "changed.onnx", "--junit", "changed.xml"]) == 1
    (failure,) = junit_failures(Path("changed.xml"))
    assert failure.startswith("accuracy regression: the model's outputs changed: cosine=")

    assert main([*check, str(cnn_path), "--tolerance", "lots"]) == 2
    assert main(["check", str(cnn_path), "--baseline", "nothing.json"]) == 2


@pytest.mark.slow
def test_a_check_its_budget_cannot_decide_is_inconclusive_never_a_pass(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check = recorded(cnn_path, tmp_path)
    capsys.readouterr()
    started = time.monotonic()
    short = ["1s" if arg == "20s" else arg for arg in check]
    assert main([*short, str(cnn_path), "--junit", "short.xml"]) == EXIT_INCONCLUSIVE
    out = capsys.readouterr().out
    assert "INCONCLUSIVE: latency not decided:" in out and "give more --budget" in out
    suite = ET.parse("short.xml").getroot()
    assert suite.get("skipped") == "1" and junit_failures(Path("short.xml")) == []
    assert time.monotonic() - started < 60  # the budget bounds the command (a hang guard: no process overran it)


@pytest.mark.slow
def test_a_record_slower_than_the_model_is_updated_and_without_its_model_the_recorded_figure_counts(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    onnx.save(slowed(onnx.load(str(cnn_path))), "heavy.onnx")  # the same outputs, ten times the work
    check = recorded(Path("heavy.onnx"), tmp_path, "slow")
    before = json.loads(Path("slow.onnx.json").read_text())
    code, out = decided(check, capsys, str(cnn_path), "--update")
    assert code == 0 and "ok: faster than the record" in out, out
    assert json.loads(Path("slow.onnx.json").read_text())["latency_ms"] < before["latency_ms"] / 2

    Path("slow.onnx").rename("elsewhere.onnx")  # the record alone: its figure, measured where it was made
    recorded_ms = json.loads(Path("slow.onnx.json").read_text())["latency_ms"]
    code = main([*check, str(cnn_path), "--tolerance", "90%"])
    out = capsys.readouterr().out
    assert "note: the record's model slow.onnx is not beside it: the latency is judged against the recorded" in out
    # a figure from another moment: how it compares depends on the host's speed then and now
    said = f"against the recorded {recorded_ms:.4g} ms (a figure of the host that made the record)"
    verdicts = {0: ("ok: faster than the record", "ok: latency within 90%"), 1: ("FAILED: latency regression",)}
    verdicts[EXIT_INCONCLUSIVE] = ("INCONCLUSIVE: latency not decided",)
    assert any(f"{verdict}: trial" in out for verdict in verdicts.get(code, ())) and said in out, out


def test_a_malformed_record_of_any_shape_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Valid JSON of the wrong shape, fields of the wrong type, sample files that are not the
    model's: each a user error in one line (exit 2), never a traceback or a regression's exit 1."""
    from conftest import SYNTHETIC, synthetic_config

    config = synthetic_config(tmp_path, 'mode = "ok"\ndelay_us = [100]')
    model = str(Path(__file__).parent.parent / "gpt_optuna/data/small_cnn.onnx")
    assert tune(model, "--backend", SYNTHETIC, "--config", str(config), "--n-trials", "2", "--confirm-top", "0") == 0
    assert main(["export", "-o", "record"]) == 0
    good = json.loads(Path("record.onnx.json").read_text())
    shapes = {
        "null": None,
        "a list": [1, 2],
        "latency as text": good | {"latency_ms": "fast"},
        "a negative latency": good | {"latency_ms": -1.0},
        "params as a list": good | {"params": [1, 2]},
        "a params value that is an object": good | {"params": {"delay_us": {"x": 1}}},
        "no backend": {k: v for k, v in good.items() if k != "backend"},
        "samples missing": good | {"samples": None},
        "samples of other keys": good | {"samples": {"x": "y"}},
        "a sample file that is not there": good | {"samples": {"inputs": "gone.npz", "reference": "gone.npz"}},
        "a malformed criterion": good | {"accuracy_criterion": "cosine>>1"},
        "shapes as text": good | {"shapes": "1x3"},
    }
    for what, record in shapes.items():
        Path("bad.onnx.json").write_text(json.dumps(record))
        for kind in ("inputs", "reference"):
            Path(f"bad.onnx.{kind}.npz").write_bytes(Path(f"record.onnx.{kind}.npz").read_bytes())
        capsys.readouterr()
        assert main(["check", model, "--baseline", "bad.onnx.json", "--budget", "5s", "--quiet"]) == 2, what
        err = capsys.readouterr().err
        assert err.startswith("gpt-optuna: error: ") and err.count("\n") == 1 and "Traceback" not in err, (what, err)
    np.savez("bad.onnx.inputs.npz", other=np.zeros((1, 1, 3, 64, 64), np.float32))
    own = {"inputs": "bad.onnx.inputs.npz", "reference": "bad.onnx.reference.npz"}
    Path("bad.onnx.json").write_text(json.dumps(good | {"samples": own}))
    assert main(["check", model, "--baseline", "bad.onnx.json", "--quiet"]) == 2
    assert "the record's inputs (other) are not the model's (input)" in capsys.readouterr().err
    Path("bad.onnx.inputs.npz").write_bytes(b"not an npz")
    assert main(["check", model, "--baseline", "bad.onnx.json", "--quiet"]) == 2
    assert "cannot read the record's" in capsys.readouterr().err


def test_an_internal_error_exits_4_apart_from_a_regression(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The mapping from an unexpected exception (a bug of ours) to its exit code: 4, with the traceback."""
    from gpt_optuna.cli import commands

    def broken(argv: list[str]) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(commands, "run", broken)
    assert main(["status"]) == 4
    err = capsys.readouterr().err
    assert "Traceback" in err and "internal error (a bug" in err


@pytest.mark.slow
def test_a_record_of_a_study_with_your_configuration_carries_it_into_the_check(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "tune.toml").write_text(CONFIG)
    (tmp_path / "mine.toml").write_text(
        'providers = ["CPUExecutionProvider"]\n[session_options]\nintra_op_num_threads = 1\n'
    )
    config = ["--config", str(tmp_path / "tune.toml")]
    assert tune(str(cnn_path), *config, "--baseline-config", "mine.toml", "--n-trials", "4", "--confirm-top", "0") == 0
    assert main(["export", "-o", "record.onnx"]) == 0
    carried = json.loads(Path("record.onnx.json").read_text())["your_configuration"]
    assert carried["file"] == "mine.toml" and carried["params"]["intra_op_num_threads"] == 1
    capsys.readouterr()
    check = ["check", str(cnn_path), "--baseline", "record.onnx.json", "--budget", "30s", "--quiet", *config]
    assert main([*check, "--tolerance", "90%"]) in (0, 5)
    out = capsys.readouterr().out
    assert "against your configuration: " in out and "your configuration (mine.toml, trial" in out
    name = re.search(r"--study-name (check-\S+)", out)
    assert name is not None
    import optuna

    trials = optuna.load_study(study_name=name[1], storage=f"sqlite:///studies/{name[1]}.db").get_trials()
    yours = [t for t in trials if "your_configuration" in t.user_attrs]
    assert len(yours) == 1 and yours[0].params["intra_op_num_threads"] == 1
