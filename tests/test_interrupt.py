"""A tuner killed with SIGKILL or stopped with Ctrl-C, SIGTERM or SIGHUP: real processes, real signals, real SQLite."""

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from conftest import SYNTHETIC
from optuna.trial import TrialState

from gpt_optuna.core.errors import UserError
from gpt_optuna.study.storage import open_storage
from gpt_optuna.study.summary import summarize_study

STUDY = "cnn-syntheticbackend"


def command(cnn_path: Path, config: Path, n_trials: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gpt_optuna.cli",
        "tune",
        str(cnn_path),
        "--backend",
        SYNTHETIC,
        "--config",
        str(config),
        "--n-trials",
        str(n_trials),
        "--quiet",
        "--sampler",
        "random",
        "--seed",
        "5",
        "--confirm-top",
        "0",
    ]


def slow_config(tmp_path: Path) -> Path:
    """Every candidate takes about a second to build, so a trial is easy to catch running."""
    path = tmp_path / "tune.toml"
    path.write_text('[measure]\nbudget_s = 0.05\nmin_samples = 5\n[space]\nmode = ["ok"]\nbuild_ms = [1000]\n')
    return path


def trials() -> list[optuna.trial.FrozenTrial]:
    storage = open_storage(f"sqlite:///studies/{STUDY}.db", create=False)  # a reader never creates tables
    return optuna.load_study(study_name=STUDY, storage=storage).get_trials()


def wait_for_running_after(proc: subprocess.Popen, complete: int, limit_s: float = 90) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if Path(f"studies/{STUDY}.db").exists():
            try:
                current = trials()
            except (UserError, KeyError):  # the tuner has not made the study yet
                current = []
            done = sum(t.state is TrialState.COMPLETE for t in current)
            running = [t for t in current if t.state is TrialState.RUNNING and "owner" in t.user_attrs]
            if done >= complete and running:
                time.sleep(0.3)  # well inside the running trial's one-second build
                return
        time.sleep(0.1)
    raise AssertionError("no trial was caught running")


@pytest.mark.slow
def test_sigkill_loses_nothing_and_the_rerun_retries_the_interrupted_candidate(tmp_path: Path, cnn_path: Path) -> None:
    config = slow_config(tmp_path)
    proc = subprocess.Popen(command(cnn_path, config, 6), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for_running_after(proc, complete=2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    before = trials()
    stuck = [t for t in before if t.state is TrialState.RUNNING]
    assert len(stuck) == 1
    status = subprocess.run([sys.executable, "-m", "gpt_optuna.cli", "status"], capture_output=True, text=True)
    assert f"running with no tuner alive on this host: trial {stuck[0].number} " in status.stdout, status.stdout
    completed = {t.number: t.value for t in before if t.state is TrialState.COMPLETE}
    assert len(completed) >= 2

    rerun = subprocess.run(command(cnn_path, config, 6), capture_output=True, text=True, timeout=180)
    assert rerun.returncode == 0, rerun.stderr
    assert f"trials {stuck[0].number} were interrupted by a killed run; retrying them" in rerun.stderr
    after = trials()
    assert not [t for t in after if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert {t.number: t.value for t in after if t.number in completed} == completed
    killed = after[stuck[0].number]
    assert killed.state is TrialState.FAIL and killed.user_attrs["interrupted"] == "the tuner was killed"
    retries = [t for t in after if t.system_attrs.get("failed_trial") == killed.number]
    assert len(retries) == 1 and retries[0].params == killed.params
    assert retries[0].state is TrialState.COMPLETE
    assert sum(t.state is TrialState.COMPLETE for t in after) == 6


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signum", "code", "said", "reason"),
    [
        (signal.SIGINT, 130, "stopped by Ctrl-C", "stopped by the user"),
        (signal.SIGTERM, 143, "stopped by SIGTERM", "stopped by SIGTERM"),
        (signal.SIGHUP, 129, "stopped by SIGHUP", "stopped by SIGHUP"),
    ],
)
def test_ctrl_c_marks_the_trial_prints_the_summary_and_how_to_resume(
    tmp_path: Path, cnn_path: Path, signum: int, code: int, said: str, reason: str
) -> None:
    """Ctrl-C, and SIGTERM (schedulers, ``timeout``) or SIGHUP alike, sent to the whole process
    group as a terminal or ``timeout`` sends them: the workers leave stopping to the tuner."""
    config = slow_config(tmp_path)
    proc = subprocess.Popen(
        command(cnn_path, config, 5), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    wait_for_running_after(proc, complete=1)
    running = summarize_study(optuna.load_study(study_name=STUDY, storage=f"sqlite:///studies/{STUDY}.db"))
    assert running.counts["running"] == 1 and running.orphaned == ()  # its tuner is at work
    os.killpg(proc.pid, signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert said in err
    assert "Traceback" not in err
    assert f"study {STUDY}:" in out
    (resume,) = [line for line in out.splitlines() if line.startswith("resume with: cd ")]
    assert resume.endswith(shlex.join(command(cnn_path, config, 5)[4:])), resume  # the same command
    after = trials()
    stopped = [t for t in after if t.user_attrs.get("interrupted") == reason]
    assert len(stopped) == 1 and stopped[0].state is TrialState.FAIL
    waiting = [t for t in after if t.state is TrialState.WAITING]
    assert len(waiting) == 1 and waiting[0].params == stopped[0].params

    rerun = subprocess.run(command(cnn_path, config, 5), capture_output=True, text=True, timeout=180)
    assert rerun.returncode == 0, rerun.stderr
    final = trials()
    assert sum(t.state is TrialState.COMPLETE for t in final) == 5
    assert not [t for t in final if t.state in (TrialState.RUNNING, TrialState.WAITING)]


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc to find the worker process")
def test_killed_tuner_takes_its_hung_worker_with_it(tmp_path: Path, cnn_path: Path) -> None:
    path = tmp_path / "hang.toml"
    path.write_text('[space]\nmode = ["hang"]\n')
    proc = subprocess.Popen(command(cnn_path, path, 2), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    children: list[int] = []
    while time.monotonic() < deadline and not children:
        children = (
            [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
            if proc.poll() is None
            else []
        )
        time.sleep(0.2)
    assert children, "the worker never started"
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{c}").exists() and "Z" not in _state(c) for c in children):
        time.sleep(0.1)
    assert not any(Path(f"/proc/{c}").exists() and "Z" not in _state(c) for c in children)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "Z"


def test_a_ctrl_c_swallowed_by_a_destructor_still_stops_the_run() -> None:
    """SIGINT landing in a ``__del__`` (SQLAlchemy's, during garbage collection) is printed as
    ignored by Python; the press is remembered and the next check raises it."""
    import gc
    import os
    import signal
    import time

    from gpt_optuna.core import interrupts

    class Finalized:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # the handler runs here, inside the destructor

    interrupts.install()
    try:
        Finalized()
        gc.collect()
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        interrupts.install()  # forget the press for the tests that follow
