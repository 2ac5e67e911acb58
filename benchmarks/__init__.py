"""The benchmarks: scripts that print the figures in ``docs/``, run from the repository's root as
``python -m benchmarks.NAME`` (``README.md`` here says which script makes which figure)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The repository's root."""


def child_env() -> dict[str, str]:
    """The environment for a child process that runs ``python -m benchmarks.NAME`` from any folder."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
