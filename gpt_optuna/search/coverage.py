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
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from optuna.trial import FrozenTrial

from gpt_optuna.core.space import Candidate, Space, Value
from gpt_optuna.search.ledger import Key, StudyLedger

LISTED_AT_MOST = 100_000
"""The largest space whose candidates are listed (a row of small integers each, and its index)."""
_ABSENT = object()
"""A knob that is not active in a candidate."""
_FAR = np.iinfo(np.int32).max

Row = tuple[object, ...]
"""A candidate as its values in the space's knob order (:data:`_ABSENT` where a knob is inactive)."""


class Coverage:
    """The space's candidates against the study's: how many are left, and which.

    ``ruled_out`` says which candidates the search will not try even though no trial holds them
    (it is asked again whenever the ledger's rules change). A listed space keeps each candidate as
    the indices of its values (-1: inactive), so that the distance from a proposal to every
    candidate left is one array operation.
    """

    def __init__(self, space: Space, ledger: StudyLedger, ruled_out: Callable[[Key], bool]) -> None:
        self.space = space
        self.ledger = ledger
        self.ruled_out = ruled_out
        self.size = space.size()
        self._names = [k.name for k in space.knobs]
        self._values = [{v: i for i, v in enumerate(k.search_choices)} for k in space.knobs]
        self.listed = self.size <= LISTED_AT_MOST
        """Whether the space is small enough to list: its coverage is then exact."""
        self._rows: list[Row] = []
        self._index: dict[Row, int] = {}
        self._codes = np.zeros((0, len(self._names)), dtype=np.int16)
        self._open = np.zeros(0, dtype=bool)
        """Candidates no finished trial holds and no rule rules out."""
        self._read = 0
        self._unfolded = -1
        self._rules = -1
        self._in_space = 0

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
            self._unfolded, self._rules, self._read, self._in_space = ledger.unfolded, rules, 0, 0
            if self.listed:
                self._list()
        for key in ledger.held_log[self._read :]:
            row = self.row(key)
            if self.listed:
                at = self._index.get(row)
                if at is not None:
                    self._open[at] = False
            elif self._valid(row):
                self._in_space += 1
        self._read = len(ledger.held_log)

    def _list(self) -> None:
        """List every candidate, each open unless a rule rules it out."""
        if not self._rows:
            self._rows = [self.row(c) for c in self.space.every_candidate()]
            self._index = {row: at for at, row in enumerate(self._rows)}
            self._codes = np.array([self._code(row) for row in self._rows], dtype=np.int16).reshape(
                len(self._rows), len(self._names)
            )
        self._open = np.array([not self.ruled_out(frozenset(self.candidate(row).items())) for row in self._rows])

    def _code(self, row: Row) -> list[int]:
        """A candidate's value indices (-1: inactive, -2: a value the search does not try)."""
        return [-1 if v is _ABSENT else values.get(v, -2) for v, values in zip(row, self._values, strict=True)]

    def left(self, taken: Iterable[Key] = ()) -> int:
        """Candidates no trial holds (nor ``taken``: running, queued or being proposed), those ruled
        out not counted; for a space too large to list, those no finished trial holds."""
        if not self.listed:
            return self.size - self._in_space
        busy = self._busy(taken)
        return int(self._open.sum()) - int(self._open[busy].sum()) if busy else int(self._open.sum())

    def _busy(self, taken: Iterable[Key]) -> list[int]:
        return sorted({at for at in (self._index.get(self.row(key)) for key in taken) if at is not None})

    def nearest(
        self, to: Candidate, taken: Iterable[Key], fits: Callable[[Candidate], bool], rng: random.Random
    ) -> Candidate | None:
        """Of the candidates left (not ``taken``, and those ``fits`` accepts), one of those that
        differ from ``to`` in the fewest knobs; None where none is left or the space is not listed."""
        if not self.listed:
            return None
        apart = (self._codes != np.array(self._code(self.row(to)), dtype=np.int16)).sum(axis=1, dtype=np.int32)
        apart[~self._open] = _FAR
        apart[self._busy(taken)] = _FAR
        while True:
            fewest = int(apart.min()) if len(apart) else _FAR
            if fewest == _FAR:
                return None
            closest = np.flatnonzero(apart == fewest)
            for at in rng.sample(list(closest), len(closest)):  # in a random order: usually the first fits
                candidate = self.candidate(self._rows[at])
                if fits(candidate):
                    return candidate
            apart[closest] = _FAR

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


def candidates_left(space: Space, trials: Sequence[FrozenTrial]) -> int:
    """How many of the space's candidates none of ``trials`` holds (evaluated, running or queued)."""
    ledger = StudyLedger()
    ledger.update(trials)
    coverage = Coverage(space, ledger, lambda _: False)
    coverage.sync(ledger.rules)
    return coverage.left(ledger.taken())
