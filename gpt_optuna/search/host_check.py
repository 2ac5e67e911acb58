"""A look at the host before a search: what else is using its cores and its GPUs.

Latencies measured on a busy host are noisy, and settings that depend on free cores (thread
counts, spinning) come out tuned for the load of the moment. Before the search, the CPU time other
processes use is sampled over a short window (Linux: ``/proc/stat``; elsewhere the load average),
and ``nvidia-smi``, where there is one, names other processes on the GPUs. What it finds is
recorded in the study (:data:`HOST_ATTR`) and said as warnings, which every summary repeats.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

BUSY_SHARE = 0.25
"""Other work on this share of the cores (half a core at least) makes the host busy."""
WINDOW_S = 0.25


@dataclass(frozen=True)
class HostCheck:
    """The host as the search found it."""

    cores: int
    """The cores this process may run on."""
    busy_cores: float | None
    """Cores' worth of CPU time other processes used during the look (None where it cannot be read)."""
    load: float | None
    """The one-minute load average (None where there is none)."""
    gpu_processes: tuple[str, ...]
    """Other processes on the GPUs, ``PID NAME (MiB)``."""

    @property
    def warnings(self) -> list[str]:
        found = []
        busy = self.busy_cores if self.busy_cores is not None else self.load
        if busy is not None and busy >= max(0.5, BUSY_SHARE * self.cores):
            what = "other work used" if self.busy_cores is not None else "the load average was"
            found.append(
                f"the host was busy before the search: {what} {busy:.1f} of its {self.cores} cores; latencies"
                " will be noisier, and settings that depend on free cores (threads, spinning) are tuned for that load"
            )
        if self.gpu_processes:
            found.append(
                f"other processes use the GPU ({', '.join(self.gpu_processes[:4])}"
                f"{', ...' if len(self.gpu_processes) > 4 else ''}): GPU latencies will be noisier"
            )
        return found

    def to_record(self) -> dict[str, Any]:
        return asdict(self) | {"gpu_processes": list(self.gpu_processes), "warnings": self.warnings}


def look(window_s: float = WINDOW_S) -> HostCheck:
    """Sample the host for ``window_s`` seconds, this process idle meanwhile."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return HostCheck(cores, _busy_cores(window_s), load, tuple(_gpu_processes()))


def _cpu_times() -> tuple[float, float] | None:
    """(busy, total) jiffies of all the host's CPUs, from ``/proc/stat``; None where it is not there."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    values = [float(v) for v in fields[:8]]
    idle = values[3] + values[4]  # idle, iowait
    return sum(values) - idle, sum(values)


def _busy_cores(window_s: float) -> float | None:
    before = _cpu_times()
    if before is None:
        return None
    time.sleep(window_s)
    after = _cpu_times()
    assert after is not None
    total = after[1] - before[1]
    return (after[0] - before[0]) / total * (os.cpu_count() or 1) if total > 0 else 0.0


def _gpu_processes() -> list[str]:
    """Other compute processes ``nvidia-smi`` lists (none without it, or where it fails)."""
    if shutil.which("nvidia-smi") is None:
        return []
    query = ["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader,nounits"]
    try:
        listed = subprocess.run(query, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in listed.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit() and int(parts[0]) != os.getpid():
            found.append(f"{parts[0]} {Path(parts[1]).name} ({parts[2]} MiB)")
    return found
