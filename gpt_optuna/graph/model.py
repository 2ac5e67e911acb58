"""ONNX model loading and checks, tensor specs and the shape ranges of its inputs."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpt_optuna.core.errors import UserError

Dim = int | str | None


Feeds = dict[str, np.ndarray]


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output: name, numpy dtype and shape (symbolic dims as str or None)."""

    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...]

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) and d > 0 for d in self.shape)

    def describe(self) -> str:
        dims = "x".join(str(d) if d is not None else "?" for d in self.shape)
        return f"{self.name}: {self.dtype.name}[{dims}]"


@dataclass(frozen=True)
class ModelInfo:
    """What the tuner needs to know about a model, without keeping the graph in memory."""

    path: Path
    sha256: str
    opset: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]


def file_sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def every_node(*graphs: Any) -> Iterator[Any]:
    """Every node of the ONNX ``graphs`` and of the graphs their nodes hold (control-flow bodies),
    at any depth."""
    for graph in graphs:
        for node in graph.node:
            yield node
            yield from every_node(*subgraphs(node))


def subgraphs(node: Any) -> Iterator[Any]:
    """The graphs an ONNX node holds in its attributes (control-flow bodies)."""
    for attribute in node.attribute:
        if attribute.HasField("g"):
            yield attribute.g
        yield from attribute.graphs


def _tensor_spec(value_info: object) -> TensorSpec:
    import onnx

    tensor_type = value_info.type.tensor_type  # type: ignore[attr-defined]
    dims = tuple(int(d.dim_value) if d.HasField("dim_value") else d.dim_param or None for d in tensor_type.shape.dim)
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type))
    return TensorSpec(value_info.name, dtype, dims)  # type: ignore[attr-defined]


def load_model_info(path: str | Path) -> ModelInfo:
    """Load and check an ONNX file; raise UserError with one clear line when it is unusable."""
    import onnx

    model_path = Path(path)
    if not model_path.is_file():
        raise UserError(f"model file not found: {model_path}")
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, ValueError, ... on garbage
        raise UserError(f"{model_path} is not a valid ONNX model: {one_line(exc)}") from exc
    try:
        run_checker(model_path)
    except Exception as exc:
        raise UserError(f"{model_path} fails the ONNX checker: {one_line(exc)}") from exc
    initializers = {init.name for init in model.graph.initializer}
    inputs = tuple(_tensor_spec(v) for v in model.graph.input if v.name not in initializers)
    outputs = tuple(_tensor_spec(v) for v in model.graph.output)
    if not outputs:
        raise UserError(f"{model_path} has no graph outputs")
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    return ModelInfo(model_path, file_sha256(model_path), opset, inputs, outputs)


ONNXRUNTIME_DEFAULT_DOMAIN_OPS = frozenset({"SimplifiedLayerNormalization"})
"""Operators ONNX Runtime registers in ONNX's own domain, which ONNX's checker does not know (its
transformer optimizer writes them for RMSNorm)."""


def run_checker(path: Path, full_check: bool = False) -> None:
    """ONNX's checker on the file, but for its complaint that it knows not one of ONNX Runtime's own
    operators of ONNX's domain (such a graph is checked when ONNX Runtime loads it)."""
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=full_check)
    except onnx.checker.ValidationError as exc:
        unknown = (f"No Op registered for {op} with domain_version" for op in ONNXRUNTIME_DEFAULT_DOMAIN_OPS)
        if not any(complaint in str(exc) for complaint in unknown):
            raise


def distinct_dims(model: object) -> bool:
    """Give each dynamic input dimension a name of its own where the graph leaves it unnamed
    (``?``, empty, -1) or repeats a name within one input (``[N, 3, ?, ?]``): TensorRT reads one
    name as one size, so H and W could not differ. A name shared by several inputs (a batch, a
    sequence) means one size and stays. Returns whether anything was renamed (in place)."""
    graph = model.graph  # type: ignore[attr-defined]
    initializers = {i.name for i in graph.initializer}
    taken = {d.dim_param for v in graph.input for d in v.type.tensor_type.shape.dim}
    renamed = False
    for value in graph.input:
        if value.name in initializers:
            continue
        seen: set[str] = set()
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                continue
            if dim.HasField("dim_value") or dim.dim_param in ("", "?") or dim.dim_param in seen:  # no usable name
                dim.dim_param = fresh_name(f"{value.name}_dim{axis}", taken)
                renamed = True
            seen.add(dim.dim_param)
    return renamed


def fresh_name(stem: str, taken: set[str]) -> str:
    """``stem``, else the first of ``stem_2``, ``stem_3``, ... not in ``taken``; added to ``taken``."""
    name, index = stem, 1
    while name in taken:
        index += 1
        name = f"{stem}_{index}"
    taken.add(name)
    return name


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


_DIMS = r"\d+(?:x\d+)*"


_SHAPE_RE = re.compile(rf"^(?P<name>.+?):(?P<first>{_DIMS})(?:/(?P<opt>{_DIMS})/(?P<max>{_DIMS}))?$")


@dataclass(frozen=True)
class ShapeRange:
    """The shapes an engine must accept for one input; validation and timing run at ``opt``."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    @classmethod
    def fixed(cls, shape: tuple[int, ...]) -> ShapeRange:
        return cls(shape, shape, shape)


def _dims(text: str) -> tuple[int, ...]:
    return tuple(int(d) for d in text.split("x"))


def parse_shapes(items: list[str]) -> dict[str, ShapeRange]:
    """Parse ``NAME:1x3x224x224`` or ``NAME:MIN/OPT/MAX`` (e.g. ``x:1x3x224x224/8x3x224x224/16x3x224x224``)."""
    shapes: dict[str, ShapeRange] = {}
    for item in items:
        match = _SHAPE_RE.match(item.strip())
        if not match:
            raise UserError(f"malformed --shape {item!r}: expected NAME:DIMS or NAME:MIN/OPT/MAX, e.g. x:1x3x224x224")
        if match["opt"] is None:
            shapes[match["name"]] = ShapeRange.fixed(_dims(match["first"]))
            continue
        low, opt, high = _dims(match["first"]), _dims(match["opt"]), _dims(match["max"])
        if not len(low) == len(opt) == len(high) or not all(
            a <= b <= c for a, b, c in zip(low, opt, high, strict=True)
        ):
            raise UserError(f"--shape {item!r}: MIN, OPT and MAX must have one rank and MIN <= OPT <= MAX")
        shapes[match["name"]] = ShapeRange(low, opt, high)
    return shapes


def resolve_shapes(info: ModelInfo, shapes: dict[str, ShapeRange]) -> dict[str, ShapeRange]:
    """The shape range of every input. An input without ``--shape`` whose dynamic dimensions are
    all named by inputs that have one (``batch``, ``sequence``) takes their sizes; any other
    dynamic dimension without ``--shape`` is a UserError asking for it."""
    known = {spec.name for spec in info.inputs}
    for name in shapes:
        if name not in known:
            raise UserError(f"--shape names {name!r}, which is not a model input ({', '.join(sorted(known))})")
    named = _named_sizes(info, shapes)
    resolved: dict[str, ShapeRange] = {}
    for spec in info.inputs:
        given = shapes.get(spec.name)
        if given is None and not spec.is_static:
            if not all(isinstance(d, int) and d > 0 or d in named for d in spec.shape):
                raise UserError(_shape_request(spec, named))
            given = ShapeRange(
                *(tuple(d if isinstance(d, int) else named[d][i] for d in spec.shape) for i in range(3))  # type: ignore[index]
            )
        if given is not None:
            for shape in (given.min, given.opt, given.max):
                check_shape(spec, shape, "--shape")
            resolved[spec.name] = given
            continue
        resolved[spec.name] = ShapeRange.fixed(tuple(int(d) for d in spec.shape))  # type: ignore[arg-type]
    return resolved


def _named_sizes(info: ModelInfo, shapes: dict[str, ShapeRange]) -> dict[str, tuple[int, int, int]]:
    """(min, opt, max) of each named dynamic dimension of the inputs given with --shape."""
    sizes: dict[str, tuple[int, int, int]] = {}
    for spec in info.inputs:
        if spec.name in shapes:
            given = shapes[spec.name]
            for axis, dim in enumerate(spec.shape):
                if isinstance(dim, str) and dim and axis < len(given.opt):
                    sizes.setdefault(dim, (given.min[axis], given.opt[axis], given.max[axis]))
    return sizes


def _shape_request(spec: TensorSpec, named: dict[str, tuple[int, int, int]]) -> str:
    """Ask plainly for the sizes of an input's dynamic dimensions (never guessing one)."""
    dynamic = [(axis, d) for axis, d in enumerate(spec.shape) if not (isinstance(d, int) and d > 0)]
    parts = [
        str(d) if isinstance(d, int) and d > 0 else str(named[d][1]) if d in named else f"<{d or f'dim{axis}'}>"
        for axis, d in enumerate(spec.shape)
    ]
    axes = ", ".join(f"{d!r} (axis {axis})" for axis, d in dynamic)
    return (
        f"input {spec.name!r} has dynamic dimensions {axes}: give the sizes you will run it with, "
        f"--shape {spec.name}:{'x'.join(parts)} with each <...> replaced by a size (or MIN/OPT/MAX for a range)"
    )


def check_shape(spec: TensorSpec, shape: tuple[int, ...], source: str) -> None:
    if len(shape) != len(spec.shape):
        raise UserError(f"{source} gives input {spec.name!r} rank {len(shape)}, the model expects {spec.describe()}")
    for axis, (want, got) in enumerate(zip(spec.shape, shape, strict=True)):
        if isinstance(want, int) and want > 0 and want != got:
            raise UserError(
                f"{source} gives input {spec.name!r} size {got} on axis {axis}, the model expects {spec.describe()}"
            )
