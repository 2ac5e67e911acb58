"""The numpy dtypes of a TensorRT engine's inputs and outputs, and the dtypes CuPy holds them in.

``trt.nptype`` knows no bfloat16 or fp8, and CuPy holds no ``ml_dtypes`` array, so such tensors
live on the device as unsigned integers of their width and are viewed as ``ml_dtypes`` types on
the host. Packed types (int4, fp4, e8m0 scales) have no array type at all: an engine with one at
its inputs or outputs cannot be run here, said in one line.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

ENGINE_DTYPES = {
    "FLOAT": np.dtype(np.float32),
    "HALF": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "INT8": np.dtype(np.int8),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "FP8": np.dtype(ml_dtypes.float8_e4m3fn),
}
"""TensorRT's ``DataType`` member names -> numpy dtypes (``ml_dtypes``' where numpy has none)."""


def engine_dtype(name: str, tensor: str) -> np.dtype:
    """The numpy dtype of an engine tensor of TensorRT type ``name``; a RuntimeError naming the
    tensor where the type is packed (int4, fp4, e8m0) and no array can hold it."""
    if name not in ENGINE_DTYPES:
        raise RuntimeError(
            f"the engine's tensor {tensor!r} is {name.lower()}, a packed type no array holds: keep the model's"
            " inputs and outputs in a wider type"
        )
    return ENGINE_DTYPES[name]


def device_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype CuPy holds ``dtype`` in: itself, or an unsigned integer of its width for the
    ``ml_dtypes`` types (whose numpy kind is ``V``)."""
    return np.dtype(f"u{dtype.itemsize}") if dtype.kind == "V" else dtype


def on_device(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``array`` converted to ``dtype`` and viewed as CuPy holds it (:func:`device_dtype`)."""
    return np.ascontiguousarray(array.astype(dtype, copy=False)).view(device_dtype(dtype))
