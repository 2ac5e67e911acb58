"""Where an inference's GPU time goes: every kernel it launches, timed by CUPTI through
torch.profiler (which sees ONNX Runtime's kernels as well as PyTorch's, CUDA-graph replays
included), summed per kernel and per kind of work."""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("copy", ("memcpy", "memset")),
    ("attention", ("fmha", "flash", "attention", "sdpa", "softmax")),
    ("convolution", ("conv", "fprop", "cudnn", "implicit", "winograd", "depthwise")),
    ("gemm", ("gemm", "nvjet", "cutlass", "cublas", "matmul", "xmma", "mm_", "addmm")),
    ("normalization", ("norm",)),
    ("layout", ("transpose", "nchw", "nhwc", "permute", "reorder", "cast", "convert")),
    ("triton fused", ("triton",)),
    ("reduction", ("reduce", "pool", "mean")),
)
"""Kinds of kernels, by words in their names, the first match wins; the rest are elementwise."""


def kind(name: str) -> str:
    lower = name.lower()
    return next((title for title, words in KINDS if any(w in lower for w in words)), "elementwise/other")


@dataclass
class KernelProfile:
    """Per run: GPU milliseconds per kernel name, and how many kernels were launched."""

    per_kernel_ms: dict[str, float]
    launches: float

    @property
    def total_ms(self) -> float:
        return sum(self.per_kernel_ms.values())

    def per_kind_ms(self) -> dict[str, float]:
        kinds: collections.Counter[str] = collections.Counter()
        for name, ms in self.per_kernel_ms.items():
            kinds[kind(name)] += ms
        return dict(kinds.most_common())

    def lines(self, title: str, top: int = 8) -> list[str]:
        lines = [f"  {title}: {self.total_ms:.4f} ms of kernels per run, {self.launches:.0f} launches"]
        lines += [f"    {ms:8.4f} ms  {kind_name}" for kind_name, ms in self.per_kind_ms().items()]
        ranked = sorted(self.per_kernel_ms.items(), key=lambda item: -item[1])[:top]
        lines += [f"      {ms:8.4f} ms  {name[:100]}" for name, ms in ranked]
        return lines


def kernel_profile(run: Callable[[], object], runs: int = 50, warmup: int = 20) -> KernelProfile:
    """Profile ``runs`` calls of ``run`` (after ``warmup``); GPU time per kernel, per run."""
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            run()
        torch.cuda.synchronize()
    per_kernel: collections.Counter[str] = collections.Counter()
    launches = 0
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[event.name] += event.time_range.elapsed_us() / 1000 / runs
            launches += 1
    return KernelProfile(dict(per_kernel), launches / runs)
