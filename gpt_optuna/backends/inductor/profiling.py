"""Where a compiled program's time goes, kernel by kernel: torch's profiler over a candidate's runs.

On the GPU each generated Triton kernel and each library kernel (cuBLAS, cuDNN) is timed on the
device; on the CPU each generated C++ kernel (compiled with Inductor's kernel profiling on) and each
ATen call is timed on the host. A CUDA graph is not replayed while profiling: its replays run no
kernel the profiler sees.
"""

from __future__ import annotations

from gpt_optuna.backends.base import NodeTime, Runner

GENERATED = ("triton_", "cpp_fused")
"""What the names of the kernels Inductor generates hold (a C++ kernel's: ``graph_0_cpp_fused_...``)."""
RUNTIME = ("TorchDynamo", "Pregraph", "AOTDispatcher", "CompiledFunction", "Torch-Compiled")
"""The name prefixes of torch.compile's own work around the compiled graph (its guards, wrappers)."""


def kind_of(name: str) -> str:
    """What a profiled event is: a kernel Inductor generated, torch.compile's own work, an ATen
    operator, or another kernel (a library's)."""
    if any(mark in name for mark in GENERATED):
        return "generated kernel"
    if name.startswith(RUNTIME):
        return "torch.compile runtime"
    return "aten operator" if name.startswith("aten::") else "kernel"


def profiled_kernels(runner: Runner, runs: int, on_gpu: bool) -> list[NodeTime]:
    """Launch ``runner`` ``runs`` times under torch's profiler: each kernel's time per run (its
    self time over the runs, divided by them), slowest first. On the GPU the device's kernels alone;
    on the CPU the host's events, the profiler's own and the compiled graph's call left out."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_gpu else [])]
    runner.launch()  # outside the profile: a first call's one-off work
    runner.synchronize()
    with profile(activities=activities) as profiled:
        for _ in range(runs):
            runner.launch()
        runner.synchronize()
    found = []
    for event in profiled.key_averages():
        if on_gpu:
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            total_us = event.self_device_time_total
        else:
            if event.key.startswith(("##", "ProfilerStep", "[")):
                continue
            total_us = event.self_cpu_time_total
        if total_us > 0:
            found.append(NodeTime(event.key, kind_of(event.key), "cuda" if on_gpu else "cpu", total_us / 1000 / runs))
    return sorted(found, key=lambda t: -t.median_ms)
