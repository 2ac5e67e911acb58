"""Precision as ONNX graph transforms: fp16 with parts kept in fp32, int8 and fp8 Q/DQ.

TensorRT 11 networks are strongly typed, so precision is a property of the graph: fp16 comes from
converting it (:mod:`gpt_optuna.graph.reduced_float`, with op types and nodes kept in fp32), int8 and
fp8 from explicit QuantizeLinear/DequantizeLinear pairs (ONNX Runtime's quantization tool, QDQ
format, symmetric, int8 weights per channel by :mod:`gpt_optuna.graph.weight_quantization`), each on a
graph raised to the opset it needs. The same graphs run on ONNX Runtime, so every transform here
is exercised for real on the CPU.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpt_optuna.core.space import Candidate, Condition, Knob
from gpt_optuna.graph import opset, reduced_float
from gpt_optuna.graph.model import Feeds, run_checker
from gpt_optuna.graph.model_cache import produce
from gpt_optuna.graph.tensor_types import onnx_module
from gpt_optuna.graph.weight_quantization import per_channel_weights

PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8")


REDUCED_FLOAT = ("fp16", "bf16")


QUANTIZED = ("int8", "fp8")


KEEP_NODE_COUNTS = (0, 1, 2, 4, 8)


KEEP_GROUPS: dict[str, tuple[str, ...]] = {
    "normalization": (
        "LayerNormalization",
        "BatchNormalization",
        "InstanceNormalization",
        "GroupNormalization",
        "LpNormalization",
        "SimplifiedLayerNormalization",
        "SkipLayerNormalization",
    ),
    "softmax": ("Softmax", "LogSoftmax"),
    "reduction": ("ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceL2", "ReduceProd", "ReduceLogSumExp"),
    "exp_pow": ("Exp", "Pow", "Log", "Sqrt", "Reciprocal", "Erf"),
    "resize": ("Resize", "Upsample"),
}
"""Op types that matter numerically, in groups the search keeps in fp32 together."""


QUANTIZE_GROUPS: dict[str, tuple[str, ...]] = {"conv": ("Conv", "ConvTranspose"), "matmul": ("MatMul", "Gemm")}
"""Op types TensorRT runs in int8/fp8 when their inputs carry Q/DQ pairs."""


@dataclass(frozen=True)
class PrecisionSetting:
    """The precision part of a candidate."""

    precision: str = "fp32"
    keep_groups: tuple[str, ...] = ()
    keep_nodes: int = 0
    keep_io: bool = True
    quantize: tuple[str, ...] = ()

    @classmethod
    def from_candidate(cls, candidate: Candidate) -> PrecisionSetting:
        precision = str(candidate.get("precision", "fp32"))
        groups = tuple(
            sorted(k.removeprefix("keep_fp32.") for k, v in candidate.items() if k.startswith("keep_fp32.") and v)
        )
        quantize = str(candidate.get("quantize_ops", ""))
        return cls(
            precision=precision,
            keep_groups=groups if precision in REDUCED_FLOAT else (),
            keep_nodes=int(candidate.get("keep_fp32_nodes", 0)) if precision in REDUCED_FLOAT else 0,
            keep_io=bool(candidate.get("keep_io_fp32", True)),
            quantize=tuple(quantize.split("+")) if precision in QUANTIZED and quantize else (),
        )


def is_precision_knob(name: str) -> bool:
    """Whether a knob of :func:`precision_knobs` (they decide the transformed graph)."""
    return name in ("precision", "keep_fp32_nodes", "keep_io_fp32", "quantize_ops") or name.startswith("keep_fp32.")


def precision_knobs(model: Any, precisions: tuple[str, ...], allow_io_change: bool = False) -> list[Knob]:
    """The precision dimension and what stays in fp32 or gets quantized, for this model; inputs
    and outputs stay fp32 unless ``allow_io_change`` (then ``keep_io_fp32`` is searched)."""
    offered = tuple(p for p in PRECISIONS if p in precisions)
    if offered == ("fp32",):
        return []
    knobs = [Knob("precision", offered, "fp32", "numeric precision of the graph")]
    present = {node.op_type for node in model.graph.node}
    reduced = tuple(p for p in offered if p in REDUCED_FLOAT)
    if reduced:
        knobs += _reduced_float_knobs(model, present, Condition("precision", reduced), allow_io_change)
    quantized = tuple(p for p in offered if p in QUANTIZED)
    groups = [g for g, ops in QUANTIZE_GROUPS.items() if present & set(ops)]
    if quantized and groups:
        subsets = ["+".join(c) for n in range(len(groups), 0, -1) for c in itertools.combinations(groups, n)]
        knobs.append(
            Knob("quantize_ops", tuple(subsets), subsets[0], "op types with Q/DQ", Condition("precision", quantized))
        )
    elif quantized:
        knobs[0] = Knob("precision", tuple(p for p in offered if p not in QUANTIZED), "fp32", knobs[0].help)
    return knobs


def _reduced_float_knobs(model: Any, present: set[str], on: Condition, allow_io_change: bool) -> list[Knob]:
    """What stays in fp32 at a reduced float precision (``on``): op groups the model has, its most
    sensitive nodes, and (``allow_io_change``) its inputs and outputs."""
    knobs = [
        Knob(f"keep_fp32.{group}", (False, True), False, f"keep {group} ops in fp32", on)
        for group, ops in KEEP_GROUPS.items()
        if present & set(ops)
    ]
    nodes = len(candidate_nodes(model))
    counts = tuple(c for c in KEEP_NODE_COUNTS if c <= nodes)
    knobs.append(Knob("keep_fp32_nodes", counts, 0, "keep the N most sensitive nodes in fp32", on))
    if allow_io_change:
        knobs.append(Knob("keep_io_fp32", (True, False), True, "keep model inputs/outputs fp32", on))
    return knobs


def named(model: Any) -> Any:
    """A copy in which every node has a unique name (the converter blocks nodes by name)."""
    onnx = onnx_module()
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    seen: set[str] = set()
    for index, node in enumerate(copy.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{index}"
        seen.add(node.name)
    return copy


DATA_MOVEMENT = frozenset(
    {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Concat", "Slice", "Split", "Gather", "GatherND"}
    | {"Identity", "Cast", "Shape", "Expand", "Tile", "Pad", "Constant", "ConstantOfShape"}
)


def candidate_nodes(model: Any, floats: set[str] | None = None) -> list[Any]:
    """Nodes that compute on floating-point values: those a reduced precision would change."""
    floats = float_tensors(model) if floats is None else floats
    return [
        node
        for node in model.graph.node
        if node.op_type not in DATA_MOVEMENT and any(name in floats for name in node.output)
    ]


def setting_key(base_sha256: str, setting: PrecisionSetting, ranking: list[str], calibration_sha256: str) -> str:
    """A content key: the same model, setting, kept nodes and calibration give the same file."""
    payload = {
        "model": base_sha256,
        "setting": asdict(setting),
        "nodes": ranking[: setting.keep_nodes],
        "calibration": calibration_sha256 if setting.precision in QUANTIZED else "",
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


def reduced(model: Any, setting: PrecisionSetting, ranking: list[str]) -> Any:
    """The fp16 or bf16 graph of a setting: the kept op groups and most sensitive nodes stay fp32.

    bf16 first raises the graph to the opset at which Conv and most compute operators admit it;
    the weights are rounded to bf16 from their fp32 values.
    """
    ops = [op for group in setting.keep_groups for op in KEEP_GROUPS[group]]
    model = named(model)
    target = reduced_float.FLOAT16
    if setting.precision == "bf16":
        model, target = opset.at_least(model, opset.BFLOAT16_CONV), reduced_float.BFLOAT16
    return reduced_float.convert(model, target, ops, ranking[: setting.keep_nodes], setting.keep_io)


class _Reader:
    """ONNX Runtime's calibration reader protocol over a list of feeds."""

    def __init__(self, samples: list[Feeds]) -> None:
        self._it: Iterator[Feeds] = iter(samples)

    def get_next(self) -> Feeds | None:
        return next(self._it, None)

    def rewind(self) -> None:  # some calibrators read twice
        pass


def ready_for_quantization(base_path: Path, base_sha256: str, precision: str, cache_dir: Path) -> Path:
    """The graph the quantizer reads: every node named, the opset raised to what its Q/DQ pairs need,
    constants folded into initializers (so that weights stored compressed and expanded in the graph
    get per-channel Q/DQ as weights); made once per model and opset, for every int8/fp8 setting."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    needed = opset.PER_CHANNEL_QDQ if precision == "int8" else opset.FLOAT8_QDQ
    out = cache_dir / f"qdq-ready-opset{needed}-{base_sha256[:24]}.onnx"

    def make(tmp: Path) -> None:
        named_path = tmp.with_name(tmp.stem + ".named.onnx")
        onnx_module().save(opset.at_least(named(onnx_module().load(str(base_path))), needed), str(named_path))
        try:
            quant_pre_process(str(named_path), str(tmp), skip_symbolic_shape=True)
        finally:
            named_path.unlink(missing_ok=True)

    return produce(out, make)


def quantize(ready_path: Path, out_path: Path, setting: PrecisionSetting, samples: list[Feeds]) -> None:
    """Symmetric Q/DQ on the inputs of the chosen op types, placed as TensorRT fuses them, in the
    graph :func:`ready_for_quantization` made.

    TensorRT's explicit-quantization guidance: Q/DQ on the inputs of weighted operations
    (convolution, matrix product), none on their outputs; zero points of 0 (symmetric); signed
    int8; weights per channel; biases unquantized. ONNX Runtime's QDQ format with these options
    produces that.
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    int8 = setting.precision == "int8"
    qtype = QuantType.QInt8 if int8 else QuantType.QFLOAT8E4M3FN
    ops = [op for group in setting.quantize for op in QUANTIZE_GROUPS[group]]
    quantize_static(
        str(ready_path),
        str(out_path),
        _Reader(samples),
        quant_format=QuantFormat.QDQ,
        op_types_to_quantize=ops,
        per_channel=False,  # int8 weights are made per channel below, much faster
        activation_type=qtype,
        weight_type=qtype,
        calibrate_method=CalibrationMethod.MinMax if int8 else CalibrationMethod.Distribution,
        # biases stay in float: TensorRT fuses them into the quantized kernel itself
        # (the int32-bias scale adjustment is skipped too: it fails on biases of rank > 1)
        extra_options={
            "ActivationSymmetric": True,
            "WeightSymmetric": True,
            "QuantizeBias": False,
            "QDQDisableWeightAdjustForInt32Bias": True,
        },
    )
    if int8:
        quantized = onnx_module().load(str(out_path))
        if per_channel_weights(quantized, onnx_module().load(str(ready_path)), tuple(ops)):
            onnx_module().save(quantized, str(out_path))


def transform(
    base_path: Path,
    base_sha256: str,
    setting: PrecisionSetting,
    ranking: list[str],
    samples: list[Feeds],
    calibration_sha256: str,
    cache_dir: Path,
) -> Path:
    """The transformed model's path, produced once per distinct setting and cached by content key
    (a failure too: it is raised again as TransformFailed)."""
    if setting.precision == "fp32":
        return base_path
    out = cache_dir / f"{setting.precision}-{setting_key(base_sha256, setting, ranking, calibration_sha256)}.onnx"
    onnx = onnx_module()

    def make(tmp: Path) -> None:
        if setting.precision in REDUCED_FLOAT:
            onnx.save(reduced(onnx.load(str(base_path)), setting, ranking), str(tmp))
        else:
            quantize(
                ready_for_quantization(base_path, base_sha256, setting.precision, cache_dir), tmp, setting, samples
            )
        run_checker(tmp, full_check=True)

    return produce(out, make)


def float_tensors(model: Any) -> set[str]:
    """Names of every fp32 tensor in the graph (activations, inputs, outputs, initializers)."""
    return {name for name, kind in reduced_float.tensor_types(model).items() if kind == reduced_float.FLOAT}
