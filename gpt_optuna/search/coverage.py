"""How much of the space a study has covered, and, in a space small enough to list, the candidates
no trial holds yet: the nearest of them to a proposal the study already holds, and whether any is left.

A space of up to :data:`LISTED_AT_MOST` candidates is listed once; each candidate a trial comes to
hold is crossed off as the :class:`~gpt_optuna.search.ledger.StudyLedger` folds it in, and those
ruled out (a failed transform, the settings the engine refuses) are crossed off when the rule
appears. A larger space is only counted: its search ends at its trial target or time, never by
covering it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from gpt_optuna.core.space import Candidate, Space, Value
from gpt_optuna.search.ledger import Key, StudyLedger

LISTED_AT_MOST = 100_000
"""The largest space whose candidates are listed (about 150 bytes each)."""
_ABSENT = object()
"""A knob that is not active in a candidate."""

Row = tuple[object, ...]
"""A candidate as its values in the space's knob order (:data:`_ABSENT` where a knob is inactive)."""


class Coverage:
    """The space's candidates against the study's: how many are left, and which.

    ``ruled_out`` says which candidates the search will not try even though no trial holds them
    (it is asked again whenever the ledger's rules change).
    """

    def __init__(self, space: Space, ledger: StudyLedger, ruled_out: Callable[[Key], bool]) -> None:
        self.space = space
        self.ledger = ledger
        self.ruled_out = ruled_out
        self.size = space.size()
        self._names = [k.name for k in space.knobs]
        self._listed = self.size <= LISTED_AT_MOST
        self._left: set[Row] = set()
        self._read = 0
        self._unfolded = -1
        self._rules = -1
        self._in_space = 0

    @property
    def listed(self) -> bool:
        """Whether the space is small enough to list: its coverage is then exact."""
        return self._listed

    def row(self, candidate: Candidate | Key) -> Row:
        values = dict(candidate)
        return tuple(values.get(name, _ABSENT) for name in self._names)

    def candidate(self, row: Row) -> Candidate:
        return {name: value for name, value in zip(self._names, row, strict=True) if value is not _ABSENT}  # type: ignore[misc]

    def sync(self, rules: int) -> None:
        """Cross off what the ledger folded in since the last call; ``rules`` changes whenever the
        candidates ruled out may have (then the list is made again)."""
        ledger = self.ledger
        if ledger.unfolded != self._unfolded or rules != self._rules:
            self._unfolded, self._rules, self._read = ledger.unfolded, rules, 0
            self._in_space = 0
            if self._listed:
                self._left = {
                    self.row(c) for c in self.space.every_candidate() if not self.ruled_out(frozenset(c.items()))
                }
        for key in ledger.held_log[self._read :]:
            row = self.row(key)
            if self._listed:
                self._left.discard(row)
            elif self._valid(row):
                self._in_space += 1
        self._read = len(ledger.held_log)

    def left(self, taken: Iterable[Key] = ()) -> int | None:
        """Candidates no trial holds (nor ``taken``: running, queued or being proposed); for a
        space too large to list, those no finished trial holds (None where that count means
        nothing: a listed space's candidates ruled out are not left either)."""
        if not self._listed:
            return self.size - self._in_space
        busy = {self.row(key) for key in taken}
        return len(self._left) - len(busy & self._left)

    def nearest(
        self, to: Candidate, taken: set[Key], fits: Callable[[Candidate], bool], rng: random.Random
    ) -> Candidate | None:
        """Of the candidates left (not ``taken``, and those ``fits`` accepts), one of those that
        differ from ``to`` in the fewest knobs; None where none is left or the space is not listed."""
        if not self._listed:
            return None
        busy = {self.row(key) for key in taken}
        target = self.row(to)
        best: list[Row] = []
        fewest = len(target) + 1
        for row in self._left:
            if row in busy:
                continue
            apart = sum(a != b for a, b in zip(row, target, strict=True))
            if apart < fewest and fits(self.candidate(row)):
                best, fewest = [row], apart
            elif apart == fewest and fits(self.candidate(row)):
                best.append(row)
        return self.candidate(rng.choice(sorted(best, key=repr))) if best else None

    def _valid(self, row: Row) -> bool:
        """Whether a candidate is one the search proposes (each active knob at a value it tries)."""
        values: dict[str, Value] = {}
        for knob, value in zip(self.space.knobs, row, strict=True):
            if knob.active(values) != (value is not _ABSENT):
                return False
            if value is not _ABSENT:
                if value not in knob.search_choices:
                    return False
                values[knob.name] = value  # type: ignore[assignment]
        return True
