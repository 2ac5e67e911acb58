"""A study's folder and every path in it: its cached data, transformed models, engines and caches,
the logs of its worker processes, and what its readers write there."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpt_optuna.core.engine_paths import EnginePaths
from gpt_optuna.study.record import FOLDER_ATTR, STUDIES

if TYPE_CHECKING:
    import optuna


def _under(name: str, doc: str) -> Any:
    """A :class:`StudyFolder` property: the folder ``name`` in it."""
    return property(lambda self: self.root / name, doc=doc)


@dataclass(frozen=True)
class StudyFolder:
    """The folder at ``root`` and the names of what a study keeps in it."""

    root: Path

    @classmethod
    def of(cls, study: optuna.Study) -> StudyFolder:
        """The folder the study recorded, else ``studies/<name>`` here (studies made before it was
        recorded)."""
        recorded = study.user_attrs.get(FOLDER_ATTR)
        return cls(Path(recorded)) if recorded else cls(cls.named(study.study_name).root.resolve())

    @classmethod
    def recorded(cls, storage: optuna.storages.BaseStorage, name: str) -> Path | None:
        """The study folder a study of that name recorded, or None (no such study, or made before it was)."""
        try:
            study_id = storage.get_study_id_from_name(name)
        except KeyError:
            return None
        recorded = storage.get_study_user_attrs(study_id).get(FOLDER_ATTR)
        return Path(recorded) if recorded else None

    def record(self, study: optuna.Study) -> None:
        """Record this folder (absolute) as the study's, where it has none yet."""
        if study.user_attrs.get(FOLDER_ATTR) is None:
            study.set_user_attr(FOLDER_ATTR, str(self.root.resolve()))

    @classmethod
    def named(cls, name: str) -> StudyFolder:
        """The folder a new study named ``name`` gets: ``studies/<name>`` here."""
        return cls(STUDIES / name)

    def gone(self, study_name: str) -> str:
        """One line for a study whose recorded folder (this one) is not there: where the study
        expects it, and how to put it back. Where ``studies/<name>`` here is a folder, it is taken
        as the moved one, and the link to make is the one that puts back all that moved with it
        (the user's model beside the study, too)."""
        gone = self.root
        while not gone.parent.exists():
            gone = gone.parent
        here = StudyFolder.named(study_name).root.resolve()
        moved = (here, *here.parents)[min(len(self.root.parts) - len(gone.parts), len(here.parts) - 1)]
        if here.is_dir() and moved / self.root.relative_to(gone) == here:
            fix = f"ln -s {moved} {gone}"
        elif gone == self.root:
            fix = f"ln -s WHERE_IT_IS_NOW {self.root}"
        else:
            fix = f"mkdir -p {self.root.parent} && ln -s WHERE_IT_IS_NOW {self.root}"
        return (
            f"study {study_name!r} keeps its files in {self.root}, which is not there (moved or removed): move them"
            f" back, or link them there: {fix}"
        )

    engines = _under("engines", "Serialized engines a worker hands to the tuner.")
    artifacts = _under("artifacts", "The artifact store of a study that recorded none elsewhere.")
    tuners = _under("tuners", "Where each tuning run on this host holds a lock while it runs.")
    checks = _under("checks", "Where ``check`` runs keep the records they judge against: what the study never reads.")

    @property
    def engine_paths(self) -> EnginePaths:
        """What the study's engines share across trials: the model cache, TensorRT's timing cache."""
        return EnginePaths.under(self.root)

    @property
    def models(self) -> Path:
        """Transformed models, each made once (``graph.model_cache``)."""
        return self.engine_paths.models

    def sensitivity(self, fusion: str, model_sha256: str) -> Path:
        """The fp16 sensitivity ranking of one graph (the model and its fusion)."""
        return self.root / f"sensitivity-{fusion}-{model_sha256[:16]}.json"

    def space_check(self, key: str) -> Path:
        """A space check remembered for what decided it (``key``)."""
        return self.root / f"space-check-{key}.json"

    def log(self, name: str) -> Path:
        """The log of a worker process (``worker``, ``confirm``, ``compare``, ``profile``...)."""
        return self.root / f"{name}.log"

    def profile(self, label: str) -> Path:
        """A profile comparison of a trial against the baseline."""
        return self.root / f"profile-{label}.json"

    def profiles(self) -> list[Path]:
        """Every profile comparison kept, by name."""
        return sorted(self.root.glob("profile-*.json"))

    def check_run(self, stamp: str) -> Path:
        """The folder of one ``check`` run's record (``stamp``: when it ran)."""
        return self.checks / stamp
