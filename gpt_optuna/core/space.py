"""Knob descriptions, the search space they form, and its mapping onto Optuna distributions.

Backends describe what they can tune as :class:`Knob` objects and know nothing of Optuna; this
module is the one place where knobs become ``trial.suggest_categorical`` calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gpt_optuna.core.errors import UserError

if TYPE_CHECKING:
    import optuna

Value = str | int | float | bool
Candidate = dict[str, Value]
"""A concrete configuration: knob name -> value, for the knobs active in it."""


@dataclass(frozen=True)
class Condition:
    """A knob is active only when knob ``parent`` takes one of ``values``; with several parents
    (a tuple of names), only when their values together are one of ``values`` (tuples)."""

    parent: str | tuple[str, ...]
    values: tuple[Any, ...]

    @property
    def parents(self) -> tuple[str, ...]:
        return (self.parent,) if isinstance(self.parent, str) else self.parent

    @property
    def key(self) -> str:
        return "+".join(self.parents)

    def holds(self, params: Mapping[str, Value]) -> bool:
        if isinstance(self.parent, str):
            return params.get(self.parent) in self.values
        return tuple(params.get(p) for p in self.parent) in self.values

    def combos(self) -> tuple[tuple[Value, ...], ...]:
        """The parents' values for which it holds, as tuples (one value each for a single parent)."""
        return tuple((v,) for v in self.values) if isinstance(self.parent, str) else self.values

    def satisfiable(self, offered: Mapping[str, tuple[Value, ...]]) -> bool:
        """Whether some values the parents offer make it hold."""
        return any(all(v in offered.get(p, ()) for p, v in zip(self.parents, c, strict=True)) for c in self.combos())

    def describe(self) -> list[Any]:
        return [_plain(v) for v in self.values]


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


CandidateKey = tuple[tuple[str, Value], ...]


def candidate_key(candidate: Candidate) -> CandidateKey:
    """A candidate as a hashable, order-independent value (to count or look up candidates)."""
    return tuple(sorted(candidate.items()))


@dataclass(frozen=True)
class Knob:
    """One searchable option: its choices, the engine's default, and when it applies.

    ``condition`` and every one of ``requires`` must hold for the knob to be active; an inactive
    knob is absent from the candidate, and the engine uses its default.
    """

    name: str
    choices: tuple[Value, ...]
    default: Value
    help: str = ""
    condition: Condition | None = None
    requires: tuple[Condition, ...] = ()
    searched: tuple[Value, ...] | None = None
    """The values the search tries where ``[space]`` restricted the knob away from its default,
    which stays among ``choices`` for the baseline alone; None: every choice is searched."""
    selects_engine: bool = False
    """The knob chooses which engine runs (ONNX Runtime's provider): restricting it chooses the
    engine whose defaults the baseline runs, so its default moves with the restriction."""
    host_sensitive: str = ""
    """Why the knob's best value depends on the host it was measured on (its cores and their
    load, say), where it does: a winner that changes it is named as tuned for this host."""
    open_ended: bool = False
    """The engine takes values beyond ``choices`` (a TensorRT build route's number): a ``[space]`` list
    may name others; otherwise a value of names must be one of ``choices``."""
    minimum: int | None = None
    """The least number a ``[space]`` value (or the user's configuration) may give it (a count of
    threads: 0); None: any number."""
    screened: bool = False
    """One of many knobs of which few change latency (TensorRT's build routes): the search screens
    them for the few that do (:mod:`~gpt_optuna.search.route_plan`) and tries only those."""

    def __post_init__(self) -> None:
        if not self.choices:
            raise ValueError(f"knob {self.name} has no choices")
        if self.default not in self.choices:
            raise ValueError(f"knob {self.name}: default {self.default!r} is not among its choices")
        if self.searched is not None and not (self.searched and set(self.searched) <= set(self.choices)):
            raise ValueError(f"knob {self.name}: searched values {self.searched!r} are not among its choices")

    @property
    def search_choices(self) -> tuple[Value, ...]:
        """The values the search tries."""
        return self.choices if self.searched is None else self.searched

    @property
    def conditions(self) -> tuple[Condition, ...]:
        return ((self.condition,) if self.condition is not None else ()) + self.requires

    def active(self, params: Mapping[str, Value]) -> bool:
        return all(c.holds(params) for c in self.conditions)

    def describe(self) -> dict[str, Any]:
        data: dict[str, Any] = {"name": self.name, "choices": list(self.choices), "default": self.default}
        if self.searched is not None:
            data["searched"] = list(self.searched)
        if self.conditions:
            data["when"] = {c.key: c.describe() for c in self.conditions}
        return data


class Space:
    """An ordered set of knobs; a knob's condition may only refer to a knob before it."""

    def __init__(self, knobs: list[Knob]) -> None:
        seen: set[str] = set()
        for knob in knobs:
            if knob.name in seen:
                raise ValueError(f"duplicate knob {knob.name}")
            for parent in (p for c in knob.conditions for p in c.parents):
                if parent not in seen:
                    raise ValueError(f"knob {knob.name} depends on {parent}, not defined before it")
            seen.add(knob.name)
        self.knobs = tuple(knobs)

    def __len__(self) -> int:
        return len(self.knobs)

    def _walk(self, value_of: Callable[[Knob], Value]) -> Candidate:
        """Each knob active in the candidate made so far, at ``value_of`` it, in order."""
        params: Candidate = {}
        for knob in self.knobs:
            if knob.active(params):
                params[knob.name] = value_of(knob)
        return params

    def default(self, fixed: Mapping[str, Value] | None = None) -> Candidate:
        """The engine's default configuration: every active knob at its default, or at its value
        in ``fixed``."""
        given = fixed or {}
        return self._walk(lambda knob: given.get(knob.name, knob.default))

    def fitted(self, values: Mapping[str, Value]) -> Candidate:
        """The candidate of this space nearest to ``values`` (say, a configuration recorded on
        another space): each active knob at its value there where it offers it, else its default."""
        offered = {k.name: values[k.name] for k in self.knobs if k.name in values and values[k.name] in k.choices}
        return self.default(offered)

    def defaults(self) -> Candidate:
        """Every knob at its default, active or not (what the engine uses for an inactive knob)."""
        return {k.name: k.default for k in self.knobs}

    def choices(self, name: str) -> tuple[Value, ...]:
        """The values of knob ``name``; none where the space has no such knob."""
        return next((k.choices for k in self.knobs if k.name == name), ())

    def restricted(self, name: str, choices: tuple[Value, ...]) -> Space:
        """The space with knob ``name`` offering only ``choices`` (its default among them), and
        without the knobs that can then never be active."""
        knobs: list[Knob] = []
        offered: dict[str, tuple[Value, ...]] = {}
        for knob in self.knobs:
            if knob.name == name:
                kept = tuple(c for c in knob.choices if c in choices)
                searched = None if knob.searched is None else tuple(c for c in knob.searched if c in kept)
                knob = replace(knob, choices=kept, searched=searched or (None if searched is None else (knob.default,)))
            if all(c.satisfiable(offered) for c in knob.conditions):
                knobs.append(knob)
                offered[knob.name] = knob.choices
        return Space(knobs)

    def with_requirement(self, name: str, condition: Condition) -> Space:
        """The space with knob ``name`` active only where ``condition`` also holds."""
        return Space([replace(k, requires=(*k.requires, condition)) if k.name == name else k for k in self.knobs])

    def every_candidate(self) -> list[Candidate]:
        """Every candidate the search can propose: each active knob at each value it tries."""
        candidates: list[Candidate] = [{}]
        for knob in self.knobs:
            grown: list[Candidate] = []
            for partial in candidates:
                if knob.active(partial):
                    grown += [{**partial, knob.name: value} for value in knob.search_choices]
                else:
                    grown.append(partial)
            candidates = grown
        return candidates

    def size(self) -> int:
        """How many distinct candidates the search can propose (conditions applied), counted
        without listing them: knob by knob, over the values of the knobs later conditions read."""
        return self._count()[0]

    def searched_knobs(self) -> list[str]:
        """The knobs the search varies: more than one value to try, in some candidate."""
        return self._searched(self._count()[1])

    def _searched(self, active: set[str]) -> list[str]:
        return [k.name for k in self.knobs if k.name in active and len(k.search_choices) > 1]

    def _count(self) -> tuple[int, set[str]]:
        """The candidates' number, and the knobs active in at least one of them."""
        read_after = [
            {p for later in self.knobs[i + 1 :] for c in later.conditions for p in c.parents}
            for i in range(len(self.knobs))
        ]
        states: dict[tuple[tuple[str, Value], ...], int] = {(): 1}
        active: set[str] = set()
        for knob, read in zip(self.knobs, read_after, strict=True):
            grown: dict[tuple[tuple[str, Value], ...], int] = {}
            for state, count in states.items():
                kept = tuple((n, v) for n, v in state if n in read)
                if not knob.active(dict(state)):
                    grown[kept] = grown.get(kept, 0) + count
                    continue
                active.add(knob.name)
                if knob.name in read:
                    for value in knob.search_choices:
                        branch = (*kept, (knob.name, value))
                        grown[branch] = grown.get(branch, 0) + count
                else:
                    grown[kept] = grown.get(kept, 0) + count * len(knob.search_choices)
            states = grown
        return sum(states.values()), active

    def suggest(self, trial: optuna.Trial) -> Candidate:
        return self._walk(lambda knob: trial.suggest_categorical(knob.name, knob.choices))  # type: ignore[arg-type]

    def describe(self) -> list[dict[str, Any]]:
        return [k.describe() for k in self.knobs]

    def to_record(self) -> list[dict[str, Any]]:
        """Every field of every knob as JSON, for :meth:`from_record` (``describe`` is for people), but
        ``minimum``, which checks only the values a user gives."""
        return [
            {
                "name": k.name,
                "choices": list(k.choices),
                "default": k.default,
                "help": k.help,
                "conditions": [[_plain(c.parent), c.describe()] for c in k.conditions],
                "searched": None if k.searched is None else list(k.searched),
                "selects_engine": k.selects_engine,
                "host_sensitive": k.host_sensitive,
                "open_ended": k.open_ended,
                **({"screened": True} if k.screened else {}),  # absent: records written before it read alike
            }
            for k in self.knobs
        ]

    @classmethod
    def from_record(cls, record: list[dict[str, Any]]) -> Space:
        """The space :meth:`to_record` wrote (a worker joining a study gets it from the storage)."""
        knobs = []
        for item in record:
            conditions = [
                Condition(parent, tuple(values))
                if isinstance(parent, str)
                else Condition(tuple(parent), tuple(tuple(v) for v in values))
                for parent, values in item["conditions"]
            ]
            knobs.append(
                Knob(
                    item["name"],
                    tuple(item["choices"]),
                    item["default"],
                    item["help"],
                    conditions[0] if conditions else None,
                    tuple(conditions[1:]),
                    None if item["searched"] is None else tuple(item["searched"]),
                    item["selects_engine"],
                    item.get("host_sensitive", ""),
                    item.get("open_ended", False),
                    screened=item.get("screened", False),
                )
            )
        return cls(knobs)

    def table(self) -> str:
        """A readable listing: each knob, what is searched, its default and when it applies."""
        rows = []
        for knob in self.knobs:
            tried = knob.search_choices
            values = (
                ", ".join(map(str, tried))
                if len(tried) > 1
                else "(fixed)"
                if tried == (knob.default,)
                else str(tried[0])
            )
            when = "".join(f"  when {c.key} in {c.describe()}" for c in knob.conditions)
            screened = "  (screened first: searched only where the screen keeps it)" if knob.screened else ""
            rows.append(f"{knob.name:<44} default {knob.default!s:<20} {values}{when}{screened}")
        size, active = self._count()
        searched = len(self._searched(active))
        return "\n".join([*rows, f"{len(self.knobs)} knobs, {searched} searched, {size:,} candidates"])

    def with_overrides(self, overrides: Mapping[str, Value | list[Value]]) -> Space:
        """Apply a ``[space]`` table: a list gives the values to try, a scalar fixes the knob, and
        ``"default"`` drops it from the search (fixed at the engine's default).

        The restriction applies to the search, not to the baseline: a knob restricted away from
        its default keeps the default among its choices, for the baseline alone (``searched``).
        A knob that selects the engine moves its default instead: the baseline is that engine's.
        """
        by_name = {k.name: k for k in self.knobs}
        unknown = sorted(set(overrides) - by_name.keys())
        if unknown:
            raise UserError(f"[space] names unknown knob {unknown[0]!r}; known: {', '.join(by_name)}")
        knobs = []
        for knob in self.knobs:
            if knob.name not in overrides:
                knobs.append(knob)
                continue
            given = overrides[knob.name]
            if given == "default" and "default" not in knob.choices:
                given = knob.default
            values = tuple(given) if isinstance(given, list) else (given,)
            if not values:
                raise UserError(f"[space] gives knob {knob.name!r} no values")
            for value in values:
                _check_value(knob, value, self._described(knob))
            if knob.default in values or knob.selects_engine:
                default = knob.default if knob.default in values else values[0]
                knobs.append(replace(knob, choices=values, default=default, searched=None, screened=False))
            else:
                knobs.append(replace(knob, choices=(knob.default, *values), searched=values, screened=False))
        return Space(knobs)

    def _described(self, knob: Knob) -> set[Any]:
        """Values of ``knob`` that other knobs are described for (their conditions name them)."""
        return {v for k in self.knobs for c in k.conditions if c.parent == knob.name for v in c.values}

    def including(self, values: Mapping[str, Value], where: str) -> Space:
        """The space with each of ``values`` (a user's own configuration) among its knob's choices:
        a value the knob did not offer is added for that configuration alone, not searched."""
        by_name = {k.name: k for k in self.knobs}
        unknown = sorted(set(values) - by_name.keys())
        if unknown:
            raise UserError(f"{where} sets {unknown[0]}, which no knob of this search sets here")
        knobs = []
        for knob in self.knobs:
            if knob.name in values:
                value = _as_choice(knob, values[knob.name])
                _check_value(knob, value, self._described(knob), where)
                if value not in knob.choices:
                    knob = replace(knob, choices=(*knob.choices, value), searched=knob.search_choices)
            knobs.append(knob)
        return Space(knobs)


def _as_choice(knob: Knob, value: Value) -> Value:
    """A switch's value given as 0 or 1 (ONNX Runtime's option strings) as false or true."""
    switch = all(isinstance(c, bool) for c in knob.choices)
    return bool(value) if switch and type(value) is int and value in (0, 1) else value


def _check_value(knob: Knob, value: Value, described: set[Any], where: str = "[space]") -> None:
    """A UserError where a ``[space]`` (or ``where``) value cannot be the knob's: not of its type
    (true/false for a switch, a number for a number), below its ``minimum``, or, for a knob of
    names, not one it offers here nor one other knobs are described for (the CPU provider on a GPU
    host, which is not searched by default)."""
    kinds = {type(c) for c in knob.choices}
    fits = type(value) in kinds or (type(value) is int and float in kinds)
    offered = ", ".join(_shown(c) for c in (*knob.choices, *sorted(described - set(knob.choices), key=str)))
    if kinds <= {str} and value not in knob.choices and value not in described and not knob.open_ended:
        raise UserError(f"{where} {knob.name} = {_shown(value)}: not a value it offers here ({offered})")
    if not fits:
        wanted = "true or false" if kinds == {bool} else "a number" if kinds & {int, float} else "one of its values"
        raise UserError(f"{where} {knob.name} = {_shown(value)}: give {wanted} (it offers {offered})")
    if knob.minimum is not None and type(value) in (int, float) and value < knob.minimum:
        raise UserError(f"{where} {knob.name} = {_shown(value)}: give {knob.minimum} or more (it offers {offered})")


def _shown(value: Value) -> str:
    """A value as ``[space]`` in TOML writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else str(value)
