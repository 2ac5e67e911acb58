"""The protocol every engine follows: a description the tuner reads (:class:`EngineDescription`),
and the backend a worker runs to discover a space, build a candidate and open a runner.

Backends know nothing of Optuna. The worker process calls them in this order for each
candidate::

    built = backend.build(model, candidate, paths, shapes)    # may raise BuildError
    with backend.open(built, feeds, reference) as runner: # buffers bound to inputs and outputs
        outputs = runner.infer()                          # host copies, for the accuracy check
        runner.launch(); runner.synchronize()             # what the timer measures

``space`` runs in a worker process too (probing a provider can crash), so everything a
backend returns must be picklable plain data.
"""

from __future__ import annotations

import abc
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from gpt_optuna.backends.side_file import SideFile
from gpt_optuna.core.engine_facts import BuildFacts, RunFacts
from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.core.errors import GptOptunaError, MissingDependencyError, UserError
from gpt_optuna.core.space import Candidate, Condition, Knob, Space, Value
from gpt_optuna.graph.model import Feeds, ModelInfo, ShapeRange


def import_cupy() -> Any:
    """CuPy, or a UserError naming the extra that installs it."""
    try:
        import cupy
    except ImportError as exc:
        raise MissingDependencyError("CuPy (needed to run engines on the GPU)", "gpu") from exc
    return cupy


def nvidia_gpu_seen() -> bool:
    """Whether this machine shows an NVIDIA GPU, found without loading CUDA: the driver's devices
    (Linux), else ``nvidia-smi`` on the path."""
    devices = Path("/proc/driver/nvidia/gpus")
    if devices.is_dir():
        return any(devices.iterdir())
    return shutil.which("nvidia-smi") is not None


def where_offered(candidate: Mapping[str, Value], values: Mapping[str, Value]) -> Candidate:
    """``candidate`` with each knob of ``values`` it has set to that value (one it lacks stays absent)."""
    return {**candidate, **{knob: value for knob, value in values.items() if knob in candidate}}


class BuildError(GptOptunaError):
    """The engine could not be built for this candidate; ``log`` holds the engine's own words."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


CANNOT_RUN = "the engine cannot run it"
"""How a refusal at inference (:meth:`Backend.refused_run`) is told: in a trial's failure, and
where checking the space keeps a knob out."""


@dataclass(frozen=True)
class ExportedTrial:
    """A trial as ``export`` writes it: the ONNX model it ran, the file written (``out``: the engine
    or the model), its params over the space's defaults, the study's input shapes, the files the
    study's builds share, its sample inputs and the library versions the study ran (module -> version)."""

    model: Path
    out: Path
    params: Mapping[str, Any]
    defaults: Mapping[str, Any]
    shapes: Mapping[str, Any]
    paths: EnginePaths
    inputs: Path
    """The study's sample inputs (``inputs.npz``)."""
    versions: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TritonFields:
    """What Triton's model configuration says of an exported trial besides its tensors."""

    on_gpu: bool
    lines: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    """The trial's settings Triton has no field for."""


@dataclass(frozen=True)
class Deployment:
    """How an engine's trial runs outside the tuner: what its export's side file adds
    (``side_file``), the files an engine export writes beside it (``beside``: suffixes), what it
    ships where that is not the engine, and how Triton serves it (its platform line, model file and
    configuration fields)."""

    side_file: Callable[[ExportedTrial], dict[str, Any]]
    triton_platform: str | None = None
    """None: Triton has no backend that serves the engine's exports (nor model file or fields)."""
    triton_model_file: str = ""
    triton_fields: Callable[[SideFile], TritonFields] | None = None
    beside: tuple[str, ...] = ()
    shipped: Callable[[Path], Path] | None = None
    """The file an export ships, from the ONNX model the trial ran, where it is not the engine
    itself (inductor: the PyTorch program); the engine then goes beside it (``engine_beside``)."""
    engine_beside: str = ""
    suffix: str = ""
    """The exported file's extension ('': ``.plan`` for an engine, ``.onnx`` for a model)."""


@dataclass
class Built:
    """A built candidate: the engine object (process-local), build time and facts to record."""

    engine: Any
    build_s: float
    facts: BuildFacts = BuildFacts()


@dataclass(frozen=True)
class NodeTime:
    """One operator's (ONNX Runtime) or layer's (TensorRT) median time over profiled runs."""

    name: str
    op_type: str
    provider: str
    median_ms: float


@dataclass(frozen=True)
class Profiling:
    """What :meth:`Backend.layer_times` profiles: ``candidate`` built as a trial builds it, run
    ``runs`` times on ``feeds``. ``saved``: the engine the trial kept, which an engine that loads its
    builds (:meth:`Backend.load`) profiles instead of building again; the others make their
    profiling session anew."""

    model: ModelInfo
    candidate: Candidate
    paths: EnginePaths
    shapes: dict[str, ShapeRange]
    feeds: Feeds
    outputs: Feeds
    runs: int
    saved: bytes | None = None


@dataclass(frozen=True)
class KnobLimit:
    """A knob a graph cannot use everywhere: ``allowed`` says where it can (None: nowhere), and
    ``reason`` why not elsewhere; ``by_operators`` where the graph's operator types decide it (the
    same graph in another precision keeps them)."""

    knob: str
    allowed: Condition | None
    reason: str
    by_operators: bool = False


class Runner(abc.ABC):
    """An engine bound to input and output buffers; a context manager.

    ``stream`` is the CuPy stream the runner enqueues work on, or None for a host runner, in
    which case ``launch`` returns only when the inference is done.
    """

    stream: Any = None
    facts: RunFacts = RunFacts()
    """Facts learnt when the engine was opened or run (e.g. its device memory), recorded with the trial."""

    @abc.abstractmethod
    def infer(self) -> dict[str, np.ndarray]:
        """Run once and return every output as a host array."""

    @abc.abstractmethod
    def launch(self) -> None:
        """Enqueue one inference on ``stream`` (or run it, for a host runner)."""

    @abc.abstractmethod
    def set_inputs(self, feeds: Feeds) -> None:
        """Bind another sample of the same shapes and dtypes (copied into the bound buffers)."""

    def synchronize(self) -> None:
        """Wait until everything launched has finished."""
        if self.stream is not None:
            self.stream.synchronize()

    def close(self) -> None:  # noqa: B027 - an optional hook, not abstract
        """Release buffers and sessions."""

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EngineDescription:
    """What the tuner and export know of an engine without running it, in the tuner's process: its
    name, what it needs here, what it measures and how it reads a user's configuration. Registered
    once per engine (:data:`~gpt_optuna.backends.registry.ENGINES`, with the engine a worker runs
    and its deployment); a backend of one's own describes itself (:class:`Backend` is one)."""

    name: str = ""

    speed_values: ClassVar[Mapping[str, tuple[Value, ...]]] = {}
    """Per knob of the engine, the values that make it fast, in order of preference: the seeded
    candidate tried right after the baseline turns them on."""

    takes_programs: bool = False
    """Its models are PyTorch programs (``.pt2``), not ONNX graphs of their own."""

    reports_device_memory: bool = False
    """Its runners report the engine's device memory (``device_memory_bytes``), for ``--objectives memory``."""

    def runs_on_cpu(self, space: Space) -> bool:
        """Whether the space's baseline runs on the CPU: its latencies are the CPU's, whatever the GPU."""
        return False

    def missing_library(self) -> MissingDependencyError | None:
        """The error naming the extra to install where the engine's library is not installed here,
        found without importing it (a run is refused before it writes anything); None if it is."""
        return None

    def cannot_run_here(self) -> str | None:
        """Why the engine cannot run on this machine though its library is installed (it needs a
        GPU and none is seen, say), found cheaply; None where it can."""
        return None

    def baseline_values(self, path: Path) -> dict[str, Value]:
        """The knobs (name -> value) of a user's own configuration file (``--baseline-config``), in
        the engine's own terms; a UserError where the file says what no knob sets."""
        raise UserError(f"backend {self.name!r} does not read --baseline-config files")

    def fit_baseline(self, values: Mapping[str, Value], space: Space) -> dict[str, Value]:
        """:meth:`baseline_values` for ``space``, where the engine offers a setting by another knob."""
        return dict(values)


class Backend(EngineDescription, abc.ABC):
    """The engine a worker runs: it discovers the space, builds and loads candidates, opens runners
    and profiles them. Only worker processes make one."""

    @abc.abstractmethod
    def space(self, model: ModelInfo, shapes: dict[str, ShapeRange]) -> Space:
        """The knobs worth searching for this model with the library installed here."""

    @abc.abstractmethod
    def build(self, model: ModelInfo, candidate: Candidate, paths: EnginePaths, shapes: dict[str, ShapeRange]) -> Built:
        """Build (compile, create a session for) one candidate; raise BuildError on failure.

        ``paths`` are the files the study's builds share (its model cache, caches); ``shapes`` the
        range of input shapes the engine must accept.
        """

    @abc.abstractmethod
    def open(self, built: Built, feeds: Feeds, outputs: Feeds) -> Runner:
        """Bind a built candidate to the inputs and return a runner.

        ``outputs`` are the reference outputs in the candidate model's output dtypes: their shapes
        and dtypes size the output buffers.
        """

    def refused_run(self, error: Exception) -> str | None:
        """Why the engine cannot run this candidate, where ``error`` (raised by an inference of a
        built candidate) says so: a refusal that comes again on every try, like a build error.
        None for anything else (out of memory, a fault of ours), which stays an exception."""
        return None

    def check_model(
        self, model: ModelInfo, space: Space, candidate: Candidate, paths: EnginePaths, shapes: dict[str, ShapeRange]
    ) -> list[KnobLimit]:
        """Load a graph (the original or a transformed one) as ``candidate``, the space's default
        for it, would, cheaply; raise BuildError if the engine cannot take it at all. Return the
        knobs of ``space`` this graph cannot use everywhere.

        This default builds the candidate; backends with a cheaper check override it.
        """
        self.build(model, candidate, paths, shapes)
        return []

    def layer_times(self, profiling: Profiling) -> list[NodeTime]:
        """Build the candidate and run it under the engine's own profiler (:class:`Profiling`):
        each operator's or layer's median time, slowest first."""
        raise UserError(f"backend {self.name!r} has no profiler gpt-optuna reads")

    def execution_providers(self) -> list[str]:
        """The execution providers of the engine that really start here, for an engine that has them."""
        return []

    def versions(self) -> dict[str, str]:
        """Library versions to record with the study."""
        return {}

    weak_typing_knobs: frozenset[str] = frozenset()
    """Knobs that set precision outside the graph; offered only while the graph stays fp32."""

    def with_graph_knobs(self, graph: list[Knob], knobs: list[Knob]) -> Space:
        """The space of the model's graph transforms' knobs (``graph``: fusion, precision) and the
        engine's own ``knobs``, ordered so that each condition refers to knobs before it."""
        return Space(graph + knobs)

    def precisions(self) -> tuple[str, ...]:
        """The graph precisions (fp32, fp16, bf16, int8, fp8) this engine can run."""
        return ("fp32",)

    def fusions(self) -> tuple[str, ...]:
        """Graph fusions (see :mod:`gpt_optuna.graph.fusion`) whose operators this engine runs."""
        return ()

    def serialize(self, built: Built) -> bytes | None:
        """The engine as a file to keep, for backends that produce one."""
        return None

    def load(self, model: ModelInfo, candidate: Candidate, engine: bytes) -> Built | None:
        """The engine :meth:`serialize` kept for ``candidate``, ready to :meth:`open` as it was
        built (None where the kept file is no engine to run as it is: the candidate is built again)."""
        return None
