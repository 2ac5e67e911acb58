"""Candidates tried right after the baseline: every speed feature on, and the best configurations
of earlier studies in the same storage (a warm start)."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState

from gpt_optuna.errors import UserError
from gpt_optuna.parallel import runs_on_cpu
from gpt_optuna.space import Candidate, Space, Value

SPEED_VALUES: dict[str, tuple[Value, ...]] = {
    "graph_fusion": ("transformer",),
    "precision": ("fp16",),
    "graph_optimization_level": ("ORT_ENABLE_ALL",),
    "cuda.use_tf32": (True,),
    "cuda.prefer_nhwc": (True,),
    "cuda.enable_cuda_graph": (True,),
    "cuda.fuse_conv_bias": (True,),
    "trt.fp16": (True,),
    "trt.cuda_graph": (True,),
    "flag.TF32": (True,),
    "flag.FP16": (True,),
    "runtime.cuda_graph": (True,),
    "runtime.cuda_graph_strategy": ("WHOLE_GRAPH_CAPTURE",),
}
"""Per knob, the values that make engines fast, in order of preference (each backend's names)."""
WARM_PER_STUDY = 3
"""The best distinct feasible configurations a warm start takes from each earlier study."""


def speed_seed(space: Space) -> Candidate | None:
    """Every speed feature the space searches switched on (reduced precision only off the CPU,
    where it is slow), every other knob at a value the search tries; None where no speed feature
    is searched away from its default."""
    on_cpu = runs_on_cpu(space)
    values: dict[str, Value] = {}
    turned_on = set()
    for knob in space.knobs:
        speed = () if on_cpu and knob.name == "precision" else SPEED_VALUES.get(knob.name, ())
        preferred = next((v for v in speed if v in knob.search_choices), None)
        searched = knob.default if knob.default in knob.search_choices else knob.search_choices[0]
        values[knob.name] = searched if preferred is None else preferred  # a value the search tries
        if preferred is not None and preferred != knob.default:
            turned_on.add(knob.name)
    seed = space.fitted(values)
    return seed if any(seed.get(name) == values[name] for name in turned_on) else None


def warm_start(
    storage: optuna.storages.BaseStorage, spec: str, this: str, backend: str, device: str, space: Space
) -> list[tuple[Candidate, str]]:
    """The best distinct feasible configurations of the studies ``spec`` names (comma-separated),
    or of every other study with this backend measured on this device (``auto``), mapped onto
    ``space`` by knob name; each with ``STUDY:TRIAL`` where it came from."""
    names = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
    if spec.strip() == "auto":
        chosen = [n for n in names if n != this and _same_kind(storage, n, backend, device)]
    else:
        chosen = [n.strip() for n in spec.split(",") if n.strip()]
        unknown = [n for n in chosen if n not in names]
        if unknown:
            raise UserError(f"--warm-start: no study {unknown[0]!r} in this storage; studies there: {', '.join(names)}")
    seeds: list[tuple[Candidate, str]] = []
    seen = {_key(space.default())}
    for name in chosen:
        study = optuna.load_study(study_name=name, storage=storage)
        complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.values]
        taken = 0
        for trial in sorted(complete, key=lambda t: t.values[0]):
            candidate = space.fitted(trial.params)
            if taken < WARM_PER_STUDY and _key(candidate) not in seen:
                seen.add(_key(candidate))
                seeds.append((candidate, f"{name}:{trial.number}"))
                taken += 1
    return seeds


def _same_kind(storage: optuna.storages.BaseStorage, name: str, backend: str, device: str) -> bool:
    """Whether study ``name`` searched this backend and measured its baseline on this device."""
    from gpt_optuna.study import FINGERPRINT_ATTR

    study = optuna.load_study(study_name=name, storage=storage)
    recorded: dict[str, Any] = study.user_attrs.get(FINGERPRINT_ATTR) or {}
    baseline = next((t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("baseline")), None)
    return recorded.get("backend") == backend and baseline is not None and baseline.user_attrs.get("gpu") == device


def _key(candidate: Candidate) -> tuple[tuple[str, Value], ...]:
    return tuple(sorted(candidate.items()))
