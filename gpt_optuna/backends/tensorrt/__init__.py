"""TensorRT and TensorRT-RTX: their backend and the trtexec / Polygraphy command lines of a trial."""

from gpt_optuna.backends.tensorrt.backend import TensorRTBackend, TensorRTRTXBackend

__all__ = ["TensorRTBackend", "TensorRTRTXBackend"]
