"""gpt_optuna: a global performance tuner for inference engines, built on Optuna."""

from gpt_optuna.backends.onnxruntime.deploy import open_session
from gpt_optuna.core.errors import GptOptunaError, UserError

__version__ = "0.1.0"

__all__ = ["GptOptunaError", "UserError", "__version__", "open_session"]
