"""What a person sees during a search: a progress bar, notes, and the summary at its end."""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import TYPE_CHECKING

from optuna.trial import TrialState
from tqdm import tqdm

from gpt_optuna.core.log import RESULT, logger
from gpt_optuna.core.words import counted
from gpt_optuna.protocol.outcome import Outcome, TrialResult
from gpt_optuna.results.summary_text import format_summary
from gpt_optuna.study.trial_record import TrialRecord

if TYPE_CHECKING:
    import optuna

    from gpt_optuna.core.space import Candidate, Space
    from gpt_optuna.study.summary import StudySummary


def _ended(trial: optuna.trial.FrozenTrial) -> str:
    """How a trial without a value ended, with its reason: infeasible, failed or interrupted."""
    record = TrialRecord(trial)
    if record.marked_interrupted:
        return f"interrupted: {record.interrupted}"
    if record.infeasible is not None:
        return f"infeasible: {record.infeasible[:160]}"
    if record.failed:
        detail = (str(record.failure).splitlines() or [""])[0][:160]
        return f"failed ({record.outcome or 'error'}): {detail}"
    return trial.state.name.lower()


def in_notebook() -> bool:
    """Running in a Jupyter kernel with ipywidgets installed, where tqdm's bar renders as a widget."""
    import importlib.util

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or "IPKernelApp" not in getattr(shell, "config", {}):
        return False
    return importlib.util.find_spec("ipywidgets") is not None


class Progress:
    """A tqdm bar on stderr with the best latency so far; notes (logged: the terminal's handler
    writes them above the bar) and the summary around it. Where stderr is no terminal (a CI log, a
    file), one line per trial instead of a redrawn bar; with ``widgets`` (a notebook), tqdm's
    notebook bar."""

    def __init__(self, enabled: bool = True, widgets: bool = False) -> None:
        self.enabled = enabled
        self.widgets = widgets
        self._bar: tqdm | None = None
        self._lines: tuple[int, int | None] | None = None
        """Without a terminal: (trials done, trials to do) of the per-trial lines."""
        self._best: tuple[float, int] | None = None
        self._deadline: float | None = None
        self._workers = 1
        self._lock = threading.RLock()  # several workers report at once

    def start(
        self,
        study: tuple[str, str],
        space: Space,
        resumed: bool,
        done: int,
        recovered: list[int],
        remaining: int | None,
        deadline: float | None = None,
        workers: int = 1,
        left: int | None = None,
    ) -> None:
        """Say what is searched (``study``: its name and storage; ``left``: the candidates no trial
        holds yet); a bar counts the trials, and shows the workers and, with --timeout, the time left."""
        verb = "resuming" if resumed else "new"
        name, storage = study
        size = space.size()
        unheld = f", {left:,} not evaluated yet" if left is not None and done else ""
        self.note(
            f"{verb} study {name} in {storage} ({counted(done, 'trial')} done); {len(space)} knobs,"
            f" {size:,} candidates{unheld}" + (f"; {workers} workers" if workers > 1 else "")
        )
        if recovered:
            self.note(f"trials {', '.join(map(str, recovered))} were interrupted by a killed run; retrying them")
        self.begin(remaining, deadline, workers)

    def begin(self, remaining: int | None, deadline: float | None, workers: int = 1) -> None:
        """The bar: trials this process adds (of ``remaining``), its workers, the time left."""
        self._deadline = deadline
        self._workers = workers
        if not self.enabled or remaining == 0:
            return
        if self.widgets:
            from tqdm.notebook import tqdm as notebook_bar

            self._bar = notebook_bar(total=remaining, unit="trial")
        elif sys.stderr.isatty():
            self._bar = tqdm(total=remaining, file=sys.stderr, unit="trial", dynamic_ncols=True)
        else:
            self._lines = (0, remaining)
        self._show()

    def end(self) -> None:
        """Close the bar (or end the per-trial lines)."""
        with self._lock:
            self._lines = None
            if self._bar is not None:
                self._bar.close()
                self._bar = None

    def note(self, text: str) -> None:
        """Say ``text``: a warning where it says so (``warning: ...``: shown even with ``-qq``)."""
        level = logging.WARNING if text.startswith("warning: ") else logging.INFO
        with self._lock:
            logger(__name__).log(level, text)

    def result(self, number: int, candidate: Candidate, result: TrialResult | None) -> None:
        """A note for a candidate that failed or was infeasible (None: an earlier result reused);
        without a terminal the trial's own line says it instead."""
        if self._lines is not None:
            return
        if result is not None and result.outcome.is_failure:
            self.note(f"trial {number} failed ({result.outcome.value}): {result.detail.splitlines()[0][:160]}")
        elif result is not None and result.outcome is Outcome.INFEASIBLE:
            self.note(f"trial {number} infeasible: {result.detail[:160]}")

    def trial_done(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        with self._lock:
            if self._bar is None and self._lines is None:
                return
            if self._best is None:  # once per run, so that a resumed study shows its earlier best
                complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if complete:
                    first = min(complete, key=lambda t: t.values[0])
                    self._best = (first.values[0], first.number)
            if trial.values and (self._best is None or trial.values[0] < self._best[0]):
                self._best = (trial.values[0], trial.number)
            if self._bar is not None:
                self._bar.update(1)
                self._show()
            elif self._lines is not None:
                done, total = self._lines[0] + 1, self._lines[1]
                self._lines = (done, total)
                value = f"{trial.values[0]:.4g} ms" if trial.values else _ended(trial)
                reused_from = TrialRecord(trial).reused_from
                if reused_from is not None:
                    value = f"trial {reused_from}'s candidate again, its result reused: {value}"
                counted = f"{done}/{total}" if total is not None else str(done)
                logger(__name__).info(f"trial {trial.number} ({counted}): {value}; {self._status()}")

    def _status(self) -> str:
        """The best so far, the workers, and the time left before --timeout."""
        parts = [] if self._best is None else [f"best {self._best[0]:.4g} ms (trial {self._best[1]})"]
        if self._workers > 1:
            parts.append(f"{self._workers} workers")
        if self._deadline is not None:
            left = max(self._deadline - time.monotonic(), 0.0)
            parts.append(f"{int(left // 3600)}h{int(left % 3600 // 60):02d}m{int(left % 60):02d}s left")
        return ", ".join(parts)

    def _show(self) -> None:
        """The bar's postfix: :meth:`_status`."""
        if self._bar is not None:
            self._bar.set_postfix_str(self._status())

    def finish(self, summary: StudySummary, steps: list[str], note: str = "", took: str = "") -> None:
        """The summary, the run's time by phase (``took``), and the commands worth running next
        (extend, report, export)."""
        self.end()
        say = logger(__name__)
        if note:
            say.info(note)
        say.info(format_summary(summary), extra=RESULT)
        if took:
            say.info(took, extra=RESULT)
        for step in steps:
            say.info(step, extra=RESULT)
