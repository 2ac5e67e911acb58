"""What a study records about itself: the names of its user attrs, the folder studies live in, and
:class:`StudyRecord`, its fingerprint read by every reader (a trial's own: :mod:`.trial_record`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.graph.model_profile import ModelProfile

if TYPE_CHECKING:
    import optuna

STUDIES = Path("studies")
"""The project's own folder for study databases and study folders: the one folder made on demand."""

FINGERPRINT_ATTR = "gpt_optuna"
"""What makes a study: model, backend, criterion, space; a resume with another is refused."""
MEASURE_ATTR = "measure_settings"
"""The latency protocol of the latest search (it may change between resumes, so it is not in the fingerprint)."""
SPACE_ATTR = "space_record"
"""The whole search space (:meth:`Space.to_record`), for workers that join from other hosts."""
SEARCH_ATTR = "search"
"""The latest search's sampler and trial target, which joining workers follow."""
FOLDER_ATTR = "study_folder"
"""The study folder (absolute): cached data, transformed models and logs, found from any directory."""
CONFIRMED_ATTR = "confirmed"
"""The finalists' re-measurement: their ranking, speedups and intervals."""
HOST_ATTR = "host_check"
"""What the look at the host before the latest search found: cores, load, other GPU work, clocks, warnings."""
WINNER_ATTR = "winner"
"""The decided winner and its figures, for readers outside gpt-optuna (optuna-dashboard, scripts)."""
VERDICT_ATTR = "Verdict"
"""The verdict's sentence, as text (optuna-dashboard shows it beside its "Best Trial"): capitalized,
so that it sorts before every other user attr, as the SQLite storage lists them."""
UNDECIDED = "verdict: not decided yet: the search has not ended"
""":data:`VERDICT_ATTR` of a new study, until its search decides one."""
FORMER_VERDICT_ATTR = "verdict"
"""Where studies recorded the verdict's sentence before :data:`VERDICT_ATTR`: kept up to date where present."""
DASHBOARD_ATTR = "gpt_optuna:dashboard"
"""Study system attr: the winner record whose figure and notes optuna-dashboard holds."""
ARTIFACTS_ATTR = "artifact_store"
"""The artifact store's folder, as the study's creator gave it (absolute)."""
DATA_ATTR = "shared_data"
"""file name -> {"artifact": id, "sha256": hash} of each data file in the store."""


def mark_undecided(study: optuna.Study) -> None:
    """A new study's verdict (:data:`UNDECIDED`): written first, so that readers listing attrs as
    stored show it first."""
    study.set_user_attr(VERDICT_ATTR, UNDECIDED)


def record_setup(study: optuna.Study, measure: MeasureSettings, space: list[dict[str, Any]]) -> None:
    """The latest search's latency protocol and whole space (:meth:`Space.to_record`)."""
    study.set_user_attr(MEASURE_ATTR, asdict(measure))
    study.set_user_attr(SPACE_ATTR, space)


def recorded_measure(study: optuna.Study) -> MeasureSettings:
    """The latest search's latency protocol (a study that recorded none: the defaults)."""
    return MeasureSettings(**study.user_attrs.get(MEASURE_ATTR, {}))


def recorded_space(study: optuna.Study) -> list[dict[str, Any]] | None:
    """The latest search's whole space, each knob's record (None: no search recorded one)."""
    return study.user_attrs.get(SPACE_ATTR)


def record_host(study: optuna.Study, host: dict[str, Any]) -> None:
    """What the look at the host before the latest search found."""
    study.set_user_attr(HOST_ATTR, host)


def recorded_host(study: optuna.Study) -> dict[str, Any] | None:
    """What the look at the host before the latest search found (None: a study made before it was recorded)."""
    return study.user_attrs.get(HOST_ATTR)


@dataclass(frozen=True)
class SearchRecord:
    """The latest search as workers that join it follow it (:data:`SEARCH_ATTR`), written and read here."""

    sampler: str = "tpe"
    n_trials: int | None = None
    """The trials the study should hold when done (None: no target)."""
    trial_timeout_s: float | None = None
    """A trial's deadline (None: the search recorded none, the default holds)."""
    ends_at: float | None = None
    """When the search ends, wall-clock (None: it set no end)."""

    @classmethod
    def of(cls, study: optuna.Study) -> SearchRecord:
        """The study's latest search (a study that recorded none: the defaults)."""
        return cls(**study.user_attrs.get(SEARCH_ATTR, {}))

    def write(self, study: optuna.Study) -> None:
        study.set_user_attr(SEARCH_ATTR, asdict(self))


@dataclass(frozen=True)
class StudyRecord:
    """How a study was made, read from its fingerprint (:data:`FINGERPRINT_ATTR`): the one place
    that knows its keys and what an absent one means."""

    backend: str | None
    model: Path | None
    model_sha256: str | None
    external_data_sha256: dict[str, str]
    """The hash of each file holding the model's external weights, by its location (none recorded: empty)."""
    accuracy: str | None
    metric: str | None
    dry_run: bool
    """The study measured build time, not latency (``tune --dry-run``)."""
    objectives: tuple[str, ...]
    shapes: dict[str, Any] | None
    space: tuple[dict[str, Any], ...]
    versions: dict[str, str]
    allow_io_change: bool
    model_profile: ModelProfile | None
    """What the model is made of (studies made before it was recorded: None)."""

    @classmethod
    def of(cls, study: optuna.Study) -> StudyRecord | None:
        """The study's record; None for a study gpt-optuna did not make."""
        recorded = study.user_attrs.get(FINGERPRINT_ATTR)
        return None if recorded is None else cls.from_fingerprint(recorded)

    @classmethod
    def read(cls, study: optuna.Study) -> StudyRecord:
        """The study's record, or what an absent key means for each (a study gpt-optuna did not make)."""
        return cls.from_fingerprint(study.user_attrs.get(FINGERPRINT_ATTR, {}))

    @classmethod
    def from_fingerprint(cls, recorded: Mapping[str, Any]) -> StudyRecord:
        model = recorded.get("model")
        return cls(
            backend=recorded.get("backend"),
            model=Path(str(model)) if model else None,
            model_sha256=recorded.get("model_sha256"),
            external_data_sha256=dict(recorded.get("external_data_sha256") or {}),
            accuracy=recorded.get("accuracy"),
            metric=recorded.get("metric"),
            dry_run=recorded.get("objective") == "build_s",
            objectives=tuple(str(o) for o in recorded.get("objectives") or ("latency",)),
            shapes=recorded.get("shapes"),
            space=tuple(recorded.get("space", ())),
            versions=dict(recorded.get("versions", {})),
            allow_io_change=bool(recorded.get("allow_io_change")),
            model_profile=ModelProfile.from_record(recorded.get("model_profile")),
        )

    @property
    def defaults(self) -> dict[str, Any]:
        """Each knob's default: the baseline's configuration."""
        return {knob["name"]: knob["default"] for knob in self.space}
