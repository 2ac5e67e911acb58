"""gpt_optuna: a global performance tuner for inference engines, built on Optuna.

``tune`` runs a search, ``load`` reads a study as every reader does, ``check`` is the CI gate,
``open_session`` opens an exported ONNX Runtime model as it was tuned (see docs/api.md). Each is
imported on first use, so that ``import gpt_optuna`` (and every worker process) stays light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from gpt_optuna.core.errors import GptOptunaError, UserError

if TYPE_CHECKING:
    from gpt_optuna.api.exporting import Exported
    from gpt_optuna.api.study import Baseline, DeployChoice, TunedStudy, Winner, load
    from gpt_optuna.api.tuning import tune
    from gpt_optuna.backends.onnxruntime.deploy import open_session
    from gpt_optuna.usecases.check import check
    from gpt_optuna.usecases.check_outcome import CheckResult

__version__ = "0.1.0"

_LAZY = {
    "tune": "gpt_optuna.api.tuning",
    "load": "gpt_optuna.api.study",
    "TunedStudy": "gpt_optuna.api.study",
    "Winner": "gpt_optuna.api.study",
    "Baseline": "gpt_optuna.api.study",
    "DeployChoice": "gpt_optuna.api.study",
    "Exported": "gpt_optuna.api.exporting",
    "check": "gpt_optuna.usecases.check",
    "CheckResult": "gpt_optuna.usecases.check_outcome",
    "open_session": "gpt_optuna.backends.onnxruntime.deploy",
}

__all__ = [
    "Baseline",
    "CheckResult",
    "DeployChoice",
    "Exported",
    "GptOptunaError",
    "TunedStudy",
    "UserError",
    "Winner",
    "__version__",
    "check",
    "load",
    "open_session",
    "tune",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'gpt_optuna' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
