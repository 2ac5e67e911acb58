"""The user's own configuration (``--baseline-config``): measured beside the engine's defaults.

"Faster" means faster than the engine's defaults unless the user says what they run today. Their
configuration, read by the backend in its own terms (:meth:`EngineDescription.baseline_values`), becomes a
candidate of the search space: a value the space did not offer is added for it alone, not
searched, before the space is checked against the model (so that a CPU configuration keeps its
knobs on a GPU host, where only the GPU is searched). It is queued right after the baseline as the
trial marked :data:`YOURS_ATTR`; the finalists' re-measurement always includes it, and the verdict
states the winner against both.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpt_optuna.backends.base import EngineDescription
from gpt_optuna.core.space import Candidate, Space, Value


def holding_yours(space: Space, values: Mapping[str, Value], backend: EngineDescription, where: str) -> Space:
    """The space with every value of the user's configuration among its knob's choices."""
    return space.including(backend.fit_baseline(values, space), where)


def your_candidate(
    space: Space, values: Mapping[str, Value], backend: EngineDescription, where: str, notes: list[str]
) -> Candidate:
    """The user's configuration as a candidate of the (checked) space; settings that take no
    effect beside the others (a thread count of a pool that is not used), or that the model
    cannot use here, are said in ``notes``."""
    fitted = backend.fit_baseline(values, space)
    candidate = space.fitted(fitted)
    knobs = {k.name: k for k in space.knobs}
    for name, value in fitted.items():
        knob = knobs.get(name)
        if knob is None:
            notes.append(f"{where}: {name} = {value} cannot be used with this model here; it is left out")
        elif name not in candidate:
            when = " and ".join(f"{c.key} is {' or '.join(map(str, c.values))}" for c in knob.conditions)
            notes.append(f"{where}: {name} = {value} takes no effect here: it applies where {when}")
        elif candidate[name] != value:
            notes.append(
                f"{where}: {name} = {value} cannot be used with this model here; measured at {candidate[name]}"
            )
    return candidate
