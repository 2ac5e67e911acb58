"""The worker process: real child processes that really crash, hang and raise."""

import ctypes
import os
import shutil
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from gpt_optuna.protocol.jobs import ReferenceJob
from gpt_optuna.protocol.process import FailureKind, JobFailure, Worker, report_progress


def segfault() -> None:
    print("about to crash", flush=True)
    ctypes.string_at(0)


def hang() -> None:
    time.sleep(3600)


def boom() -> None:
    raise ValueError("bad knob value")


def exit_hard() -> None:
    os._exit(3)


def steps_then_hang(count: int) -> None:
    for step in range(count):
        report_progress(f"step {step + 1}/{count}")
    time.sleep(3600)


_held: list[object] = []


def hold_a_semaphore() -> int:
    """What a compile worker pool does in the child: a multiprocessing semaphore, freed at its exit."""
    import multiprocessing

    _held.append(multiprocessing.get_context("spawn").Semaphore())
    return os.getpid()


CLOSES_A_WORKER = f"""
import sys
from pathlib import Path
sys.path.insert(0, {str(Path(__file__).parent)!r})
from gpt_optuna.protocol.process import Worker
from test_worker import hold_a_semaphore
if __name__ == "__main__":
    with Worker(Path(sys.argv[1])) as worker:
        worker.run(hold_a_semaphore, 60)
"""


def test_a_closed_worker_ends_as_a_process_ends_and_leaks_no_semaphore(tmp_path: Path) -> None:
    script = tmp_path / "close.py"
    script.write_text(CLOSES_A_WORKER)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "w.log")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "leaked semaphore" not in done.stderr, done.stderr


@pytest.mark.slow
def test_a_job_tells_how_far_it_is_while_it_runs_and_the_deadline_still_holds(tmp_path: Path) -> None:
    told: list[str] = []
    with Worker(tmp_path / "w.log") as worker:
        assert worker.run(partial(report_progress, "alone"), timeout=60, on_progress=told.append) is None
        started = time.monotonic()
        with pytest.raises(JobFailure) as info:
            worker.run(partial(steps_then_hang, 3), timeout=3, on_progress=told.append)
        assert info.value.kind is FailureKind.TIMEOUT and time.monotonic() - started < 10
    assert told == ["alone", "step 1/3", "step 2/3", "step 3/3"]
    report_progress("outside a worker: nothing to tell, no error")


def steps_apart(count: int, pause_s: float) -> int:
    for step in range(count):
        time.sleep(pause_s)
        report_progress(step)
    return count


@pytest.mark.slow
def test_a_job_that_keeps_telling_runs_past_its_quiet_limit_and_one_that_goes_quiet_is_stopped(
    tmp_path: Path,
) -> None:
    told: list[object] = []
    with Worker(tmp_path / "w.log") as worker:
        worker.run(os.getpid, timeout=60)
        assert worker.run(partial(steps_apart, 6, 0.5), None, told.append, quiet_s=2.5) == 6  # 3 s in all
        assert told == list(range(6))
        with pytest.raises(JobFailure) as info:
            worker.run(partial(steps_then_hang, 1), None, told.append, quiet_s=1.0)
        assert info.value.kind is FailureKind.TIMEOUT and info.value.detail == "no word for 1 s; worker killed"


def report_and_return() -> str:
    report_progress("halfway")
    return "done"


def test_an_answer_that_came_in_time_counts_though_telling_the_progress_ran_past_the_deadline(tmp_path: Path) -> None:
    with Worker(tmp_path / "w.log") as worker:
        worker.run(os.getpid, timeout=60)  # the child is up
        slow = lambda _: time.sleep(1.5)  # noqa: E731
        assert worker.run(report_and_return, timeout=1.0, on_progress=slow) == "done"


def test_jobs_return_values_and_reuse_the_warm_child(tmp_path: Path) -> None:
    with Worker(tmp_path / "w.log") as worker:
        first = worker.run(os.getpid, timeout=60)
        assert first != os.getpid()
        assert worker.run(os.getpid, timeout=60) == first
        assert worker.run(partial(sum, [1, 2, 3]), timeout=60) == 6


@pytest.mark.parametrize(
    "job, kind, detail",
    [
        (segfault, FailureKind.CRASH, "SIGSEGV"),
        (os.abort, FailureKind.CRASH, "SIGABRT"),
        (exit_hard, FailureKind.CRASH, "exited with code 3"),
        (boom, FailureKind.EXCEPTION, "ValueError: bad knob value"),
    ],
)
def test_failures_become_data_and_the_child_is_replaced(tmp_path: Path, job, kind: FailureKind, detail: str) -> None:
    with Worker(tmp_path / "w.log") as worker:
        before = worker.run(os.getpid, timeout=60)
        with pytest.raises(JobFailure) as info:
            worker.run(job, timeout=60)
        assert info.value.kind is kind
        assert detail in info.value.detail
        after = worker.run(os.getpid, timeout=60)
        assert after != before


def test_crash_carries_the_childs_own_output(tmp_path: Path) -> None:
    with Worker(tmp_path / "w.log") as worker, pytest.raises(JobFailure) as info:
        worker.run(segfault, timeout=60)
    assert "about to crash" in info.value.log_tail
    assert "Segmentation fault" in info.value.log_tail  # faulthandler's report


def test_hang_is_killed_at_the_deadline(tmp_path: Path) -> None:
    with Worker(tmp_path / "w.log") as worker:
        worker.run(os.getpid, timeout=60)
        start = time.monotonic()
        with pytest.raises(JobFailure) as info:
            worker.run(hang, timeout=1.0)
        assert info.value.kind is FailureKind.TIMEOUT
        assert time.monotonic() - start < 15
        assert worker.run(partial(pow, 2, 5), timeout=60) == 32


def missing_library() -> None:
    from gpt_optuna.core.errors import MissingDependencyError

    raise MissingDependencyError("SomeEngine", "someextra")


def test_a_user_error_in_the_child_is_raised_as_such_in_the_parent(tmp_path: Path) -> None:
    from gpt_optuna.core.errors import UserError

    with Worker(tmp_path / "w.log") as worker:
        pid = worker.run(os.getpid, timeout=60)
        with pytest.raises(UserError, match=r"pip install 'gpt-optuna\[someextra\]'"):
            worker.run(missing_library, timeout=60)
        assert worker.run(os.getpid, timeout=60) == pid  # bad input does not cost the warm child


def segfault_on(job: object) -> None:
    """A job's work that crashes its process (as a model can crash ONNX Runtime)."""
    segfault()


class CrashingReference(ReferenceJob):
    RUNS = "test_worker:segfault_on"


def test_a_model_that_crashes_the_reference_run_ends_the_step_with_one_line_not_the_tuner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpt_optuna.core.errors import UserError
    from gpt_optuna.graph.model import load_model_info
    from gpt_optuna.protocol import jobs
    from gpt_optuna.worker.self_test import TINY_MODEL

    info = load_model_info(TINY_MODEL)
    feeds = {spec.name: np.zeros(spec.shape, spec.dtype) for spec in info.inputs}
    assert set(jobs.reference_outputs(info, [feeds])[0]) == {spec.name for spec in info.outputs}  # in a worker
    monkeypatch.setattr(jobs, "ReferenceJob", CrashingReference)
    with pytest.raises(
        UserError, match=r"cannot run .*small_cnn.onnx on CPU for the reference: crash.*its log: "
    ) as err:
        jobs.reference_outputs(info, [feeds])
    log = Path(str(err.value).rpartition("its log: ")[2])
    assert "about to crash" in log.read_text()  # the worker's own output, kept for the user
    shutil.rmtree(log.parent)
