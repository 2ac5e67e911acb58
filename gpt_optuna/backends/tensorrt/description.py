"""What the tuner knows of TensorRT and TensorRT-RTX without building anything: the module that
holds the library, whether it is installed and a GPU is seen, its fast settings, and how it reads
a user's trtexec command line."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType, ModuleType

from gpt_optuna.backends.base import EngineDescription, nvidia_gpu_seen
from gpt_optuna.backends.tensorrt import trtexec_flags
from gpt_optuna.backends.tensorrt.commands import trtexec_major
from gpt_optuna.core.errors import MissingDependencyError
from gpt_optuna.core.space import Space, Value


def _installed(name: str) -> bool:
    """Whether module ``name`` is a library: type stubs alone (``tensorrt-stubs`` installs a folder
    of ``.pyi`` files that imports as an empty namespace package) are not."""
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.origin not in (None, "namespace") and not spec.origin.endswith(".pyi")


class TensorRTDescription(EngineDescription):
    """TensorRT 10.x and 11.x (module ``tensorrt``, else ``tensorrt_bindings``)."""

    name = "tensorrt"
    modules: tuple[str, ...] = ("tensorrt", "tensorrt_bindings")
    library = "TensorRT"
    extra = "tensorrt"
    reports_device_memory = True
    speed_values = MappingProxyType(
        {
            "flag.TF32": (True,),
            "flag.FP16": (True,),
            "runtime.cuda_graph": (True,),
            "runtime.cuda_graph_strategy": ("WHOLE_GRAPH_CAPTURE",),
        }
    )
    _trt: ModuleType | None = None

    def cannot_run_here(self) -> str | None:
        return None if nvidia_gpu_seen() else "it runs on an NVIDIA GPU and none is seen here"

    def missing_library(self) -> MissingDependencyError | None:
        found = any(_installed(name) for name in self.modules)
        return None if found else MissingDependencyError(self.library, self.extra)

    @property
    def trt(self) -> ModuleType:
        """The library's module, imported on first use."""
        if self._trt is None:
            for name in filter(_installed, self.modules):
                with contextlib.suppress(ImportError):
                    self._trt = importlib.import_module(name)
                    break
            else:
                raise MissingDependencyError(self.library, self.extra)
        return self._trt

    def versions(self) -> dict[str, str]:
        """The library's version by its first module's name."""
        return {self.modules[0]: str(getattr(self.trt, "__version__", "unknown"))}

    def baseline_values(self, path: Path) -> dict[str, Value]:
        flags = trtexec_flags.read_flags(path)
        return trtexec_flags.knob_values(flags, f"--baseline-config {path.name}", trtexec_major(self.versions()))

    def fit_baseline(self, values: Mapping[str, Value], space: Space) -> dict[str, Value]:
        return trtexec_flags.fitted_to(dict(values), {k.name for k in space.knobs})


class TensorRTRTXDescription(TensorRTDescription):
    """TensorRT-RTX (module ``tensorrt_rtx``)."""

    name = "tensorrt-rtx"
    modules = ("tensorrt_rtx",)
    library = "TensorRT-RTX"
    extra = "rtx"
