"""An exported inductor trial compiled and timed in a fresh process, as a service loads it.

``export`` runs this once per inductor export, in a process of its own (:data:`CHILD`):
the program compiled with the trial's settings, warm from the study's Inductor caches (the kernels
and autotuning choices the trial made), Inductor's caches of that compile saved beside the export
for the service's compile, and its latency timed by the tuner's protocol, so that the side file
says what a service gets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpt_optuna.core.errors import UserError

FRESH_TIMEOUT_S = 1800.0
CHILD = "gpt_optuna.worker.inductor_export"
"""The module the fresh process runs."""


def compiled_fresh(program: Path, settings: dict[str, Any], inputs: Path, caches: Path, out: Path) -> dict[str, Any]:
    """Compile ``program`` with ``settings`` in a fresh process (Inductor's caches: ``caches``), save
    the caches of that compile at ``out`` and time it on the first sample of ``inputs``: the child's
    ``compile_s`` and ``latency`` (:class:`~gpt_optuna.protocol.timing.LatencyStats` as a dict)."""
    command = [sys.executable, "-m", CHILD, str(program), json.dumps(settings), str(inputs), str(out)]
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(caches)}
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=FRESH_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise UserError(f"compiling the exported program did not end within {FRESH_TIMEOUT_S:.0f} s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        errors = [line for line in done.stderr.strip().splitlines() if line.strip()]
        raise UserError(f"the exported program did not compile in a fresh process: {(errors or ['no output'])[-1]}")
    return json.loads(lines[-1])
