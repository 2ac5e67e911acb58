"""A Ctrl-C (or SIGTERM, SIGHUP) that is never lost.

Python raises KeyboardInterrupt in whatever code runs when SIGINT arrives; if that is a garbage
collector callback or a ``__del__`` (SQLAlchemy's, say), the exception is printed as "ignored"
and the run goes on as if nothing happened. The handler here also remembers the signal, and the
long phases call :func:`check` between steps, so that the interrupt takes effect there. SIGTERM
(what schedulers and ``timeout`` send) and SIGHUP (a closed terminal) stop a run the same way:
the summary is printed, the running trials are marked and queued again, and the exit code is
128 plus the signal's number (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import NoReturn

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that stop a run as Ctrl-C does."""
_pressed = threading.Event()
_received = [signal.SIGINT]


def _handler(signum: int, frame: object) -> None:
    _received[0] = signal.Signals(signum)
    _pressed.set()
    raise KeyboardInterrupt


def install() -> None:
    """Handle the :data:`SIGNALS` as above (in the main thread only: signals are delivered there),
    forgetting any earlier one."""
    _pressed.clear()
    _received[0] = signal.SIGINT
    if threading.current_thread() is threading.main_thread():
        for number in SIGNALS:
            signal.signal(number, _handler)


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """:func:`install` for the block only (a signal the caller ignores, as ``nohup`` ignores SIGHUP,
    stays ignored): the handlers found before it (a Python session's, a notebook kernel's) are given
    back after it, and a signal it handled is forgotten, so that the caller's next step starts afresh."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.getsignal(number) for number in SIGNALS}
    install()
    for number, handler in previous.items():
        if handler is signal.SIG_IGN:
            signal.signal(number, signal.SIG_IGN)
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        _pressed.clear()


def stop_caller(what: str, then: str = "") -> NoReturn:
    """Once a step run under :func:`handled` has stopped for a signal, stop its caller as the signal
    would have: Ctrl-C as KeyboardInterrupt (saying ``what`` was stopped, and ``then`` what to do);
    SIGTERM or SIGHUP sent again, to the caller's own handler."""
    received = signal.Signals(_received[0])
    if received != signal.SIGINT:
        signal.raise_signal(received)
    raise KeyboardInterrupt(f"{what} was stopped by {cause()}" + (f"; {then}" if then else ""))


def ignore() -> None:
    """Ignore the :data:`SIGNALS` (a worker process: stopping is its parent's to handle)."""
    for number in SIGNALS:
        signal.signal(number, signal.SIG_IGN)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold a signal received inside the block until the block is over (in the main thread; other
    threads get no signals), then raise it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {number: signal.signal(number, lambda n, _: held.append(n)) for number in SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    if held:
        _received[0] = signal.Signals(held[0])
        _pressed.set()
        raise KeyboardInterrupt


def check() -> None:
    """Raise KeyboardInterrupt if a stopping signal came, even if its first raise was swallowed."""
    if _pressed.is_set():
        raise KeyboardInterrupt


def cause() -> str:
    """What stopped the run, in words: ``Ctrl-C``, ``SIGTERM`` or ``SIGHUP``."""
    return "Ctrl-C" if _received[0] == signal.SIGINT else signal.Signals(_received[0]).name


def stopped() -> str:
    """A trial's ``interrupted`` reason: ``stopped by the user`` (Ctrl-C), or by the signal's name."""
    return "stopped by the user" if _received[0] == signal.SIGINT else f"stopped by {cause()}"


def exit_code() -> int:
    """The exit code of a run stopped by a signal: 128 plus its number."""
    return 128 + int(_received[0])
