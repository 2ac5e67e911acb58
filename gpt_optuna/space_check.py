"""A space is a promise: each graph transform it offers is made and loaded before the search.

For every value of the graph-fusion and precision knobs (with the default keep-set), the graph is
made and the engine loads it as the space's default candidate would (:meth:`Backend.check_model`),
in the worker, so that a library crashing on a graph takes only the worker with it. A value that
cannot be made or loaded is dropped with one line saying why; a knob that a graph cannot use
(CUDA graphs over nodes placed on the CPU, say) is offered only where it can be, or not at all.
Each fused graph is checked first; the precisions of the graphs that loaded are then made side by
side in helper workers where the machine has the cores and memory for them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from gpt_optuna.backends import KnobLimit
from gpt_optuna.errors import UserError
from gpt_optuna.evaluate import CheckJob, EvaluateJob, Outcome, TrialResult, run_evaluation
from gpt_optuna.fusion import FUSION_KNOB
from gpt_optuna.space import Condition, Space, Value
from gpt_optuna.worker import Worker

PRECISION = "precision"
Combo = tuple[Value, Value]
"""(graph fusion, precision)."""
MAX_SIDE_BY_SIDE = 4
"""Graph variants made at once, at most (each worker holds a few copies of the graph)."""
MEMORY_PER_MODEL_BYTE = 8
"""Memory a worker may need while it transforms a graph, per byte of the model file."""


def side_by_side(model_bytes: int) -> int:
    """How many graph variants this machine can make at once: one per four cores, as memory for a
    transform of a model of ``model_bytes`` allows, at most :data:`MAX_SIDE_BY_SIDE`, at least 1."""
    by_cores = (os.cpu_count() or 1) // 4
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        available = 0
    by_memory = available // max(MEMORY_PER_MODEL_BYTE * model_bytes, 1)
    return max(1, min(MAX_SIDE_BY_SIDE, by_cores, by_memory))


def check_space(
    space: Space,
    template: EvaluateJob,
    worker: Worker,
    timeout: float,
    note: Callable[[str], None],
    say: Callable[[str], None] = lambda _: None,
    at_once: int = 1,
) -> Space:
    """``space`` without the transform values that cannot be made or loaded, and with the knob
    limits the engine reported; each change is told to ``note`` in one line, each check to ``say``
    as it starts (making a transform can take a while). Up to ``at_once`` precisions are made at
    once, in ``worker`` and helpers like it."""
    default = space.default()
    base_fusion, base_precision = default.get(FUSION_KNOB, "none"), default.get(PRECISION, "fp32")
    fusions = space.choices(FUSION_KNOB) or (base_fusion,)
    precisions = space.choices(PRECISION) or (base_precision,)
    results: dict[Combo, TrialResult] = {}
    started, count, numbers = time.monotonic(), len(fusions) * len(precisions), itertools.count(1)

    def check(combo: Combo, on: Worker) -> None:
        fusion, precision = combo
        say(f"checking the space {next(numbers)}/{count}: graph_fusion {fusion}, precision {precision} ...")
        job = replace(template, candidate=space.default({FUSION_KNOB: fusion, PRECISION: precision}))
        results[combo] = run_evaluation(on, CheckJob(job, space), timeout)

    base_first = sorted(fusions, key=lambda f: f != base_fusion)
    order = list(itertools.product(base_first, sorted(precisions, key=lambda p: p != base_precision)))
    for fusion in base_first:
        check((fusion, base_precision), worker)
    graphs = {f for (f, _), r in results.items() if r.outcome is Outcome.OK}
    _side_by_side([(f, p) for f, p in order if f in graphs and p != base_precision], check, worker, at_once)
    done = [(combo, results[combo]) for combo in order if combo in results]  # in a fixed order, however made
    loaded = {combo: r.attrs["limits"] for combo, r in done if r.outcome is Outcome.OK}
    failed = {combo: _why(r) for combo, r in done if r.outcome is not Outcome.OK}
    checked = len(results)
    say(f"checked the space: {checked} graph variant{'s' if checked > 1 else ''} in {time.monotonic() - started:.1f} s")
    if (base_fusion, base_precision) in failed:
        setting = f"graph_fusion {base_fusion}, precision {base_precision}"
        raise UserError(
            f"the backend cannot load the model as the space's default ({setting}) would: "
            f"{failed[(base_fusion, base_precision)]}"
        )
    kept_fusions = tuple(f for f in fusions if (f, base_precision) not in failed)
    for fusion in fusions:
        if fusion not in kept_fusions:
            note(f"graph_fusion {fusion} not searched: {failed[(fusion, base_precision)]}")
    if len(kept_fusions) < len(fusions):
        space = space.restricted(FUSION_KNOB, kept_fusions)
    kept_precisions = tuple(p for p in precisions if any((f, p) in loaded for f in kept_fusions))
    for precision in precisions:
        if precision not in kept_precisions:
            note(f"precision {precision} not searched: {failed[(base_fusion, precision)]}")
    if len(kept_precisions) < len(precisions):
        space = space.restricted(PRECISION, kept_precisions)
    return _apply_limits(space, loaded, note)


def _side_by_side(
    combos: Iterable[Combo], check: Callable[[Combo, Worker], None], worker: Worker, at_once: int
) -> None:
    """``check`` every combination, up to ``at_once`` at a time: on ``worker`` and on helper workers
    started like it (its environment, logs beside its own) and stopped afterwards."""
    combos = list(combos)
    helpers = min(at_once, len(combos)) - 1
    if helpers <= 0:
        for combo in combos:
            check(combo, worker)
        return
    with contextlib.ExitStack() as stack:
        idle: queue.Queue[Worker] = queue.Queue()
        idle.put(worker)
        for index in range(helpers):
            log = worker.log_path.with_name(f"{worker.log_path.stem}-check-{index + 1}.log")
            idle.put(stack.enter_context(Worker(log, worker.env)))

        def on_idle(combo: Combo) -> None:
            taken = idle.get()
            try:
                check(combo, taken)
            finally:
                idle.put(taken)

        with ThreadPoolExecutor(max_workers=helpers + 1) as pool:
            for future in [pool.submit(on_idle, combo) for combo in combos]:
                future.result()


def _why(result: TrialResult) -> str:
    first = result.detail.strip().splitlines()[0] if result.detail.strip() else result.outcome.value
    return first[:300]


def _apply_limits(space: Space, loaded: dict[Combo, list[KnobLimit]], note: Callable[[str], None]) -> Space:
    """Offer each limited knob only with the fusion, precision and settings where it works: one
    condition on them together, since a setting can suit one precision and not another."""
    limited = {limit.knob for limits in loaded.values() for limit in limits}
    for knob in sorted(limited):
        by_combo = {combo: next((x for x in limits if x.knob == knob), None) for combo, limits in loaded.items()}
        reason = next(x.reason for x in by_combo.values() if x is not None)
        settings = next((x.allowed.parents for x in by_combo.values() if x is not None and x.allowed), ())
        every_setting = tuple(itertools.product(*(space.choices(p) for p in settings)))
        parents = [p for p in (FUSION_KNOB, PRECISION) if len(space.choices(p)) > 1] + list(settings)
        allowed: set[tuple[Value, ...]] = set()
        for (fusion, precision), limit in by_combo.items():
            if limit is not None and limit.allowed is None:
                continue
            head = tuple(v for p, v in ((FUSION_KNOB, fusion), (PRECISION, precision)) if p in parents)
            allowed |= {head + tail for tail in (every_setting if limit is None else limit.allowed.combos())}
        if not allowed:
            note(f"{knob} not searched: {reason}")
            space = space.restricted(knob, (next(k.default for k in space.knobs if k.name == knob),))
            continue
        if not parents:
            continue  # it works wherever the space goes
        combos = tuple(c for c in itertools.product(*(space.choices(p) for p in parents)) if c in allowed)
        if len(parents) == 1:
            space = space.with_requirement(knob, Condition(parents[0], tuple(c[0] for c in combos)))
        else:
            space = space.with_requirement(knob, Condition(tuple(parents), combos))
        note(f"{knob} offered only with {_where(parents, combos)}; elsewhere {reason}")
    return space


def _where(parents: list[str], combos: tuple[tuple[Value, ...], ...]) -> str:
    """``precision+graph_optimization_level: fp32 at A, B; int8 at A``: the last parent's values per
    combination of the others."""
    grouped: dict[tuple[Value, ...], list[Value]] = {}
    for combo in combos:
        grouped.setdefault(combo[:-1], []).append(combo[-1])
    parts = [f"{'/'.join(map(str, head)) or 'any'} at {', '.join(map(str, tail))}" for head, tail in grouped.items()]
    return f"{'+'.join(parents)}: {'; '.join(parts)}"
