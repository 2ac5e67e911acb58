"""A space is a promise: each graph transform it offers is made and loaded before the search.

For every value of the graph-fusion and precision knobs (with the default keep-set), the graph is
made and the engine loads it as the space's default candidate would (:meth:`Backend.check_model`),
in the worker, so that a library crashing on a graph takes only the worker with it. A value that
cannot be made or loaded is dropped with one line saying why; a knob that a graph cannot use
(CUDA graphs over nodes placed on the CPU, say) is offered only where it can be, or not at all.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace

from gpt_optuna.backends import KnobLimit
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.space import Condition, Space, Value
from gpt_optuna.core.words import counted
from gpt_optuna.graph.fusion import FUSION_KNOB
from gpt_optuna.protocol.jobs import CheckJob, EvaluateJob, run_evaluation
from gpt_optuna.protocol.outcome import Outcome, TrialResult
from gpt_optuna.protocol.process import Worker

PRECISION = "precision"
Combo = tuple[Value, Value]
"""(graph fusion, precision)."""


def check_space(
    space: Space,
    template: EvaluateJob,
    worker: Worker,
    timeout: float,
    note: Callable[[str], None],
    say: Callable[[str], None] = lambda _: None,
    deadline: float | None = None,
    always: AbstractSet[Combo] = frozenset(),
) -> tuple[Space, bool]:
    """``space`` without the transform values that cannot be made or loaded, and with the knob
    limits the engine reported; each change is told to ``note`` in one line, each check to ``say``
    as it starts (making a transform can take a while). A check that would end past ``deadline``
    (``time.monotonic()``; by what the last check of its precision took) is not started, but for
    the space's default and the (fusion, precision) graphs in ``always`` (what the configurations a
    search must run need); the values not checked are left out, and the second value says whether
    every value was checked.

    The checks go by the sum of each value's place in its knob (the defaults first; at a tie, the
    unfused graph at other precisions first: on a GPU a reduced precision gains more than any
    fusion, and a precision not checked with some fusion is lost), so that a check cut short keeps
    some of each knob rather than all of one."""
    default = space.default()
    base_fusion, base_precision = default.get(FUSION_KNOB, "none"), default.get(PRECISION, "fp32")
    fusions = tuple(sorted(space.choices(FUSION_KNOB) or (base_fusion,), key=lambda f: f != base_fusion))
    precisions = tuple(sorted(space.choices(PRECISION) or (base_precision,), key=lambda p: p != base_precision))
    started = time.monotonic()
    combos = sorted(
        itertools.product(fusions, precisions),
        key=lambda c: (fusions.index(c[0]) + precisions.index(c[1]), fusions.index(c[0])),
    )
    needed = {(base_fusion, base_precision), *always, *((f, base_precision) for f, _ in always)}
    checks = _Checks(space, template, worker, timeout, say, deadline)
    loaded, failed, unchecked = checks.run(combos, needed, base_precision)
    checked = len(loaded) + len(failed)
    say(f"checked the space: {counted(checked, 'graph variant')} in {time.monotonic() - started:.1f} s")
    if (base_fusion, base_precision) in failed:
        setting = f"graph_fusion {base_fusion}, precision {base_precision}"
        raise UserError(
            f"the backend cannot load the model as the space's default ({setting}) would: "
            f"{failed[(base_fusion, base_precision)]}"
        )
    late = f"not checked within preparation's share of --timeout ({time.monotonic() - started:.0f} s of checks)"
    kept_fusions = tuple(f for f in fusions if (f, base_precision) in loaded)
    space = _kept(space, FUSION_KNOB, fusions, kept_fusions, lambda f: failed.get((f, base_precision), late), note)
    kept_precisions = tuple(p for p in precisions if any((f, p) in loaded for f in kept_fusions))
    space = _kept(space, PRECISION, precisions, kept_precisions, lambda p: failed.get((base_fusion, p), late), note)
    judged = {
        (f, p): ((f, base_precision), next(c for c in ((base_fusion, p), *loaded) if c in loaded and c[1] == p))
        for f, p in itertools.product(kept_fusions, kept_precisions)
        if (f, p) in unchecked
    }
    return _apply_limits(space, loaded, note, judged), not unchecked


@dataclass(frozen=True)
class _Checks:
    """The space's graphs checked one by one in a worker (:class:`CheckJob`), as :func:`check_space` says."""

    space: Space
    template: EvaluateJob
    worker: Worker
    timeout: float
    say: Callable[[str], None]
    deadline: float | None

    def run(
        self, combos: list[Combo], needed: AbstractSet[Combo], base_precision: Value
    ) -> tuple[dict[Combo, list[KnobLimit]], dict[Combo, str], set[Combo]]:
        """The knob limits of each graph loaded, why each other failed, and those not checked."""
        loaded: dict[Combo, list[KnobLimit]] = {}
        failed: dict[Combo, str] = {}
        unchecked: set[Combo] = set()
        took: dict[Value, float] = {}  # by precision: what its last check took (int8's calibrate)
        last_s = 0.0
        for done, (fusion, precision) in enumerate(combos):
            if (fusion, base_precision) in failed or (fusion, base_precision) in unchecked:
                continue  # the fused graph itself cannot be loaded, or was not
            now = time.monotonic()
            late = self.deadline is not None and now + took.get(precision, last_s) > self.deadline
            if late and (fusion, precision) not in needed:
                unchecked.add((fusion, precision))
                continue
            fixed = {FUSION_KNOB: fusion, PRECISION: precision}
            self.say(f"checking the space {done + 1}/{len(combos)}: graph_fusion {fusion}, precision {precision} ...")
            job = replace(self.template, candidate=self.space.default(fixed))
            result = run_evaluation(self.worker, CheckJob(job, self.space), self.timeout)
            took[precision] = last_s = time.monotonic() - now
            if result.outcome is Outcome.OK:
                loaded[(fusion, precision)] = list(result.limits)
            else:
                failed[(fusion, precision)] = _why(result)
        return loaded, failed, unchecked


def _kept(
    space: Space,
    knob: str,
    values: tuple[Value, ...],
    kept: tuple[Value, ...],
    why: Callable[[Value], str],
    note: Callable[[str], None],
) -> Space:
    """``space`` with ``knob`` searched over ``kept`` of its ``values``; each value left out told
    to ``note`` with ``why``."""
    for value in values:
        if value not in kept:
            note(f"{knob} {value} not searched: {why(value)}")
    return space.restricted(knob, kept) if len(kept) < len(values) else space


def _why(result: TrialResult) -> str:
    first = result.detail.strip().splitlines()[0] if result.detail.strip() else result.outcome.value
    return first[:300]


def _apply_limits(
    space: Space,
    loaded: dict[Combo, list[KnobLimit]],
    note: Callable[[str], None],
    judged: dict[Combo, tuple[Combo, Combo]],
) -> Space:
    """Offer each limited knob only with the fusion, precision and settings where it works: one
    condition on them together, since a setting can suit one precision and not another. A pair not
    checked (``judged``: by its fused graph at the default precision and a checked graph at its
    precision) gets the settings both of those allow; a limit by operator types follows the fused
    graph alone, since converting the precision keeps the operators."""
    limited = {limit.knob for limits in loaded.values() for limit in limits}
    for knob in sorted(limited):
        works, settings, reason = _where_it_works(space, knob, loaded, judged)
        parents = [p for p in (FUSION_KNOB, PRECISION) if len(space.choices(p)) > 1] + list(settings)
        allowed = _allowed(works, parents)
        if not allowed:
            note(f"{knob} not searched: {reason}")
            space = space.restricted(knob, (next(k.default for k in space.knobs if k.name == knob),))
        elif parents:  # else it works wherever the space goes
            combos = tuple(c for c in itertools.product(*(space.choices(p) for p in parents)) if c in allowed)
            if len(parents) == 1:
                space = space.with_requirement(knob, Condition(parents[0], tuple(c[0] for c in combos)))
            else:
                space = space.with_requirement(knob, Condition(tuple(parents), combos))
            guess = [f"{f}/{p}" for f, p in judged if works[(f, p)]]
            judged_note = f" ({', '.join(guess)} not checked: judged by the checked graphs)" if guess else ""
            note(f"{knob} offered only with {_where(parents, combos)}{judged_note}; elsewhere {reason}")
    return space


def _allowed(works: dict[Combo, set[tuple[Value, ...]]], parents: list[str]) -> set[tuple[Value, ...]]:
    """The values of ``parents`` (fusion and precision where the space searches them, then the
    limiting knobs) with which the knob works."""
    allowed: set[tuple[Value, ...]] = set()
    for (fusion, precision), tails in works.items():
        head = tuple(v for p, v in ((FUSION_KNOB, fusion), (PRECISION, precision)) if p in parents)
        allowed |= {head + tail for tail in tails}
    return allowed


def _where_it_works(
    space: Space, knob: str, loaded: dict[Combo, list[KnobLimit]], judged: dict[Combo, tuple[Combo, Combo]]
) -> tuple[dict[Combo, set[tuple[Value, ...]]], tuple[str, ...], str]:
    """Per graph (fusion and precision), the settings of ``knob``'s limiting knobs where it works, a
    graph not checked judged as :func:`_apply_limits` says; the limiting knobs, and why it fails elsewhere."""
    by_combo = {combo: next((x for x in limits if x.knob == knob), None) for combo, limits in loaded.items()}
    reason = next(x.reason for x in by_combo.values() if x is not None)
    settings = next((x.allowed.parents for x in by_combo.values() if x is not None and x.allowed), ())
    every_setting = set(itertools.product(*(space.choices(p) for p in settings)))
    works = {combo: _works(limit, every_setting) for combo, limit in by_combo.items()}
    for combo, (fused, converted) in judged.items():
        by_precision = by_combo[converted]
        ignored = by_precision is None or by_precision.by_operators
        works[combo] = works[fused] & (every_setting if ignored else works[converted])
    return works, tuple(settings), reason


def _works(limit: KnobLimit | None, every_setting: set[tuple[Value, ...]]) -> set[tuple[Value, ...]]:
    """The settings where a graph with ``limit`` can use its knob."""
    if limit is None:
        return every_setting
    return set() if limit.allowed is None else set(limit.allowed.combos())


def _where(parents: list[str], combos: tuple[tuple[Value, ...], ...]) -> str:
    """``precision+graph_optimization_level: fp32 at A, B; int8 at A``: the last parent's values per
    combination of the others."""
    grouped: dict[tuple[Value, ...], list[Value]] = {}
    for combo in combos:
        grouped.setdefault(combo[:-1], []).append(combo[-1])
    parts = [f"{'/'.join(map(str, head)) or 'any'} at {', '.join(map(str, tail))}" for head, tail in grouped.items()]
    return f"{'+'.join(parents)}: {'; '.join(parts)}"
