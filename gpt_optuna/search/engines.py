"""Which engines the study's artifact store keeps: the baseline's and those of the fastest feasible
candidates, within a count, so that a night of trials does not fill the disk; and a full disk
drops the engine at hand, never the trial's result."""

from __future__ import annotations

import contextlib
import errno
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import optuna
from optuna.artifacts import FileSystemArtifactStore, upload_artifact
from optuna.artifacts.exceptions import ArtifactNotFound
from optuna.trial import FrozenTrial, TrialState

from gpt_optuna.study.trial_record import TrialRecord, mark_engine_dropped, mark_engine_kept

KEPT_ENGINES = 10
"""The fastest feasible candidates whose engines are kept (besides the baseline's), by default."""
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)

Kept = tuple[float, int, str]
"""(search value, trial number, artifact id) of a kept engine."""


class EngineKeeper:
    """Keeps a feasible trial's engine where it is the baseline's or among the ``top`` fastest
    (every one where ``top`` is None), and removes the engine that falls out of them."""

    def __init__(self, store: FileSystemArtifactStore, top: int | None, note: Callable[[str], None]) -> None:
        self.store = store
        self.top = top
        self.note = note
        self._kept: list[Kept] = []
        self._lock = threading.Lock()
        self._disk_full_said = False

    def seed(self, trials: Sequence[FrozenTrial]) -> None:
        """Take in the engines the study kept before (a resumed search), dropping those beyond ``top``."""
        with self._lock:
            kept = []
            for t in trials:
                record = TrialRecord(t)
                if t.state is TrialState.COMPLETE and t.values and not record.baseline and not record.reused:
                    artifact = record.engine_artifact
                    if artifact is not None:
                        kept.append((t.values[0], t.number, artifact))
            self._kept = sorted(kept)
            self._drop_beyond_top()

    def keep(self, trial: optuna.Trial, engine: Path, value: float) -> None:
        """Keep ``engine`` as an artifact of ``trial`` (its search value ``value``) where it earns a
        place; say on the trial that it was not kept where it does not, or the disk is full."""
        baseline = TrialRecord(trial).baseline
        with self._lock:
            full = self.top is not None and len(self._kept) >= self.top
            if not baseline and full and value >= self._kept[self.top - 1][0]:  # type: ignore[operator]
                mark_engine_dropped(trial, f"not among the {self.top} fastest when it ran")
                return
        try:
            artifact = upload_artifact(artifact_store=self.store, file_path=str(engine), study_or_trial=trial)
        except OSError as exc:
            if exc.errno not in DISK_FULL:
                raise
            mark_engine_dropped(trial, "the disk was full")
            if not self._disk_full_said:
                self._disk_full_said = True
                self.note(
                    f"warning: the disk is full: trial {trial.number}'s engine is not kept (its result is); engines"
                    " are kept again once there is room"
                )
            return
        mark_engine_kept(trial, artifact)
        if not baseline:
            with self._lock:
                self._kept = sorted([*self._kept, (value, trial.number, artifact)])
                self._drop_beyond_top()

    def _drop_beyond_top(self) -> None:
        if self.top is None:
            return
        beyond, self._kept = self._kept[self.top :], self._kept[: self.top]
        for _, _, artifact in beyond:
            with contextlib.suppress(ArtifactNotFound):  # removed already (by another worker of the study)
                self.store.remove(artifact)


def disk_used(folder: Path) -> tuple[int, int]:
    """The bytes and the number of files in an artifact store's folder."""
    files = [p for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else []
    return sum(p.stat().st_size for p in files), len(files)
