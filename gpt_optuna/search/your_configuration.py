"""The user's own configuration (``--baseline-config``): measured beside the engine's defaults.

"Faster" means faster than the engine's defaults unless the user says what they run today. Their
configuration, read by the backend in its own terms (:meth:`Backend.baseline_values`), becomes a
candidate of the search space (a value the space did not offer is added for it alone, not
searched), queued right after the baseline as the trial marked :data:`YOURS_ATTR`; the finalists'
re-measurement always includes it, and the verdict states the winner against both.
"""

from __future__ import annotations

from gpt_optuna.backends.base import Backend
from gpt_optuna.core.space import Candidate, Space, Value


def your_candidate(
    space: Space, values: dict[str, Value], backend: Backend, where: str, notes: list[str]
) -> tuple[Space, Candidate]:
    """The space that holds the user's configuration, and the configuration as its candidate;
    settings that take no effect beside the others (a thread count of a pool that is not used)
    are said in ``notes``."""
    fitted = backend.fit_baseline(values, space)
    space = space.including(fitted, where)
    candidate = space.fitted(fitted)
    for name, value in fitted.items():
        if name not in candidate:
            knob = next(k for k in space.knobs if k.name == name)
            when = " and ".join(f"{c.key} is {' or '.join(map(str, c.values))}" for c in knob.conditions)
            notes.append(f"{where}: {name} = {value} takes no effect here: it applies where {when}")
    return space, candidate
