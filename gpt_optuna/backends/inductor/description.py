"""What the tuner knows of the inductor engine without compiling anything: it takes PyTorch
programs, its fast settings, whether PyTorch is installed, and where its baseline runs."""

from __future__ import annotations

import importlib.util
from types import MappingProxyType

from gpt_optuna.backends.base import EngineDescription
from gpt_optuna.backends.inductor.knobs import CUDAGRAPHS, FREEZING, PRECISION
from gpt_optuna.core.errors import MissingDependencyError
from gpt_optuna.core.space import Space


class InductorDescription(EngineDescription):
    """``torch.compile`` with the Inductor backend, on the PyTorch program a model came from."""

    name = "inductor"
    takes_programs = True
    speed_values = MappingProxyType({CUDAGRAPHS: (True,), FREEZING: (True,), PRECISION: ("fp16", "tf32")})

    def missing_library(self) -> MissingDependencyError | None:
        return None if importlib.util.find_spec("torch") else MissingDependencyError("PyTorch", "inductor")

    def runs_on_cpu(self, space: Space) -> bool:
        return CUDAGRAPHS not in {k.name for k in space.knobs}
