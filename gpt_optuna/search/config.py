"""One TuneConfig: command-line flags and a TOML file map onto it, and it is validated up front."""

from __future__ import annotations

import functools
import hashlib
import re
import time
import tomllib
import unicodedata
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from gpt_optuna.backends import BACKENDS
from gpt_optuna.backends.engine_choice import resolved_spec
from gpt_optuna.core.engine_spec import is_composition
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.measure_settings import MeasureSettings
from gpt_optuna.core.space import Value
from gpt_optuna.graph.feeds import absolute_spec
from gpt_optuna.protocol.accuracy import DEFAULT_CRITERION, Criterion, parse_criterion
from gpt_optuna.search.options import DEFAULT_PROCESSES, DEFAULT_TOP, FLAG, INT, OPTIONS, SAMPLERS
from gpt_optuna.study.folder import StudyFolder
from gpt_optuna.study.record import STUDIES

OBJECTIVES = ("latency", "error", "memory", "build_s")
DEFAULT_N_TRIALS = 100
DEFAULT_TRIAL_TIMEOUT_S = 600.0
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
T = TypeVar("T")


GENERIC_STEMS = frozenset({"model", "inference", "infer", "saved_model", "export", "exported", "net", "network"})
"""Model file names that many exporters write: the folder name tells such models apart."""


MAX_STUDY_NAME = 200
"""Characters a study name may hold: its database and folder are named after it, and file names
stop at 255 bytes on common file systems (SQLite adds ``-journal`` to the database's)."""


def default_study_name(model: Path, backend: str) -> str:
    """``<model>-<backend>``; a model with a generic name (``model.onnx``) is named by its folder too.
    Any file name gives a valid name: letters lose their accents, other characters become ``_``, and
    a long name is cut to :data:`MAX_STUDY_NAME` (the backend kept)."""
    short = "_".join(part.rpartition(":")[2].lower() for part in backend.split(","))
    stem = _name_part(model.stem)
    if stem.lower() in GENERIC_STEMS:
        folder = _name_part(model.resolve().parent.name)
        stem = f"{folder}-{stem}" if folder else stem
    if not stem:  # no letter of it is ASCII: told apart by its name's hash
        stem = "model-" + hashlib.sha256(model.name.encode()).hexdigest()[:8]
    return f"{stem[: MAX_STUDY_NAME - len(short) - 1]}-{short}"


def _name_part(text: str) -> str:
    """``text`` in the letters, digits, ``.``, ``_`` and ``-`` a study name holds, not starting with a mark."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.sub(r"[^A-Za-z0-9._-]+", "_", ascii_text).strip("._-")


CHECK_STUDY = re.compile(r"check-.+-\d{8}-\d{6}")
"""The names of the studies ``gpt-optuna check`` makes (:func:`check_study_name`)."""


def check_study_name(model: Path) -> str:
    """The study ``gpt-optuna check`` makes for ``model``: ``check-<model>-<time>``."""
    return f"check-{model.stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def default_storage(study_name: str) -> str:
    """The SQLite file under ``studies/`` named after the study."""
    return f"sqlite:///{STUDIES}/{short_enough(study_name)}.db"


def short_enough(study_name: str) -> str:
    """The name, where files can be named after it; a UserError otherwise."""
    if len(study_name) > MAX_STUDY_NAME:
        raise UserError(f"study name of {len(study_name)} characters: at most {MAX_STUDY_NAME}")
    return study_name


def absolute_storage(url: str) -> str:
    """The storage URL with a relative SQLite or journal file made absolute: the same study from any folder."""
    for prefix in ("sqlite:///", "journal:"):
        rest = url.removeprefix(prefix)
        if url.startswith(prefix) and rest and not rest.startswith(("/", ":memory:", "file:")):
            return prefix + str(Path(rest).resolve())
    return url


def storage_url(storage: str) -> str:
    """An Optuna storage URL for a URL or an SQLite file's path (``studies/x.db``), a file's made
    absolute: the same study from any folder."""
    if is_url(storage):
        return absolute_storage(storage)
    path = Path(storage).expanduser().resolve()
    if path.is_dir():
        raise UserError(f"{path} is a folder: give the study's database file, e.g. {path / 'NAME.db'}")
    return f"sqlite:///{path}"


def is_url(storage: str) -> bool:
    """Whether ``--storage`` names a storage URL (``journal:`` included) rather than an SQLite file's path."""
    return "://" in storage or storage.startswith("journal:")


def study_flags(storage: str, study_name: str) -> list[str]:
    """``--storage URL --study-name NAME``: what names a study in a command run from any folder."""
    return ["--storage", absolute_storage(storage), "--study-name", study_name]


@dataclass(frozen=True)
class DataSource:
    """Where a run's model and data come from, and what judges the outputs: what reading the
    inputs and the calibration data needs of the configuration."""

    model: Path
    shapes: list[str]
    inputs: Path | None
    samples: int | None
    calibration: Path | None
    metric: str | None
    criterion: Criterion
    timeout_s: float | None
    trial_timeout_s: float


@dataclass(frozen=True)
class StudyKind:
    """What a study must share with a run that resumes it, as the configuration states it."""

    backend: str
    criterion: Criterion
    metric: str | None
    dry_run: bool
    objectives: tuple[str, ...]
    allow_io_change: bool
    baseline_values: dict[str, Value] | None


@dataclass(frozen=True)
class FinalistPlan:
    """How a search's finalists are re-measured: the best ``top`` (none in a dry run) with the
    baseline (and the user's own configuration, ``yours``) in ``processes`` fresh processes, by the
    search's latency settings, within ``timeout_s``; the log goes to the study ``folder``."""

    top: int
    processes: int
    measure: MeasureSettings
    timeout_s: float | None
    dry_run: bool
    yours: bool
    folder: Path


@dataclass(frozen=True)
class TuneConfig:
    """Everything a tuning run needs, after defaults are filled in and values are checked (on
    construction, and again by every ``replace``); it changes no more after that."""

    model: Path
    backend: str = "onnxruntime"
    accuracy: str = DEFAULT_CRITERION
    inputs: Path | None = None
    calibration: Path | None = None
    shapes: list[str] = field(default_factory=list)
    n_trials: int | None = None
    timeout_s: float | None = None
    trial_timeout_s: float = DEFAULT_TRIAL_TIMEOUT_S
    storage: str | None = None
    study_name: str | None = None
    sampler: str = "tpe"
    seed: int | None = None
    dry_run: bool = False
    confirm_top: int = DEFAULT_TOP
    confirm_processes: int = DEFAULT_PROCESSES
    objectives: tuple[str, ...] = ("latency",)
    measure: MeasureSettings = field(default_factory=MeasureSettings)
    space: dict[str, Value | list[Value]] = field(default_factory=dict)
    samples: int | None = None
    """At most this many samples of --inputs are used."""
    metric: str | None = None
    """A user metric function, ``module:function`` or ``script.py:function``."""
    baseline_config: Path | None = None
    """The user's own configuration, measured beside the engine's defaults (``--baseline-config``)."""
    baseline_values: dict[str, Value] | None = None
    """The knobs ``baseline_config`` sets, as the backend read them."""
    seeds: list[tuple[dict[str, Value], str]] = field(default_factory=list)
    """Configurations tried right after the baseline (fitted to the space), each with why."""
    workers: int | None = None
    """Evaluation workers in this process (default: one per --gpus entry, else one)."""
    gpus: str | None = None
    """``all`` or CUDA device indices (``0,1``): one worker pinned to each."""
    artifacts: Path | None = None
    """The artifact store's folder (default: the study folder's ``artifacts``); a shared one
    lets workers on other hosts join."""
    allow_mixed_gpus: bool = False
    no_seeds: bool = False
    """Do not try the backend's every-speed-feature-on candidate right after the baseline."""
    keep_all_engines: bool = False
    """Keep every feasible candidate's engine, not only the baseline's and the fastest ones'."""
    warm_start: str | None = None
    """Studies (comma-separated, or ``auto``) whose best configurations are tried first."""
    folder: Path | None = None
    """The study folder, where the study recorded one (default ``studies/<study-name>``)."""
    engines_chosen: str = ""
    """Which engines ``--backend auto`` chose here, and why each other one was left out (one line)."""
    allow_io_change: bool = False
    """Let reduced-precision candidates take and return reduced-precision tensors (``keep_io_fp32``
    is searched); by default every candidate keeps the model's input and output dtypes."""

    def __post_init__(self) -> None:
        self._resolve_backend()
        _ = self.criterion  # parsed and checked here, once
        if self.metric is not None:
            self._fill("metric", absolute_spec(self.metric))
        self._check_search()
        self._resolve_objectives()
        if self.confirm_top < 0:
            raise UserError(f"--confirm-top must be 0 (off) or more, got {self.confirm_top}")
        if self.confirm_processes < 1:
            raise UserError(f"--confirm-processes must be at least 1, got {self.confirm_processes}")
        self._resolve_study()
        if self.measure.target_rel_ci <= 0 or self.measure.budget_s <= 0:
            raise UserError("[measure] target_rel_ci and budget_s must be positive")

    def _resolve_backend(self) -> None:
        """The backend known, and ``auto`` or a composition as the engines it names here."""
        if self.backend not in BACKENDS and ":" not in self.backend and not is_composition(self.backend):
            raise UserError(
                f"unknown backend {self.backend!r}; choose one of: {', '.join(BACKENDS)}, auto, a comma list of"
                " those (or module:Class)"
            )
        backend, chosen = resolved_spec(self.backend, self.model)
        if backend != self.backend:
            self._fill("backend", backend)
            self._fill("engines_chosen", chosen)

    def _check_search(self) -> None:
        """The samples, sampler, seed, workers and trial target within their ranges."""
        if self.samples is not None and self.samples < 1:
            raise UserError(f"--samples must be at least 1, got {self.samples}")
        if self.sampler not in SAMPLERS:
            raise UserError(f"unknown sampler {self.sampler!r}; choose one of: {', '.join(SAMPLERS)}")
        if self.seed is not None and not 0 <= self.seed < 2**32:  # the samplers' NumPy generators take no other
            raise UserError(f"--seed must be between 0 and 2**32 - 1 ({2**32 - 1}), got {self.seed}")
        if self.workers is not None and self.workers < 1:
            raise UserError(f"--workers must be at least 1, got {self.workers}")
        if self.n_trials is not None and self.n_trials < 1:
            raise UserError(f"--n-trials must be at least 1, got {self.n_trials}")

    def _resolve_objectives(self) -> None:
        """The objectives as a tuple, latency first, each known and given once."""
        given = self.objectives
        objectives = tuple(o.strip() for o in given.split(",") if o.strip()) if isinstance(given, str) else tuple(given)
        unknown = [o for o in objectives if o not in OBJECTIVES]
        if unknown or "latency" not in objectives or len(set(objectives)) != len(objectives):
            raise UserError(
                f"--objectives {','.join(objectives)!r}: give latency and any of error, memory, build_s, once each"
            )
        self._fill("objectives", ("latency", *[o for o in objectives if o != "latency"]))
        if self.dry_run and len(self.objectives) > 1:
            raise UserError("--dry-run has one objective, the build time; drop --objectives")

    def _resolve_study(self) -> None:
        """The trial target's default, and the study's name and storage (defaults, or checked)."""
        if self.n_trials is None and self.timeout_s is None:
            self._fill("n_trials", DEFAULT_N_TRIALS)
        if self.study_name is None:
            self._fill("study_name", default_study_name(self.model, self.backend))
        if not _NAME_RE.match(short_enough(self.study_name)):  # its folder is named after it
            raise UserError(f"study name {self.study_name!r} may hold only letters, digits, '.', '_' and '-'")
        if self.storage is None:
            self._fill("storage", default_storage(self.study_name))
        elif not is_url(self.storage):
            self._fill("storage", storage_url(self.storage))  # an SQLite file's path, as the readers take it

    def _fill(self, name: str, value: Any) -> None:
        """Set a default or a normal form while the config is made (it is frozen)."""
        object.__setattr__(self, name, value)

    @functools.cached_property
    def criterion(self) -> Criterion:
        """The accuracy criterion, parsed once."""
        return parse_criterion(self.accuracy, user_metrics=self.metric is not None)

    def _part(self, part: type[T]) -> T:
        """The typed part ``part`` of this configuration: each of its fields read by name."""
        return part(**{f.name: getattr(self, f.name) for f in fields(part)})

    @property
    def data(self) -> DataSource:
        """Where the model and data come from (what reading the inputs needs)."""
        return self._part(DataSource)

    @property
    def kind(self) -> StudyKind:
        """What a study of this configuration must share with a run that resumes it."""
        return self._part(StudyKind)

    @property
    def finalists(self) -> FinalistPlan:
        """How the search's finalists are re-measured."""
        return FinalistPlan(
            self.confirm_top,
            self.confirm_processes,
            self.measure,
            self.timeout_s,
            self.dry_run,
            self.baseline_config is not None,
            self.workdir,
        )

    @property
    def workdir(self) -> Path:
        """The study folder: cached inputs, reference outputs, transformed models, worker log."""
        assert self.study_name is not None
        return self.folder or StudyFolder.named(self.study_name).root


def config_from(values: dict[str, Any]) -> TuneConfig:
    """The TuneConfig of ``values`` (a tune.toml's, overlaid by the flags or keywords given); a
    UserError where they are not its arguments (no model among them)."""
    try:
        return TuneConfig(**values)
    except TypeError as exc:
        raise UserError(f"bad configuration: {exc}") from exc


_TOML_OPTIONS = {key: option for option in OPTIONS for key in option.toml_keys}


def _check_type(path: Path, key: str, value: Any, expected: str, types: tuple[type, ...]) -> None:
    """One line naming the key when a TOML value has the wrong type (a bool is no number here)."""
    wrong_type = isinstance(value, bool) and bool not in types or not isinstance(value, types)
    if wrong_type or isinstance(value, list) and not all(isinstance(v, str) for v in value):
        raise UserError(f"{path}: {key} must be {expected}, got {value!r}")


def measure_settings(path: Path | str, value: Any) -> MeasureSettings:
    """A [measure] table (``path``: where it was given, for the errors) as MeasureSettings, checked."""
    if not isinstance(value, dict):
        raise UserError(f"{path}: [measure] must be a table, e.g. [measure] budget_s = 2.0; got {value!r}")
    known = {f.name: f.type for f in fields(MeasureSettings)}
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise UserError(f"{path}: unknown [measure] key {unknown[0]!r}; known: {', '.join(sorted(known))}")
    for key, item in value.items():
        kind = known[key]
        wanted = (bool,) if kind == "bool" else (int,) if kind == "int" else (int, float)
        expected = {"bool": FLAG.expected, "int": INT.expected}.get(str(kind), "a number")
        _check_type(path, f"[measure] {key}", item, expected, wanted)
    return MeasureSettings(**value)


def read_toml(path: Path) -> dict[str, Any]:
    """Read a tune.toml into TuneConfig keyword arguments (flags given on the command line win)."""
    if not path.is_file():
        raise UserError(f"config file not found: {path}")
    try:
        data = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path} is not valid TOML: {exc}") from exc
    values: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = raw_key.replace("-", "_")
        if key == "measure":
            values["measure"] = measure_settings(path, value)
        elif key == "space":
            if not isinstance(value, dict):
                raise UserError(f"{path}: [space] must be a table of knob = values; got {value!r}")
            values["space"] = dict(value)
        elif key in _TOML_OPTIONS:
            option = _TOML_OPTIONS[key]
            _check_type(path, raw_key, value, option.kind.expected, option.kind.toml_types)
            values[option.field] = value
        else:
            raise UserError(f"{path}: unknown key {raw_key!r}")
    for option in OPTIONS:  # once every key's type is checked
        if option.field in values:
            values[option.field] = option.kind.from_toml(values[option.field], path.parent)
    return values
