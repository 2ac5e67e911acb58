"""The Python API against the command line, in process and in real child processes: real ONNX
Runtime, SQLite, workers and a real notebook kernel."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from importlib.resources import files
from pathlib import Path

import optuna
import pytest
from conftest import SYNTHETIC, printed, run_notebook, synthetic_config
from optuna.distributions import IntDistribution
from optuna.trial import TrialState

import gpt_optuna
from gpt_optuna.api.study import DeployChoice
from gpt_optuna.cli import main
from gpt_optuna.core.errors import EXIT_INCONCLUSIVE
from gpt_optuna.core.words import counted
from gpt_optuna.study.summary import StudySummary

SHIPPED_CNN = Path(str(files("gpt_optuna") / "data" / "small_cnn.onnx"))


def as_json(value: object) -> object:
    """``value`` as JSON reads it back (tuples as lists)."""
    return json.loads(json.dumps(value))


@pytest.mark.slow
def test_tune_in_process_names_the_winner_and_figures_best_json_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    study = gpt_optuna.tune(
        SHIPPED_CNN, n_trials=5, seed=3, confirm_processes=2, measure={"budget_s": 0.05}, progress=False
    )
    said = capsys.readouterr().out
    assert said.startswith("verdict: ") and 'report: study.report("report.html")' in said
    assert isinstance(study.study, optuna.Study) and study.study_name == "small_cnn-onnxruntime"
    assert len(study.study.trials) == 5 and study.baseline is not None and study.baseline.number == 0

    assert main(["best", "--json", "--study-name", study.study_name]) == 0
    record = json.loads(capsys.readouterr().out)
    winner = study.winner
    assert winner is not None and as_json(winner.to_dict()) == record
    figures = (winner.number, winner.latency_ms, winner.baseline_latency_ms, winner.speedup, winner.measurement)
    assert figures == tuple(
        record[k] for k in ("number", "latency_ms", "baseline_latency_ms", "speedup", "measurement")
    )
    assert list(winner.speedup_ci95 or []) == (record["speedup_ci95"] or [])
    assert winner.params == record["params"] and winner.headline == record["headline"]
    assert study.baseline.latency_ms == record["baseline_latency_ms"]

    table = study.trials_dataframe()
    assert list(table.index) == [t.number for t in study.study.trials]
    assert table.loc[winner.number, "winner"] and table["winner"].sum() == 1 and table.loc[0, "baseline"]
    assert table.loc[study.deploy.number, "deploy"] and table["deploy"].sum() == 1
    assert "params_provider" in table and "accuracy_cosine" in table
    assert study.pareto_front() and set(study.pareto_front()) <= set(table.index[table["status"] == "feasible"])
    marked = " ".join(trace.name for trace in study.pareto_figure().data)
    named = "winner" if winner.deployed else "best finalist, not shown faster"  # "baseline, the winner" holds "winner"
    assert f"{named} (trial {winner.number}, {winner.measurement})" in marked
    assert f"deployed (trial {study.deploy.number}, {winner.measurement})" in marked
    assert gpt_optuna.load(f"studies/{study.study_name}.db").winner == winner  # as any reader names it


@pytest.mark.slow
def test_a_study_tuned_from_python_reads_back_with_the_command_line_and_the_notebook(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = synthetic_config(tmp_path, 'mode = ["ok", "noisy"]\ndelay_us = [200, 50, 0]\nbuild_ms = [0]')
    database = tmp_path / "elsewhere" / "api.db"
    database.parent.mkdir()
    study = gpt_optuna.tune(
        SHIPPED_CNN,
        backend=SYNTHETIC,
        config=config,
        n_trials=6,
        storage=database,  # a file's path, as load takes it
        study_name="from-python",
        sampler="random",
        seed=1,
        confirm_processes=2,
        progress=False,
    )
    capsys.readouterr()
    assert study.storage == f"sqlite:///{database}"
    where = ["--storage", study.storage, "--study-name", "from-python"]
    assert main(["status", *where]) == 0
    summary, store = capsys.readouterr().out.strip().rsplit("\n", 1)
    size, files, folder = study.disk_used()
    assert summary == str(study) and store.startswith("artifact store: ")
    assert f"{counted(files, 'file')} ({folder})" in store
    assert main(["best", "--json", *where]) == 0
    assert json.loads(capsys.readouterr().out) == as_json(study.winner.to_dict())  # type: ignore[union-attr]
    assert main(["report", "--storage", os.path.relpath(database), "--study-name", "from-python", "-o", "r.html"]) == 0
    page = Path("r.html").read_text().replace("&#x27;", "'")
    assert study.headline in page and f"export --storage {study.storage} --study-name" in page  # from any folder
    exported = study.export(tmp_path / "winner")
    deploy = study.deploy
    assert deploy is not None and deploy.role == ("baseline" if study.summary.keeps_default else "winner")
    assert exported.path.is_file() and json.loads(exported.record.read_text())["trial"] == deploy.number
    assert any(line.startswith("verdict: ") for line in exported.lines)
    checked = study.check(SHIPPED_CNN, budget="8s", tolerance="90%", progress=False)  # the same model, unchanged
    assert [o.name for o in checked.outcomes] == ["accuracy", "latency"] and checked.outcomes[0].passed
    assert checked.code in (0, EXIT_INCONCLUSIVE), [o.message for o in checked.outcomes]  # no regression
    (Path("studies") / "another.db").write_bytes(b"")  # the notebook reads only the study it is given
    outputs = run_notebook(database, tmp_path, monkeypatch, study_name="from-python", papermill=True)
    assert study.headline in printed(outputs)


def test_deploy_names_the_trial_and_whether_it_is_the_winner_or_the_default_kept() -> None:
    def trial(number: int, threads: int, latency: float) -> optuna.trial.FrozenTrial:
        made = optuna.trial.create_trial(
            params={"threads": threads}, distributions={"threads": IntDistribution(0, 8)}, value=latency
        )
        made.number = number
        return made

    baseline, faster = trial(0, 0, 2.0), trial(1, 4, 1.0)
    chosen = DeployChoice.of(StudySummary("s", {}, 0, baseline, faster))
    assert chosen == DeployChoice(number=1, role="winner", params={"threads": 4}, verdict="unconfirmed")
    kept = DeployChoice.of(StudySummary("s", {}, 0, baseline, baseline))  # nothing beat the default
    assert kept == DeployChoice(number=0, role="baseline", params={"threads": 0}, verdict="baseline")
    assert DeployChoice.of(StudySummary("s", {}, 0, None, None)) is None


def test_load_refuses_what_names_no_single_study(tmp_path: Path) -> None:
    with pytest.raises(gpt_optuna.UserError, match="no study database at"):
        gpt_optuna.load(tmp_path / "missing.db")
    with pytest.raises(gpt_optuna.UserError, match="is a folder"):
        gpt_optuna.load(tmp_path)
    url = f"sqlite:///{tmp_path / 'two.db'}"
    for name in ("a", "b"):
        optuna.create_study(study_name=name, storage=url)
    with pytest.raises(gpt_optuna.UserError, match=r"holds 2 studies \(a, b\)"):
        gpt_optuna.load(url)


def test_bad_arguments_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(gpt_optuna.UserError, match="malformed duration"):
        gpt_optuna.tune(SHIPPED_CNN, timeout="soon")
    with pytest.raises(gpt_optuna.UserError, match="unknown \\[measure\\] key"):
        gpt_optuna.tune(SHIPPED_CNN, measure={"budget": 1})
    with pytest.raises(gpt_optuna.UserError, match="malformed --accuracy"):
        gpt_optuna.tune(SHIPPED_CNN, accuracy="cosine>>1")
    assert not Path("studies").exists()


SCRIPT = """\
import signal
import sys

import gpt_optuna


def callers(signum, frame):
    pass


signal.signal(signal.SIGTERM, callers)  # no `if __name__ == "__main__":`: the workers never run this file
try:
    gpt_optuna.tune(
        {model!r}, backend={backend!r}, config={config!r}, n_trials=5, sampler="random", seed=5, confirm_top=0
    )
except KeyboardInterrupt as stopped:
    print("stopped:", stopped)
    restored = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    print("handlers given back:", restored and signal.getsignal(signal.SIGTERM) is callers)
    study = gpt_optuna.load("studies/cnn-syntheticbackend.db").confirm(top=1, processes=1, rounds=3)
    print("confirmed after the interrupt:", study.summary.confirmed["processes"])  # the next step starts afresh
    sys.exit(7)
print("finished")
"""


@pytest.mark.slow
def test_ctrl_c_in_python_leaves_the_study_resumable_and_gives_back_the_callers_handlers(tmp_path: Path) -> None:
    from test_interrupt import STUDY, slow_config, trials, wait_for_running_after

    model = tmp_path / "cnn.onnx"
    model.write_bytes(SHIPPED_CNN.read_bytes())
    script = tmp_path / "search.py"
    script.write_text(SCRIPT.format(model=str(model), backend=SYNTHETIC, config=str(slow_config(tmp_path))))
    command = [sys.executable, str(script)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for_running_after(proc, complete=2)  # the baseline and a candidate, to confirm after
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal (or a notebook's interrupt) sends it
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 7, out + err
    assert "stopped: the search was stopped by Ctrl-C; the same call resumes it" in out
    assert "handlers given back: True" in out and "confirmed after the interrupt: 1" in out
    assert f"study {STUDY}:" in out and "resume with: the same gpt_optuna.tune(...) call" in out
    assert f"the study: study = gpt_optuna.load('sqlite:///{tmp_path}/studies/{STUDY}.db', '{STUDY}')" in out
    after = trials()
    stopped = [t for t in after if t.user_attrs.get("interrupted") == "stopped by the user"]
    assert len(stopped) == 1 and stopped[0].state is TrialState.FAIL
    waiting = [t for t in after if t.state is TrialState.WAITING]
    assert len(waiting) == 1 and waiting[0].params == stopped[0].params

    rerun = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert rerun.returncode == 0 and "finished" in rerun.stdout, rerun.stderr
    final = trials()
    assert sum(t.state is TrialState.COMPLETE for t in final) == 5
    assert not [t for t in final if t.state in (TrialState.RUNNING, TrialState.WAITING)]


@pytest.mark.slow
def test_a_search_in_a_notebook_shows_its_progress_as_a_widget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipywidgets")
    config = synthetic_config(tmp_path, 'mode = ["ok"]\ndelay_us = [200, 0]\nbuild_ms = [0]')
    source = f"""\
        import gpt_optuna

        study = gpt_optuna.tune(
            {str(SHIPPED_CNN)!r}, backend={SYNTHETIC!r}, config={str(config)!r}, n_trials=3, confirm_top=0
        )
        print("the winner: trial", study.winner.number)"""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(textwrap.dedent(source))])
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3").execute()
    outputs = notebook.cells[0].outputs
    assert not [o for o in outputs if o.output_type == "error"], outputs
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)  # tqdm's widget
    text = printed(outputs)
    assert "verdict: " in text and "the winner: trial" in text
    assert "IProgress not found" not in text
