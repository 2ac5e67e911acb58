"""The one timing protocol of the peer benchmark, for every row alike (PyTorch, torch.compile and
ONNX Runtime through the tuner's runner): CUDA events on the stream the work runs on.

- per call: an event pair around one call, then a synchronize, as the tuner measures each launch
  (the host's work of each call counts); the median and the 90th percentile over the calls;
- throughput: the calls launched back to back between one event pair, one synchronize at the end
  (host work overlaps the GPU's); the time per call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class Timing:
    """One row's figures in milliseconds."""

    median_ms: float
    p90_ms: float
    throughput_ms: float


def time_calls(run: Callable[[], Any], stream: torch.cuda.Stream, calls: int = 300, warmup: int = 30) -> Timing:
    """Time ``run`` (which launches its work on ``stream``) by both halves of the protocol."""
    for _ in range(warmup):
        run()
    stream.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    per_call = []
    for _ in range(calls):
        start.record(stream)
        run()
        end.record(stream)
        end.synchronize()
        per_call.append(start.elapsed_time(end))
    start.record(stream)
    for _ in range(calls):
        run()
    end.record(stream)
    end.synchronize()
    median, p90 = np.percentile(per_call, [50, 90])
    return Timing(float(median), float(p90), start.elapsed_time(end) / calls)
