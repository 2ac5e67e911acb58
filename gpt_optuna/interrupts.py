"""A Ctrl-C that is never lost.

Python raises KeyboardInterrupt in whatever code runs when SIGINT arrives; if that is a garbage
collector callback or a ``__del__`` (SQLAlchemy's, say), the exception is printed as "ignored"
and the run goes on as if nothing happened. The handler here also remembers the press, and the
long phases call :func:`check` between steps, so that the interrupt takes effect there.
"""

from __future__ import annotations

import signal
import threading

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


def remember() -> None:
    """Record a press that was caught some other way (a deferred one)."""
    _pressed.set()


def check() -> None:
    """Raise KeyboardInterrupt if Ctrl-C was pressed, even if its first raise was swallowed."""
    if _pressed.is_set():
        raise KeyboardInterrupt
