"""Candidates tried right after the baseline: every speed feature on, and the best configurations
of earlier studies in the same storage (a warm start), more of them from studies of models more
like this one."""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import optuna
from optuna.trial import TrialState

from gpt_optuna.backends.base import EngineDescription
from gpt_optuna.core.engine_spec import ENGINE_KNOB
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.space import Candidate, CandidateKey, Space, Value, candidate_key
from gpt_optuna.core.words import counted
from gpt_optuna.graph.model import file_sha256
from gpt_optuna.graph.model_profile import ModelProfile, profile_of, similarity
from gpt_optuna.graph.transforms import SPEED_VALUES
from gpt_optuna.search.lanes import study_device
from gpt_optuna.study.record import StudyRecord
from gpt_optuna.study.taxonomy import baseline_trial
from gpt_optuna.study.trial_record import TrialRecord

WARM_PER_STUDY = 3
"""The best distinct feasible configurations a warm start takes from an earlier study of a model
like this one (fewer from one less alike)."""
UNKNOWN_SIMILARITY = 1 / WARM_PER_STUDY
"""What a study whose model is unknown (made before profiles were recorded, its file gone) counts
as: its best configuration alone."""
REPLICATION = 0.75
"""How much of a candidate's gain in its own study (over 1x) it must show here, times its model's
similarity, to let its study give more: a study of the same model whose best gained 2x there and
1.2x here misleads; one of an unlike model need only beat the baseline."""
WARM_LIMIT = 6
"""The most warm-start candidates queued in all: with many earlier studies, the configurations
most of them agree on, then the largest speedups over their own baselines."""


def speed_seeds(space: Space, backend: EngineDescription) -> list[tuple[Candidate, str]]:
    """:func:`speed_seed` of each engine the space offers (one, or each value of its ``engine``
    knob), with why it is tried."""
    engine = next((k for k in space.knobs if k.name == ENGINE_KNOB), None)
    if engine is None:
        seed = speed_seed(space, backend)
        return [] if seed is None else [(seed, "every speed feature on")]
    seeds = ((speed_seed(space, backend, {ENGINE_KNOB: name}), name) for name in engine.search_choices)
    return [(seed, f"every speed feature of {name} on") for seed, name in seeds if seed is not None]


def speed_seed(space: Space, backend: EngineDescription, fixed: Mapping[str, Value] | None = None) -> Candidate | None:
    """Every speed feature the space searches switched on (the graph transforms' and the
    backend's :attr:`EngineDescription.speed_values`; reduced precision only off the CPU, where it is slow),
    every other knob at a value the search tries, but those ``fixed``; None where no speed feature
    is searched away from its default."""
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
    seed = space.fitted({**values, **(fixed or {})})
    return seed if any(seed.get(name) == values[name] for name in turned_on) else None


class Best(NamedTuple):
    """One of an earlier study's best configurations, mapped onto this space."""

    speedup: float
    """Over that study's baseline (1 where its baseline measured no latency)."""
    candidate: Candidate
    source: str
    """``STUDY:TRIAL``."""


class Offer(NamedTuple):
    """A configuration an earlier study (``study``: the first of its model's) offers first."""

    weight: float
    """How alike its model is to this one (:data:`UNKNOWN_SIMILARITY` where unknown)."""
    speedup: float
    candidate: Candidate
    source: str
    study: str


@dataclass(frozen=True)
class WarmStart:
    """The warm start's candidates, ranked, each with ``STUDY:TRIAL`` where it gained most; the
    earlier studies that offered each of them; each earlier study's further candidates, tried once
    one of its first beats this study's baseline; and how alike each earlier study's model is to
    this one (None: unknown)."""

    candidates: list[tuple[Candidate, str]]
    offered_by: dict[CandidateKey, tuple[str, ...]]
    reserve: dict[str, list[tuple[Candidate, str]]]
    similarity: dict[str, float | None]
    same_model: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """An earlier study -> the other earlier studies of the same model, which give their
    candidates with it, as one (named by it in ``offered_by``, ``reserve`` and ``similarity``)."""
    expected: dict[str, float] = field(default_factory=dict)
    """``STUDY:TRIAL`` -> the speedup over this study's baseline its candidate must reach here for
    its study to give more (:data:`REPLICATION`)."""
    trust: dict[str, float] = field(default_factory=dict)
    """``STUDY:TRIAL`` -> the similarities of the models whose studies offer its candidate, summed:
    the most trusted is tried first, of those first offered and those held back and given."""

    def describe(self) -> str:
        """Each earlier study's model similarity and how many candidates it gives."""
        given = Counter(name for c, _ in self.candidates for name in self.offered_by[candidate_key(c)])

        def line(name: str, alike: float | None) -> str:
            n, more = given[name], len(self.reserve.get(name, []))
            others = self.same_model.get(name, ())
            also = f"with {', '.join(others)}, the same model; " if others else ""
            return (
                f"{name} ({also}{'similarity unknown' if alike is None else f'model similarity {alike:.2f}'}): "
                + counted(n, "candidate")
                + (f" ({more} more once one beats the baseline)" if more else "")
            )

        return ", ".join(line(name, alike) for name, alike in self.similarity.items())


def warm_start(
    storage: optuna.storages.BaseStorage,
    spec: str,
    this: str,
    backend: str,
    device: str,
    space: Space,
    profile: ModelProfile,
) -> WarmStart:
    """The best distinct feasible configurations of the studies ``spec`` names (comma-separated),
    or of every other study with this backend measured on this device (``auto``), mapped onto
    ``space`` by knob name. Studies of the same model (the same recorded profile: say, other
    batches) count as one, named by the first: their best :data:`WARM_PER_STUDY` together, the
    ones most of them found first. Each such source offers first as many as its model's
    similarity to this one (``profile``) earns, that number times the similarity, rounded up (its
    best alone where the similarity is unknown or nil); the rest only once one of those beats this
    study's baseline by as much of its own gain as the similarity asks (:data:`REPLICATION`;
    :class:`~gpt_optuna.search.transfer.TransferQueue`). Of the first, at most
    :data:`WARM_LIMIT` are taken: first the ones the most alike models agree on (their
    similarities summed), then by speedup over their study's baseline."""
    models = _by_model(storage, _chosen_studies(storage, spec, this, backend, device))
    baseline = candidate_key(space.default())
    offers: dict[CandidateKey, list[Offer]] = {}
    later: dict[str, list[tuple[Candidate, str]]] = {}
    alike: dict[str, float | None] = {}
    expected: dict[str, float] = {}
    trust: dict[str, float] = {}
    for studies in models.values():
        name = studies[0].study_name
        alike[name] = study_similarity(studies[0], profile)
        weight = UNKNOWN_SIMILARITY if alike[name] is None else alike[name]
        best = _best_of_model(studies, space, baseline)
        first = max(1, math.ceil(WARM_PER_STUDY * weight - 1e-9))  # what its similarity earns, rounded up
        for b in best[:first]:
            offers.setdefault(candidate_key(b.candidate), []).append(
                Offer(weight, b.speedup, b.candidate, b.source, name)
            )
        later[name] = [(b.candidate, b.source) for b in best[first:]]
        expected.update({b.source: 1 + REPLICATION * weight * max(0.0, b.speedup - 1) for b in best})
        trust.update({b.source: weight for b in best[first:]})
    gaining_most = _gaining_most(offers)
    candidates = [(offer.candidate, offer.source) for offer, _ in gaining_most]
    trust.update({offer.source: weight for offer, weight in gaining_most})
    offered_by = {key: tuple(o.study for o in offers[key]) for key in map(candidate_key, (c for c, _ in candidates))}
    reserve = _held_back(later, offered_by)
    same_model = {s[0].study_name: tuple(o.study_name for o in s[1:]) for s in models.values() if len(s) > 1}
    return WarmStart(
        candidates,
        offered_by,
        {name: rest for name, rest in reserve.items() if rest},
        alike,
        same_model,
        expected,
        trust,
    )


def _held_back(
    later: dict[str, list[tuple[Candidate, str]]], offered_by: dict[CandidateKey, tuple[str, ...]]
) -> dict[str, list[tuple[Candidate, str]]]:
    """What each source holds back that is not offered first, each added to ``offered_by`` as its
    source's (held back by the first study of its model, maybe found by another)."""
    reserve = {name: [(c, s) for c, s in rest if candidate_key(c) not in offered_by] for name, rest in later.items()}
    for name, rest in reserve.items():
        offered_by.update({candidate_key(c): (name,) for c, _ in rest})
    return reserve


def _gaining_most(offers: dict[CandidateKey, list[Offer]]) -> list[tuple[Offer, float]]:
    """The first :data:`WARM_LIMIT` candidates offered: those the most alike models agree on (their
    similarities summed), then by speedup; each as offered where it gained most, with that sum."""
    ranked = sorted(offers.values(), key=lambda found: (-sum(o.weight for o in found), -max(o.speedup for o in found)))
    return [(max(found, key=lambda o: o.speedup), sum(o.weight for o in found)) for found in ranked[:WARM_LIMIT]]


def _chosen_studies(storage: optuna.storages.BaseStorage, spec: str, this: str, backend: str, device: str) -> list[str]:
    """The studies ``--warm-start`` names (comma-separated; ``auto``: every other one of this backend
    measured on this device); a user error for a name the storage does not hold."""
    names = optuna.get_all_study_names(storage)
    if spec.strip() == "auto":
        return [n for n in names if n != this and _same_kind(storage, n, backend, device)]
    chosen = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in names]
    if unknown:
        raise UserError(f"--warm-start: no study {unknown[0]!r} in this storage; studies there: {', '.join(names)}")
    return chosen


def _by_model(storage: optuna.storages.BaseStorage, chosen: list[str]) -> dict[str, list[optuna.Study]]:
    """The studies ``chosen``, those of one model (the same recorded profile) together, in order."""
    models: dict[str, list[optuna.Study]] = {}
    for name in chosen:
        study = optuna.load_study(study_name=name, storage=storage)
        recorded = StudyRecord.read(study).model_profile
        models.setdefault(name if recorded is None else repr(recorded.to_record()), []).append(study)
    return models


def study_similarity(study: optuna.Study, profile: ModelProfile) -> float | None:
    """How alike the model of ``study`` is to the one ``profile`` describes: from its recorded
    profile, else from its model file where that is still there unchanged; None where neither is."""
    record = StudyRecord.read(study)
    theirs = record.model_profile
    model = record.model
    if theirs is None and model is not None and model.is_file():
        with contextlib.suppress(Exception):  # unreadable, or no longer an ONNX file: unknown
            theirs = profile_of(model) if file_sha256(model) == record.model_sha256 else None
    return None if theirs is None else similarity(profile, theirs)


def _best_of_model(studies: list[optuna.Study], space: Space, skip: CandidateKey) -> list[Best]:
    """The best :data:`WARM_PER_STUDY` of studies of one model (see :func:`_best_of`): first those
    most of them found among their best, then by speedup; each from where it gained most."""
    found: dict[CandidateKey, list[Best]] = {}
    for study in studies:
        for best in _best_of(study, space, skip, WARM_PER_STUDY):
            found.setdefault(candidate_key(best.candidate), []).append(best)
    ranked = sorted(found.values(), key=lambda offers: (-len(offers), -max(o.speedup for o in offers)))
    return [max(offers, key=lambda o: o.speedup) for offers in ranked[:WARM_PER_STUDY]]


def _best_of(study: optuna.Study, space: Space, skip: CandidateKey, count: int) -> list[Best]:
    """A study's best ``count`` distinct feasible configurations mapped onto ``space``
    (other than ``skip``, this space's baseline), each with its speedup over that study's baseline
    (1 where the baseline measured no latency)."""
    trials = study.get_trials(deepcopy=False)
    baseline = baseline_trial(trials)
    base = None if baseline is None else TrialRecord(baseline).latency_ms
    complete = sorted((t for t in trials if t.state is TrialState.COMPLETE and t.values), key=lambda t: t.values[0])
    best: dict[CandidateKey, Best] = {}
    for trial in complete:
        candidate = space.fitted(trial.params)
        if len(best) < count and candidate_key(candidate) not in best and candidate_key(candidate) != skip:
            speedup = base / trial.values[0] if base else 1.0
            best[candidate_key(candidate)] = Best(speedup, candidate, f"{study.study_name}:{trial.number}")
    return list(best.values())


def _same_kind(storage: optuna.storages.BaseStorage, name: str, backend: str, device: str) -> bool:
    """Whether study ``name`` searched this backend and measured its baseline on this device."""
    study = optuna.load_study(study_name=name, storage=storage)
    return StudyRecord.read(study).backend == backend and study_device(study) == device
