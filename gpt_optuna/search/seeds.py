"""Candidates tried right after the baseline: every speed feature on, and the best configurations
of earlier studies in the same storage (a warm start)."""

from __future__ import annotations

import optuna
from optuna.trial import TrialState

from gpt_optuna.backends.base import Backend
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.space import Candidate, CandidateKey, Space, Value, candidate_key
from gpt_optuna.graph.transforms import SPEED_VALUES
from gpt_optuna.study.record import StudyRecord
from gpt_optuna.study.taxonomy import baseline_trial, measured_latency_ms

WARM_PER_STUDY = 3
"""The best distinct feasible configurations a warm start takes from each earlier study."""
WARM_LIMIT = 6
"""The most warm-start candidates queued in all: with many earlier studies, the configurations
most of them agree on, then the largest speedups over their own baselines."""


def speed_seed(space: Space, backend: Backend) -> Candidate | None:
    """Every speed feature the space searches switched on (the graph transforms' and the
    backend's :attr:`Backend.speed_values`; reduced precision only off the CPU, where it is slow),
    every other knob at a value the search tries; None where no speed feature is searched away
    from its default."""
    on_cpu = backend.runs_on_cpu(space)
    speed_values = {**SPEED_VALUES, **backend.speed_values}
    values: dict[str, Value] = {}
    turned_on = set()
    for knob in space.knobs:
        speed = () if on_cpu and knob.name == "precision" else speed_values.get(knob.name, ())
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
    ``space`` by knob name; each with ``STUDY:TRIAL`` where it came from. Each study offers its
    best :data:`WARM_PER_STUDY`; of those, at most :data:`WARM_LIMIT` are taken, first the ones
    most studies offer, then by speedup over their study's baseline."""
    names = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
    if spec.strip() == "auto":
        chosen = [n for n in names if n != this and _same_kind(storage, n, backend, device)]
    else:
        chosen = [n.strip() for n in spec.split(",") if n.strip()]
        unknown = [n for n in chosen if n not in names]
        if unknown:
            raise UserError(f"--warm-start: no study {unknown[0]!r} in this storage; studies there: {', '.join(names)}")
    baseline = candidate_key(space.default())
    offers: dict[CandidateKey, list[tuple[float, Candidate, str]]] = {}
    for name in chosen:
        for speedup, candidate, source in _best_of(
            optuna.load_study(study_name=name, storage=storage), space, baseline
        ):
            offers.setdefault(candidate_key(candidate), []).append((speedup, candidate, source))
    ranked = sorted(offers.values(), key=lambda found: (-len(found), -max(speedup for speedup, *_ in found)))
    return [max(found, key=lambda offer: offer[0])[1:] for found in ranked[:WARM_LIMIT]]


def _best_of(study: optuna.Study, space: Space, skip: CandidateKey) -> list[tuple[float, Candidate, str]]:
    """A study's best :data:`WARM_PER_STUDY` distinct feasible configurations mapped onto ``space``
    (other than ``skip``, this space's baseline), each with its speedup over that study's baseline
    (1 where the baseline measured no latency)."""
    trials = study.get_trials(deepcopy=False)
    baseline = baseline_trial(trials)
    base = None if baseline is None else measured_latency_ms(baseline)
    complete = sorted((t for t in trials if t.state is TrialState.COMPLETE and t.values), key=lambda t: t.values[0])
    best: dict[CandidateKey, tuple[float, Candidate, str]] = {}
    for trial in complete:
        candidate = space.fitted(trial.params)
        if len(best) < WARM_PER_STUDY and candidate_key(candidate) not in best and candidate_key(candidate) != skip:
            speedup = base / trial.values[0] if base else 1.0
            best[candidate_key(candidate)] = (speedup, candidate, f"{study.study_name}:{trial.number}")
    return list(best.values())


def _same_kind(storage: optuna.storages.BaseStorage, name: str, backend: str, device: str) -> bool:
    """Whether study ``name`` searched this backend and measured its baseline on this device."""
    study = optuna.load_study(study_name=name, storage=storage)
    baseline = baseline_trial(study.get_trials(deepcopy=False))
    same_backend = StudyRecord.read(study).backend == backend
    return same_backend and baseline is not None and baseline.user_attrs.get("gpu") == device
