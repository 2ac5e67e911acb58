"""A Ctrl-C that is never lost.

Python raises KeyboardInterrupt in whatever code runs when SIGINT arrives; if that is a garbage
collector callback or a ``__del__`` (SQLAlchemy's, say), the exception is printed as "ignored"
and the run goes on as if nothing happened. The handler here also remembers the press, and the
long phases call :func:`check` between steps, so that the interrupt takes effect there.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_pressed = threading.Event()


def _handler(signum: int, frame: object) -> None:
    _pressed.set()
    raise KeyboardInterrupt


def install() -> None:
    """Handle SIGINT as above (in the main thread only: signals are delivered there), forgetting
    any earlier press."""
    _pressed.clear()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _handler)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold a Ctrl-C pressed inside the block until the block is over (in the main thread; other
    threads get no signals), then raise it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda number, _: held.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        _pressed.set()
        raise KeyboardInterrupt


def check() -> None:
    """Raise KeyboardInterrupt if Ctrl-C was pressed, even if its first raise was swallowed."""
    if _pressed.is_set():
        raise KeyboardInterrupt
