"""A strict stand-in for the TensorRT module of one version, built from tests/data/tensorrt_api.json.

The JSON lists every public name of the real 10.16, 11.4 and RTX 1.7 bindings (read from the
wheels). The fake exposes exactly those names: any other attribute of the module, an enum or an
object raises AttributeError, so code that runs against it touches only names the real version
has. It records every call and property write, for checking the knob -> API mapping. It is not a
TensorRT: nothing is built or run.
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

API = json.loads((Path(__file__).parent / "data" / "tensorrt_api.json").read_text())
VERSIONS = ("10.x", "11.x", "rtx")

ROUTES_JSON = json.dumps(
    {
        "tuner_version": "2.17.83",
        "tuner_options": [
            {"option": "-kgen:tiling", "allowed_values": "-kgen:tiling=[0|1|2]", "default_value": "0", "help": "t"},
            {"option": "-conv_use_long_w", "allowed_values": "-conv_use_long_w=[on|off]", "default_value": "off"},
            {"option": "-cask_fusion:num_tactics", "allowed_values": "=[1|...]", "default_value": "10"},
        ],
    }
)


class Strict:
    """An object of one TensorRT class: only the members the JSON lists for it exist."""

    def __init__(self, fake: FakeTensorRT, cls: str, **state: Any) -> None:
        object.__setattr__(self, "_fake", fake)
        object.__setattr__(self, "_cls", cls)
        object.__setattr__(self, "_state", dict(state))

    def _kind(self, name: str) -> str:
        kinds = self._fake.api["member_kinds"].get(self._cls, {})
        if name not in kinds:
            raise AttributeError(f"{self._cls}.{name} does not exist in TensorRT {self._fake.version}")
        return kinds[name]  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        kind = self._kind(name)
        if kind.startswith("property"):
            self._fake.calls.append((f"{self._cls}.{name}", "get"))
            return self._state[name]
        handler = getattr(self._fake, f"_{self._cls}_{name}", None)

        def method(*args: Any) -> Any:
            self._fake.calls.append((f"{self._cls}.{name}", args))
            return handler(self, *args) if handler else None

        return method

    def __setattr__(self, name: str, value: Any) -> None:
        if self._kind(name) != "property_rw":
            raise AttributeError(f"{self._cls}.{name} is not writable in TensorRT {self._fake.version}")
        self._fake.calls.append((f"{self._cls}.{name}", value))
        if name != "build_route" or self._fake.takes_routes:
            self._state[name] = value

    def __bytes__(self) -> bytes:
        return bytes(self._state["data"])


class FakeTensorRT:
    """The module: enums with the version's members and values, and its classes."""

    def __init__(self, version: str, build_ok: bool = True, takes_routes: bool = True, cache_fits: bool = True) -> None:
        self.version = version
        self.api = API[version]
        self.__version__ = self.api["version"]
        self.calls: list[tuple[str, Any]] = []
        self.build_ok = build_ok
        self.takes_routes = takes_routes
        """Whether a build route written reads back (a refused one reads back as before)."""
        self.cache_fits = cache_fits
        self.loads_plans = True
        """Whether a plan deserializes (False: one of another GPU architecture or version)."""
        """Whether a timing cache file fits this GPU and version (``set_timing_cache`` says)."""
        for name, members in self.api["enum_values"].items():
            setattr(self, name, enum.IntEnum(name, members))
        fake = self

        class ILogger:
            Severity = enum.IntEnum(
                "Severity", {"INTERNAL_ERROR": 0, "ERROR": 1, "WARNING": 2, "INFO": 3, "VERBOSE": 4}
            )

            def __init__(self) -> None:
                fake.calls.append(("ILogger.__init__", ()))

        self.ILogger = ILogger

        class IProfiler:
            """The profiler base class (a trampoline the JSON's introspection does not list; every
            version has it, with ``report_layer_time(layer_name, ms)``)."""

            def report_layer_time(self, layer_name: str, ms: float) -> None:
                raise NotImplementedError

        self.IProfiler = IProfiler
        self.tensor_types: dict[str, str] = {}
        """An engine tensor's ``DataType`` member name, by tensor (FLOAT where not named)."""
        self.host_tensors: set[str] = set()
        """The engine's tensors in host memory (shape tensors)."""
        self.output_shape: tuple[int, ...] = (1, 10)
        """What the context says of the output's shape (-1 where data-dependent)."""
        self.layers = [("node_of_c0 + node_of_r0", 0.25), ("Reformatting CopyNode for Output Tensor 0", 0.01)]
        """The layers an execution reports to a context's profiler: (name, ms)."""

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"module has no {name} in TensorRT {self.version}")

    def nptype(self, dtype: Any) -> type:
        assert "nptype" in self.api["module_functions"]
        return {"FLOAT": np.float32, "HALF": np.float16, "INT32": np.int32, "INT64": np.int64}[dtype.name]

    def _make(self, cls: str, **state: Any) -> Strict:
        assert cls in self.api["member_kinds"], cls
        return Strict(self, cls, **state)

    # classes constructed by the backend
    def Builder(self, logger: Any) -> Strict:  # noqa: N802 - TensorRT's name
        return self._make("Builder")

    def OnnxParser(self, network: Any, logger: Any) -> Strict:  # noqa: N802
        return self._make("OnnxParser", num_errors=0)

    def Runtime(self, logger: Any) -> Strict:  # noqa: N802
        return self._make("Runtime")

    # method behaviour, by class and member name
    def _Builder_create_builder_config(self, obj: Strict) -> Strict:
        sources = 0
        for name in ("EDGE_MASK_CONVOLUTIONS", "JIT_CONVOLUTIONS"):
            sources |= 1 << self.api["enum_values"]["TacticSource"][name]
        state = {
            "builder_optimization_level": 3,
            "tiling_optimization_level": self.TilingOptimizationLevel.NONE,  # type: ignore[attr-defined]
            "l2_limit_for_tiling": 0,
            "max_aux_streams": -1,
            "max_num_tactics": -1,
            "avg_timing_iterations": 1,
            "all_build_routes": ROUTES_JSON if self.version == "11.x" else "",
            "build_route": "",
            "_flags": {"TF32"},
            "_sources": sources,
        }
        return self._make("IBuilderConfig", **state)

    def _Builder_create_network(self, obj: Strict, flags: int) -> Strict:
        return self._make("INetworkDefinition", num_inputs=0, num_outputs=0)  # ITensor is not in the API list

    def _Builder_create_optimization_profile(self, obj: Strict) -> Strict:
        return self._make("IOptimizationProfile")

    def _Builder_build_serialized_network(self, obj: Strict, network: Any, config: Any) -> Strict | None:
        return self._make("IHostMemory", data=b"fake plan") if self.build_ok else None

    def _OnnxParser_parse_from_file(self, obj: Strict, path: str) -> bool:
        return True

    def _IBuilderConfig_get_flag(self, obj: Strict, flag: Any) -> bool:
        return flag.name in obj._state["_flags"]

    def _IBuilderConfig_set_flag(self, obj: Strict, flag: Any) -> None:
        obj._state["_flags"].add(flag.name)

    def _IBuilderConfig_clear_flag(self, obj: Strict, flag: Any) -> None:
        obj._state["_flags"].discard(flag.name)

    def _IBuilderConfig_get_tactic_sources(self, obj: Strict) -> int:
        return obj._state["_sources"]  # type: ignore[no-any-return]

    def _IBuilderConfig_set_tactic_sources(self, obj: Strict, mask: int) -> bool:
        obj._state["_sources"] = mask
        return True

    def _IBuilderConfig_add_optimization_profile(self, obj: Strict, profile: Any) -> int:
        return 0

    def _IBuilderConfig_create_timing_cache(self, obj: Strict, data: bytes) -> Strict | None:
        readable = data.startswith(b"cache:")  # an unreadable file gives an empty cache, as the library's does
        return self._make("ITimingCache", entries=set(data[6:].split(b",")) - {b""} if readable else set())

    def _IBuilderConfig_set_timing_cache(self, obj: Strict, cache: Any, ignore_mismatch: bool) -> bool:
        if cache._state["entries"] and not self.cache_fits:
            return False
        cache._state["entries"].add(f"build{len(self.calls)}".encode())
        return True

    def _ITimingCache_serialize(self, obj: Strict) -> Strict:
        return self._make("IHostMemory", data=b"cache:" + b",".join(sorted(obj._state["entries"])))

    def _ITimingCache_combine(self, obj: Strict, other: Any, ignore_mismatch: bool) -> bool:
        obj._state["entries"] |= other._state["entries"]
        return True

    def _Runtime_deserialize_cuda_engine(self, obj: Strict, plan: bytes) -> Strict | None:
        if not self.loads_plans:
            return None
        return self._make("ICudaEngine", num_io_tensors=2, device_memory_size_v2=4096, num_aux_streams=2)

    def _ICudaEngine_get_tensor_name(self, obj: Strict, index: int) -> str:
        return ("x", "y")[index]

    def _ICudaEngine_get_tensor_mode(self, obj: Strict, name: str) -> Any:
        return self.TensorIOMode.INPUT if name == "x" else self.TensorIOMode.OUTPUT  # type: ignore[attr-defined]

    def _ICudaEngine_get_tensor_dtype(self, obj: Strict, name: str) -> Any:
        return getattr(self.DataType, self.tensor_types.get(name, "FLOAT"))  # type: ignore[attr-defined]

    def _ICudaEngine_get_tensor_location(self, obj: Strict, name: str) -> Any:
        return self.TensorLocation.HOST if name in self.host_tensors else self.TensorLocation.DEVICE  # type: ignore[attr-defined]

    def _ICudaEngine_create_runtime_config(self, obj: Strict) -> Strict:
        return self._make("IRuntimeConfig")

    def _ICudaEngine_create_execution_context(self, obj: Strict, *args: Any) -> Strict:
        return self._make("IExecutionContext")

    def _IExecutionContext_set_input_shape(self, obj: Strict, name: str, shape: Any) -> bool:
        return True

    def _IExecutionContext_get_tensor_shape(self, obj: Strict, name: str) -> tuple[int, ...]:
        return self.output_shape

    def _IExecutionContext_set_tensor_address(self, obj: Strict, name: str, ptr: int) -> bool:
        return True

    def _IExecutionContext_execute_async_v3(self, obj: Strict, stream: int) -> bool:
        profiler = obj._state.get("profiler")
        for name, ms in self.layers if profiler is not None else ():
            profiler.report_layer_time(name, ms)
        return True

    def written(self, name: str) -> list[Any]:
        """Values passed to a property write or method ``Class.member``, in order (reads left out)."""
        return [value for called, value in self.calls if called == name and value != "get"]


class FakeCuPy:
    """Just enough of CuPy's surface for the runner's bookkeeping, with host memory behind it."""

    class _Array:
        def __init__(self, array: np.ndarray) -> None:
            self.array = array
            self.data = SimpleNamespace(ptr=array.ctypes.data)
            self.shape, self.dtype = array.shape, array.dtype

        def get(self, stream: Any = None) -> np.ndarray:
            return self.array.copy()

        def set(self, array: np.ndarray, stream: Any = None) -> None:
            assert array.dtype == self.array.dtype and array.shape == self.array.shape
            self.array[...] = array

    class _Stream:
        count = 0

        def __init__(self, non_blocking: bool = False) -> None:
            FakeCuPy._Stream.count += 1
            self.ptr = 1000 + FakeCuPy._Stream.count
            self.captures = 0

        def __enter__(self) -> FakeCuPy._Stream:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def synchronize(self) -> None:
            pass

        def begin_capture(self) -> None:
            self.captures += 1

        def end_capture(self) -> SimpleNamespace:
            if FakeCuPy.capture_breaks:
                raise RuntimeError("cudaErrorStreamCaptureInvalidated: operation failed due to a previous error")
            return SimpleNamespace(launch=lambda stream: None)

    capture_breaks = False
    """Whether ending a capture raises, as CuPy does where the work captured broke it."""

    def __init__(self) -> None:
        self.cuda = SimpleNamespace(Stream=FakeCuPy._Stream, runtime=SimpleNamespace(getLastError=lambda: 0))
        self.pool_frees = 0
        self.get_default_memory_pool = lambda: SimpleNamespace(free_all_blocks=self._free_all_blocks)

    def _free_all_blocks(self) -> None:
        self.pool_frees += 1

    def asarray(self, array: np.ndarray) -> FakeCuPy._Array:
        return FakeCuPy._Array(np.ascontiguousarray(array))

    def empty(self, shape: tuple[int, ...], dtype: Any) -> FakeCuPy._Array:
        return FakeCuPy._Array(np.zeros(shape, dtype))
