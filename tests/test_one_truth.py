"""One truth for one study: the summary, status, best, best --json, the export (its side file and
its words), the report (text, best table, every plot's baseline and winner), the notebook,
optuna-dashboard's attributes and notes, and check name the same winner with the same two
latencies of one named measurement, the same speedup and interval; the verdict comes first."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from conftest import SYNTHETIC, load, printed, run_notebook, synthetic_config, tune
from optuna.trial import TrialState

from gpt_optuna.backends.side_file import SideFile
from gpt_optuna.cli import main
from gpt_optuna.core.errors import EXIT_INCONCLUSIVE
from gpt_optuna.results.figures import history_figure, pareto_figure
from gpt_optuna.results.report import best_rows
from gpt_optuna.results.rows import collect, error_axis, marks
from gpt_optuna.study.summary import summarize_study
from gpt_optuna.usecases.check_record import recorded_latency

CNN = str(Path(__file__).parent.parent / "gpt_optuna/data/small_cnn.onnx")
STUDY = "small_cnn-syntheticbackend"
REORDERED = 'mode = "ok"\ndelay_us = [200, 100]\ncontention_us = [0, 60]\nbuild_ms = [0]\na = [0]\nb = [0]\nc = "x"'
"""Four candidates; the one with contention runs 60 µs faster alone (the search) and 60 µs slower
beside the other finalists (the confirmation): the search's fastest loses the confirmation."""


def figures(text: str) -> tuple[int, float, float, float, str]:
    """(winner, its ms, the baseline's ms, speedup, measurement) from the verdict line."""
    found = re.search(
        r"verdict: faster: trial (\d+) is ([\d.]+)x the baseline \[95% CI [\d.-]+\] \(([\d.e-]+) ms against the"
        r" baseline's ([\d.e-]+) ms, (\w+)( in \d processes)?\)",
        text,
    )
    assert found, text
    return int(found[1]), float(found[3]), float(found[4]), float(found[2]), found[5]


def run(command: str, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    capsys.readouterr()
    assert main([command, *flags]) == 0
    return capsys.readouterr().out


@pytest.mark.slow
def test_every_reader_names_the_winner_the_confirmation_chose_over_the_searchs_fastest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = synthetic_config(tmp_path, REORDERED)
    argv = [CNN, "--backend", SYNTHETIC, "--config", str(config), "--n-trials", "4", "--confirm-top", "3"]
    assert tune(*argv, "--no-seeds") == 0
    tuned = capsys.readouterr().out
    study = load(STUDY)
    complete = [t for t in study.trials if t.state is TrialState.COMPLETE]
    searched_best = min(complete, key=lambda t: t.value)
    summary = summarize_study(study)
    assert (searched_best.params["delay_us"], searched_best.params["contention_us"]) == (100, 60)
    assert (summary.best.params["delay_us"], summary.best.params["contention_us"]) == (100, 0)  # reordered
    assert summary.verdict == "faster" and summary.winner.ci[0] > 1.0
    truth = (summary.best.number, summary.best_value, summary.baseline_value, summary.speedup, "confirmed")

    said = {"tune": tuned, "status": run("status", capsys), "best": run("best", capsys)}
    assert all(text.startswith("verdict: faster: trial") for text in said.values())  # the verdict first
    record = json.loads(run("best", capsys, "--json"))
    Path("winner.json").write_text("the user's own file")
    exported = run("export", capsys, "-o", "winner")  # no extension given: the model's
    assert Path("winner.json").read_text() == "the user's own file" and Path("winner.onnx").is_file()
    side = json.loads(Path("winner.onnx.json").read_text())
    said |= {"export": exported}
    readers = {name: figures(text) for name, text in said.items()}
    for name, source in (("best --json", record), ("side file", side)):
        readers[name] = (
            source.get("number", source.get("trial")),
            source["latency_ms"],
            source["baseline_latency_ms"],
            source["speedup"],
            source["measurement"],
        )
        assert source["speedup_ci95"] == pytest.approx(list(summary.winner.ci)) and source["verdict"] == "faster"

    page = run("report", capsys, "-o", "report.html") and Path("report.html").read_text()
    readers["report text"] = figures(page.replace("&#x27;", "'"))
    rows = collect(study)
    table = best_rows(rows, summary)[0]
    readers["report table"] = (table["trial"], table["latency_ms"], table["baseline_ms"], None, table["measured"])
    marked = marks(summary)
    baseline_mark, winner_mark = (next(m for m in marked if m.kind == kind) for kind in ("baseline", "best"))
    for figure in (pareto_figure(rows, error_axis(rows, None), marked), history_figure(rows, marked)):
        shown = json.dumps(figure.to_plotly_json())
        assert f"winner (trial {summary.best.number}, confirmed)" in shown
        assert f"baseline (trial {summary.baseline.number}, confirmed)" in shown
    readers["plots"] = (  # the confirmed figures, drawn beside the trials' search points
        winner_mark.trial,
        winner_mark.confirmed_ms,
        baseline_mark.confirmed_ms,
        None,
        winner_mark.measurement,
    )

    outputs = run_notebook(Path("studies") / f"{STUDY}.db", tmp_path, monkeypatch)
    notebook = printed(outputs)
    readers["notebook"] = figures(notebook)
    table = "".join(o.get("data", {}).get("text/plain", "") for o in outputs if o.output_type == "execute_result")
    first_row = re.search(r"^number.*\n(\d+)\s+feasible\s+[\d.e-]+\s+True\s", table, re.MULTILINE)
    assert first_row and int(first_row[1]) == summary.best.number, table  # the deployed winner's row first
    plots = "".join(json.dumps(o["data"].get("application/vnd.plotly.v1+json", "")) for o in outputs if "data" in o)
    plots += "".join(o["data"].get("text/html", "") for o in outputs if "data" in o)
    assert f"winner (trial {summary.best.number}, confirmed)" in plots  # its figures name the winner

    stored = optuna.load_study(study_name=STUDY, storage=f"sqlite:///studies/{STUDY}.db")
    winner = stored.user_attrs["winner"]
    readers["study attrs"] = (
        winner["trial"],
        winner["latency_ms"],
        winner["baseline_latency_ms"],
        winner["speedup"],
        winner["measurement"],
    )
    assert stored.metric_names == ["latency_ms"]
    from optuna_dashboard import get_note

    trial = SimpleNamespace(
        storage=stored._storage, study=stored, _trial_id=study.trials[summary.best.number]._trial_id
    )
    note = get_note(trial)  # the dashboard's note on the winning trial
    assert f"verdict: faster: trial {summary.best.number}" in note

    for name, seen in readers.items():
        assert seen[0] == truth[0] and seen[4] == truth[4], name
        assert seen[1] == pytest.approx(truth[1], rel=1e-3) and seen[2] == pytest.approx(truth[2], rel=1e-3), name
        if seen[3] is not None:
            assert seen[3] == pytest.approx(truth[3], rel=2e-3), name

    # what check judges a changed model by
    assert recorded_latency(SideFile.of(side)) == pytest.approx(truth[1], rel=1e-3)
    check = ["check", CNN, "--baseline", "winner.onnx.json", "--budget", "4s", "--tolerance", "90%", "--quiet"]
    capsys.readouterr()
    code = main([*check, "--config", str(config)])
    out = capsys.readouterr().out
    assert code in (0, EXIT_INCONCLUSIVE), out  # a busy host may leave it undecided, never a regression
    recorded = re.search(r"against the recorded ([\d.e-]+) ms", out)
    assert recorded is None or float(recorded[1]) == pytest.approx(truth[1], rel=1e-3), out
    assert "extend with" not in out and "confirm" not in out.replace("confirmed", "")


@pytest.mark.slow
def test_when_the_baseline_wins_every_reader_says_so_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every searched candidate is slower than the engine's default (200 µs): keep the default."""
    config = synthetic_config(tmp_path, 'mode = "ok"\ndelay_us = [800, 1600]\nbuild_ms = [0]\na = [0, 1]\nb = [0]')
    assert tune(CNN, "--backend", SYNTHETIC, "--config", str(config), "--n-trials", "4", "--confirm-top", "3") in (0, 3)
    tuned = capsys.readouterr().out
    summary = summarize_study(load(STUDY))
    assert summary.baseline_wins and summary.best.number == summary.baseline.number
    for text in (tuned, run("status", capsys), run("best", capsys)):
        assert text.startswith("verdict: keep the default configuration: the baseline was faster than every finalist")
    assert "export" not in tuned  # nothing worth exporting is suggested
    record = json.loads(run("best", capsys, "--json"))
    assert record["baseline_wins"] and record["number"] == summary.baseline.number and record["speedup"] == 1.0
    out = run("export", capsys, "-o", "w.onnx")
    assert "verdict: keep the default configuration" in out
    assert json.loads(Path("w.onnx.json").read_text())["trial"] == summary.baseline.number


def test_unstable_measurements_are_flagged_with_what_to_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A precision target no measurement can reach in its budget: every latency is flagged, and the
    summary, status and the report say so, with what to do about it."""
    config = tmp_path / "tune.toml"
    config.write_text(
        '[measure]\nbudget_s = 0.02\nmin_samples = 5\ntarget_rel_ci = 1e-9\n[space]\nmode = "ok"\n'
        "delay_us = [200, 100, 50]\n"  # a launch of no delay can time alike to the nanosecond: a zero interval
    )
    flags = ["--config", str(config), "--n-trials", "3", "--confirm-top", "0", "--no-seeds"]
    assert tune(CNN, "--backend", SYNTHETIC, *flags) == 0
    warning = "warning: unstable measurements: 3 of 3 search latencies missed their +-1e-07% precision target"
    measured = [
        (t.number, t.state.name, t.user_attrs.get("latency", {}).get("rel_ci"), t.user_attrs.get("reused_from"))
        for t in load(STUDY).trials
    ]  # what the warning counts, said where it is not as expected
    for text in (capsys.readouterr().out, run("status", capsys)):
        assert warning in text and "the tuner's cores to itself" in text, (measured, text[-1500:])
    run("report", capsys, "-o", "report.html")
    assert warning in Path("report.html").read_text()
    assert json.loads(run("best", capsys, "--json"))["unstable_measurements"] == [3, 3]


def test_a_winner_whose_interval_includes_one_is_no_improvement_said_first_and_not_offered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The verdict and next steps from the confirmation's figures: the same study read with its top
    finalist's interval moved across 1.0 (the mapping from confirmed figures to what is said)."""
    from gpt_optuna.cli.commands import next_steps
    from gpt_optuna.results.summary_text import headline
    from gpt_optuna.search.config import TuneConfig
    from gpt_optuna.usecases.tune import TuneEnd

    config = synthetic_config(tmp_path, 'mode = "ok"\ndelay_us = [200, 100]\nbuild_ms = [0]\na = [0]\nb = [0]\nc = "x"')
    argv = [CNN, "--backend", SYNTHETIC, "--config", str(config), "--n-trials", "2", "--confirm-top", "1"]
    assert tune(*argv, "--no-seeds") == 0
    summary = summarize_study(load(STUDY))
    assert summary.verdict == "faster"
    confirmed = dict(summary.confirmed)
    top = dict(confirmed["ranking"][0])
    unsure = replace(summary, confirmed=confirmed | {"ranking": [top | {"ci_low": 0.97, "ci_high": 1.03}]})
    assert unsure.verdict == "not_significant" and unsure.best.number == top["number"]
    assert headline(unsure).startswith(f"verdict: no significant improvement: the best finalist, trial {top['number']}")
    tuned = TuneConfig(model=Path(CNN), backend=SYNTHETIC, study_name=STUDY)
    assert not [s for s in next_steps(TuneEnd(tuned, unsure, 2, 0), []) if "export" in s]
    steps = next_steps(TuneEnd(tuned, summary, 2, 0), [])
    assert [s for s in steps if s.startswith("export the winner: gpt-optuna export")]
