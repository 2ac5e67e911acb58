"""The inductor engine: PyTorch's ``torch.compile`` on the program a ``.pt2`` model holds."""

from gpt_optuna.backends.inductor.backend import InductorBackend

__all__ = ["InductorBackend"]
