"""gpt_optuna: a global performance tuner for inference engines, built on Optuna."""

from gpt_optuna.errors import GptOptunaError, UserError
from gpt_optuna.session import open_session

__version__ = "0.1.0"

__all__ = ["GptOptunaError", "UserError", "__version__", "open_session"]
