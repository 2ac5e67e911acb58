"""Candidates tried right after the baseline: every speed feature on, and the best configurations
of earlier studies in the same storage (a warm start), more of them from studies of models more
like this one."""

from __future__ import annotations

import contextlib
import math
from collections import Counter
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from gpt_optuna.backends.base import Backend
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.space import Candidate, CandidateKey, Space, Value, candidate_key
from gpt_optuna.graph.model import file_sha256
from gpt_optuna.graph.model_profile import ModelProfile, profile_of, similarity
from gpt_optuna.graph.transforms import SPEED_VALUES
from gpt_optuna.study.record import StudyRecord, source_study
from gpt_optuna.study.taxonomy import baseline_trial, measured_latency_ms

WARM_PER_STUDY = 3
"""The best distinct feasible configurations a warm start takes from an earlier study of a model
like this one (fewer from one less alike)."""
UNKNOWN_SIMILARITY = 1 / WARM_PER_STUDY
"""What a study whose model is unknown (made before profiles were recorded, its file gone) counts
as: its best configuration alone."""
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

    def describe(self) -> str:
        """Each earlier study's model similarity and how many candidates it gives."""
        given = Counter(name for c, _ in self.candidates for name in self.offered_by[candidate_key(c)])

        def line(name: str, alike: float | None) -> str:
            n, more = given[name], len(self.reserve.get(name, []))
            return (
                f"{name} ({'similarity unknown' if alike is None else f'model similarity {alike:.2f}'}): "
                f"{n} candidate{'' if n == 1 else 's'}"
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
    ``space`` by knob name. Each study offers its best :data:`WARM_PER_STUDY`: first as many as
    its model's similarity to this one (``profile``) earns, that number times the similarity,
    rounded up (its best alone where the similarity is unknown or nil); the rest only once one of
    those beats this study's baseline (:class:`~gpt_optuna.search.transfer.TransferQueue`). Of the
    first, at most :data:`WARM_LIMIT` are taken: first the ones the most alike studies agree on
    (their similarities summed), then by speedup over their study's baseline."""
    names = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
    if spec.strip() == "auto":
        chosen = [n for n in names if n != this and _same_kind(storage, n, backend, device)]
    else:
        chosen = [n.strip() for n in spec.split(",") if n.strip()]
        unknown = [n for n in chosen if n not in names]
        if unknown:
            raise UserError(f"--warm-start: no study {unknown[0]!r} in this storage; studies there: {', '.join(names)}")
    baseline = candidate_key(space.default())
    offers: dict[CandidateKey, list[tuple[float, float, Candidate, str]]] = {}
    later: dict[str, list[tuple[Candidate, str]]] = {}
    alike: dict[str, float | None] = {}
    for name in chosen:
        study = optuna.load_study(study_name=name, storage=storage)
        alike[name] = study_similarity(study, profile)
        weight = UNKNOWN_SIMILARITY if alike[name] is None else alike[name]
        best = _best_of(study, space, baseline, WARM_PER_STUDY)
        first = max(1, math.ceil(WARM_PER_STUDY * weight - 1e-9))
        for speedup, candidate, source in best[:first]:
            offers.setdefault(candidate_key(candidate), []).append((weight, speedup, candidate, source))
        later[name] = [(candidate, source) for _, candidate, source in best[first:]]
    ranked = sorted(offers.values(), key=lambda found: (-sum(o[0] for o in found), -max(o[1] for o in found)))
    candidates = [max(found, key=lambda o: o[1])[2:] for found in ranked[:WARM_LIMIT]]
    offered_by = {
        key: tuple(source_study(o[3]) for o in offers[key]) for key in map(candidate_key, (c for c, _ in candidates))
    }
    reserve = {name: [(c, s) for c, s in rest if candidate_key(c) not in offered_by] for name, rest in later.items()}
    return WarmStart(candidates, offered_by, {name: rest for name, rest in reserve.items() if rest}, alike)


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


def _best_of(study: optuna.Study, space: Space, skip: CandidateKey, count: int) -> list[tuple[float, Candidate, str]]:
    """A study's best ``count`` distinct feasible configurations mapped onto ``space``
    (other than ``skip``, this space's baseline), each with its speedup over that study's baseline
    (1 where the baseline measured no latency)."""
    trials = study.get_trials(deepcopy=False)
    baseline = baseline_trial(trials)
    base = None if baseline is None else measured_latency_ms(baseline)
    complete = sorted((t for t in trials if t.state is TrialState.COMPLETE and t.values), key=lambda t: t.values[0])
    best: dict[CandidateKey, tuple[float, Candidate, str]] = {}
    for trial in complete:
        candidate = space.fitted(trial.params)
        if len(best) < count and candidate_key(candidate) not in best and candidate_key(candidate) != skip:
            speedup = base / trial.values[0] if base else 1.0
            best[candidate_key(candidate)] = (speedup, candidate, f"{study.study_name}:{trial.number}")
    return list(best.values())


def _same_kind(storage: optuna.storages.BaseStorage, name: str, backend: str, device: str) -> bool:
    """Whether study ``name`` searched this backend and measured its baseline on this device."""
    study = optuna.load_study(study_name=name, storage=storage)
    baseline = baseline_trial(study.get_trials(deepcopy=False))
    same_backend = StudyRecord.read(study).backend == backend
    return same_backend and baseline is not None and baseline.user_attrs.get("gpu") == device
