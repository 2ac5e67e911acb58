"""A warm child process that runs jobs with a deadline; a crash or hang becomes data.

A job is any picklable callable. The child runs it and sends back its return value, or the
exception it raised; a UserError is raised again in the parent as it is. While it runs, a job may
tell the parent how far it is (:func:`report_progress`). The parent waits up to
the deadline: end-of-file on the pipe is a crash (with the signal or exit code), no answer in
time is a hang (the child is killed). After any failure the child is replaced, since a crashed
library can leave a process unusable. The child's stdout and stderr go to a log file whose new
lines are attached to each failure.
"""

from __future__ import annotations

import contextlib
import enum
import faulthandler
import math
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, TypeVar

from gpt_optuna.core import interrupts
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.log import VERBOSITY_ENV, to_worker_stderr, verbosity

T = TypeVar("T")

_LOG_TAIL_CHARS = 4000
_MAIN_SWAP = threading.Lock()


@contextlib.contextmanager
def _callers_main_left_out() -> Iterator[None]:
    """While a worker process is spawned, an empty main module in place of the caller's: the worker
    runs only gpt_optuna's code, and a script that calls ``gpt_optuna.tune`` at its top level (no
    ``if __name__ == "__main__":``) would otherwise be run again in every worker."""
    with _MAIN_SWAP:
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            if main is not None:
                sys.modules["__main__"] = main


class FailureKind(enum.StrEnum):
    """How a job ended when it did not return."""

    CRASH = "crash"
    TIMEOUT = "timeout"
    EXCEPTION = "exception"


class JobFailure(Exception):
    """A job that crashed its process, ran past its deadline or raised."""

    def __init__(self, kind: FailureKind, detail: str, log_tail: str = "") -> None:
        super().__init__(kind, detail)
        self.kind = kind
        self.detail = detail
        self.log_tail = log_tail

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.detail}"


def _die_with_parent() -> None:
    """Ask Linux to kill this process when the tuner dies, so a hung job never outlives it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


_to_parent: Connection | None = None
"""The child's end of the pipe, in a worker's child process."""


def report_progress(message: object) -> None:
    """Tell the parent, from a running job, how far it is: a line, or data the job's caller reads
    (picklable; nothing is sent outside a worker's child)."""
    if _to_parent is not None:
        with contextlib.suppress(OSError):  # the parent is gone: nobody to tell
            _to_parent.send(("progress", message))


def _child_main(conn: Connection, log_path: str, env: dict[str, str]) -> None:
    global _to_parent
    _to_parent = conn
    os.environ.update(env)  # before any job imports a GPU library (CUDA_VISIBLE_DEVICES pins a device)
    interrupts.ignore()  # Ctrl-C, SIGTERM and SIGHUP are the parent's to handle
    _die_with_parent()
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    to_worker_stderr()
    faulthandler.enable()
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply: tuple[str, Any] = ("ok", job())
        except UserError as exc:  # bad input (a missing library, say): the user's to fix, not a crash
            reply = ("user_error", str(exc))
        except BaseException as exc:  # the job's failure is data for the parent
            reply = ("raised", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        try:
            conn.send(reply)
        except (BrokenPipeError, OSError):
            return


_POLL_S = 0.2
"""How often a job's wait looks for a Ctrl-C pressed while another thread holds the terminal."""
CLOSE_S = 5.0
"""How long a closed worker's child has to end as a process ends before it is killed."""


class Worker:
    """Runs jobs one at a time in a reusable child process; ``env`` is set in the child before
    its first job (e.g. ``CUDA_VISIBLE_DEVICES`` to pin it to one GPU)."""

    def __init__(self, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        self.env = dict(env or {})
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._context = multiprocessing.get_context("spawn")
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None

    def run(
        self,
        job: Callable[[], T],
        timeout: float | None,
        on_progress: Callable[[Any], None] = lambda _: None,
        quiet_s: float | None = None,
    ) -> T:
        """Run ``job`` in the child and return its value, telling ``on_progress`` what the job
        reports meanwhile; raise JobFailure if it does not return: a crash, or a timeout when it
        runs past ``timeout`` seconds in all or (``quiet_s``) goes that long without a word."""
        if self._process is None or not self._process.is_alive():
            self._start()
        assert self._conn is not None and self._process is not None
        offset = self._log_size()
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self._conn.send(job)
            while True:
                heard = time.monotonic()
                wait_until = deadline if quiet_s is None else min(deadline or math.inf, heard + quiet_s)
                if not self._answered(wait_until):
                    self._kill()
                    quiet = deadline is None or wait_until < deadline
                    detail = f"no word for {quiet_s:g} s" if quiet else f"no answer within {timeout:g} s"
                    raise JobFailure(FailureKind.TIMEOUT, f"{detail}; worker killed", self._log_tail(offset))
                status, payload = self._conn.recv()
                if status != "progress":
                    break
                on_progress(payload)
        except (EOFError, ConnectionError):
            detail = self._exit_reason()
            self._kill()
            raise JobFailure(FailureKind.CRASH, detail, self._log_tail(offset)) from None
        except BaseException:
            self._kill()  # interrupted mid-job: the child's state is unknown
            raise
        if status == "user_error":
            raise UserError(payload)
        if status == "raised":
            self._kill()
            first, _, rest = payload.partition("\n")
            raise JobFailure(FailureKind.EXCEPTION, first, (rest + self._log_tail(offset))[-_LOG_TAIL_CHARS:])
        return payload  # type: ignore[no-any-return]

    def _answered(self, deadline: float | None) -> bool:
        """Wait for the child's message until ``deadline`` (monotonic seconds; None: no end); a
        Ctrl-C (seen by any thread) raises."""
        while True:
            left = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            if left <= 0:
                return bool(self._conn.poll(0))  # type: ignore[union-attr]  # an answer already here counts
            if self._conn.poll(left):  # type: ignore[union-attr]
                return True
            interrupts.check()

    def _start(self) -> None:
        parent_conn, child_conn = self._context.Pipe()
        env = {VERBOSITY_ENV: str(verbosity()), **self.env}  # the child's: ``env``, and this process's verbosity
        process = self._context.Process(target=_child_main, args=(child_conn, str(self.log_path), env), daemon=True)
        # a Ctrl-C before the child has read its start-up data from us would make it print a
        # traceback (EOFError) on the terminal: the interrupt waits until the child has started
        with interrupts.deferred(), _callers_main_left_out():
            process.start()
            child_conn.close()
            self._process, self._conn = process, parent_conn

    def _exit_reason(self) -> str:
        assert self._process is not None
        self._process.join(timeout=5)
        code = self._process.exitcode
        if code is None:
            return "worker closed its pipe"
        if code < 0:
            try:
                return f"worker killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"worker killed by signal {-code}"
        return f"worker exited with code {code}"

    def _kill(self) -> None:
        if self._process is not None:
            if self._process.is_alive():
                self._process.kill()
            self._process.join(timeout=10)
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None

    def _log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def _log_tail(self, offset: int) -> str:
        try:
            with self.log_path.open("rb") as f:
                f.seek(max(offset, self._log_size() - _LOG_TAIL_CHARS))
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def let_go(self) -> None:
        """Close the idle child's pipe: it ends as a process ends, its libraries' exit handlers run
        (a compile worker pool's semaphores are freed: killed, they would be reported leaked at the
        tuner's exit). Several workers let go first end together, then :meth:`close` each."""
        if self._conn is not None:
            self._conn.close()

    def close(self) -> None:
        """Stop the child: let go (:meth:`let_go`), killed where it has not ended within :data:`CLOSE_S`."""
        if self._process is not None and self._conn is not None:
            self.let_go()
            self._process.join(CLOSE_S)
        self._kill()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def gpu_names() -> list[str]:
    """The names of the GPUs this process sees, in CUDA's order; none without CuPy, a driver or a device."""
    try:
        import cupy

        names = [cupy.cuda.runtime.getDeviceProperties(i)["name"] for i in range(cupy.cuda.runtime.getDeviceCount())]
    except Exception:
        return []
    return [name.decode() if isinstance(name, bytes) else str(name) for name in names]
