"""A look at the host before a search: what else is using its cores and its GPUs, and their clocks.

Latencies measured on a busy host are noisy, and settings that depend on free cores (thread
counts, spinning) come out tuned for the load of the moment. Before the search, the CPU time other
processes use is sampled over a tenth of a second (Linux: ``/proc/stat``; elsewhere the load average),
and ``nvidia-smi``, where there is one, names other processes on the GPUs and each GPU's clock
and any thermal or hardware slowdown. What it finds is recorded in the study (user attr
``host_check``) and said as warnings, which every summary repeats.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpt_optuna.core.host import usable_cores

BUSY_SHARE = 0.25
"""Other work on this share of the cores (half a core at least) makes the host busy."""
WINDOW_S = 0.1


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
    gpu_clocks: tuple[str, ...] = ()
    """Each GPU's SM clock against its maximum, and a slowdown it was in (``0: 1980/1980 MHz``)."""

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
        slowed = [clock for clock in self.gpu_clocks if "slowdown" in clock]
        if slowed:
            found.append(
                f"a GPU was slowing its clocks ({'; '.join(slowed)}): latencies measured now will be slower and"
                " noisier than on a cool, idle card"
            )
        if self.gpu_processes:
            found.append(
                f"other processes use the GPU ({', '.join(self.gpu_processes[:4])}"
                f"{', ...' if len(self.gpu_processes) > 4 else ''}): GPU latencies will be noisier"
            )
        return found

    def to_record(self) -> dict[str, Any]:
        return asdict(self) | {"gpu_processes": list(self.gpu_processes), "warnings": self.warnings}


def look() -> HostCheck:
    """Sample the host for :data:`WINDOW_S` seconds, this process idle meanwhile."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return HostCheck(usable_cores(), _busy_cores(), load, tuple(_gpu_processes()), tuple(_gpu_clocks()))


def _cpu_times() -> tuple[float, float] | None:
    """(busy, total) jiffies of all the host's CPUs, from ``/proc/stat``; None where it is not there."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return None
    values = [float(v) for v in fields[:8]]
    idle = values[3] + values[4]  # idle, iowait
    return sum(values) - idle, sum(values)


def _busy_cores() -> float | None:
    before = _cpu_times()
    if before is None:
        return None
    time.sleep(WINDOW_S)
    after = _cpu_times()
    assert after is not None
    total = after[1] - before[1]
    return (after[0] - before[0]) / total * (os.cpu_count() or 1) if total > 0 else 0.0


def _nvidia_smi(query: str) -> list[list[str]]:
    """``nvidia-smi --query-...=FIELDS`` as rows of fields (none without it, or where it fails)."""
    command = ["nvidia-smi", query, "--format=csv,noheader,nounits"]
    try:
        listed = subprocess.run(command, capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [[field.strip() for field in line.split(",")] for line in listed.splitlines() if line.strip()]


def _gpu_processes() -> list[str]:
    """Other compute processes on the GPUs."""
    rows = _nvidia_smi("--query-compute-apps=pid,process_name,used_memory")
    return [
        f"{pid} {Path(name).name} ({memory} MiB)"
        for pid, name, memory in (row for row in rows if len(row) == 3)
        if pid.isdigit() and int(pid) != os.getpid()
    ]


SLOWDOWNS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown")
"""nvidia-smi's clock event reasons that slow a GPU down against the load (idle is not one)."""


def _gpu_clocks() -> list[str]:
    """Each GPU's SM clock against its maximum, with a slowdown it is in."""
    fields = ["index", "clocks.sm", "clocks.max.sm", *(f"clocks_throttle_reasons.{s}" for s in SLOWDOWNS)]
    return gpu_clock_lines(_nvidia_smi(f"--query-gpu={','.join(fields)}"))


def gpu_clock_lines(rows: list[list[str]]) -> list[str]:
    """``nvidia-smi``'s clock rows (index, SM clock, its maximum, then each of :data:`SLOWDOWNS`) in words."""
    lines = []
    for row in rows:
        if len(row) != 3 + len(SLOWDOWNS):
            continue
        active = [name.replace("_", " ") for name, state in zip(SLOWDOWNS, row[3:], strict=True) if state == "Active"]
        lines.append(f"{row[0]}: {row[1]}/{row[2]} MHz" + (f", {', '.join(active)}" if active else ""))
    return lines
