"""ONNX Runtime: its backend, the knobs it offers, the session settings a candidate maps to, and
``open_session`` for an exported model."""

from gpt_optuna.backends.onnxruntime.backend import OnnxRuntimeBackend

__all__ = ["OnnxRuntimeBackend"]
