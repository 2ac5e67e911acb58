"""How long each phase of a run took: preparing (inputs, space check), searching, re-measuring."""

from __future__ import annotations

import time


class Phases:
    """A run's clock, split into the phases it went through one after the other."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.spans: dict[str, float] = {}
        self._current: tuple[str, float] | None = None

    def begin(self, name: str) -> None:
        """End the current phase (if any) and start ``name``."""
        self.end()
        self._current = (name, time.monotonic())

    def end(self) -> None:
        """End the current phase (if any)."""
        if self._current is not None:
            name, start = self._current
            self.spans[name] = self.spans.get(name, 0.0) + time.monotonic() - start
            self._current = None

    def line(self) -> str:
        """The run's time so far by phase, e.g. ``took 75.5 s: preparing 12.3 s, searching 50.1 s,
        re-measuring the finalists 13.1 s`` (the current phase ends)."""
        self.end()
        parts = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.spans.items())
        return f"took {time.monotonic() - self.started:.1f} s" + (f": {parts}" if parts else "")
