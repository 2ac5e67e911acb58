"""An exported inductor program compiled and timed in a fresh process (the child of
:func:`gpt_optuna.backends.inductor.fresh.compiled_fresh`): ``python -m gpt_optuna.worker.inductor_export
PROGRAM SETTINGS_JSON INPUTS_NPZ OUT`` prints its compile time and latency as one JSON line."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from gpt_optuna.graph.model import one_line


def compile_and_time(program_path: Path, settings: dict[str, Any], inputs: Path, out: Path) -> dict[str, Any]:
    """The program compiled with ``settings`` on the first sample of ``inputs``, Inductor's caches of
    that compile written to ``out``; the compile's seconds and the latency by the tuner's protocol."""
    import dataclasses

    import numpy as np
    import torch

    from gpt_optuna.backends.inductor.backend import InductorRunner
    from gpt_optuna.backends.inductor.deploy import CompiledProgram
    from gpt_optuna.core.measure_settings import MeasureSettings
    from gpt_optuna.worker.measure import measure

    with np.load(inputs) as stacked:
        feeds = {name: stacked[name][0] for name in stacked.files}
    started = time.perf_counter()
    compiled = CompiledProgram(torch.export.load(str(program_path)), settings)
    runner = InductorRunner(compiled, feeds, {})
    runner.launch()  # the compile
    runner.synchronize()
    compile_s = time.perf_counter() - started
    saved = torch.compiler.save_cache_artifacts()
    out.write_bytes(saved[0] if saved else b"")
    stats = measure(runner, MeasureSettings())
    return {"compile_s": compile_s, "latency": dataclasses.asdict(stats)}


if __name__ == "__main__":
    try:
        found = compile_and_time(Path(sys.argv[1]), json.loads(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
    except Exception as exc:  # one line for the parent, the traceback above it
        import traceback

        traceback.print_exc()
        sys.exit(f"{type(exc).__name__}: {one_line(exc)}")
    sys.stdout.write(json.dumps(found) + "\n")
