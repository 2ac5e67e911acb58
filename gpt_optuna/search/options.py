"""The tune options, each declared once: its flag, help, kind, and the TuneConfig field it fills.

The parser's flags, ``tune_config``'s mapping and the TOML keys and types are all read from ``OPTIONS``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpt_optuna.core.errors import UserError

SAMPLERS = ("tpe", "gp", "random", "nsga2")
DEFAULT_TOP = 5
"""How many of the best feasible candidates a re-measurement takes (tune's finalists, ``confirm``)."""
DEFAULT_PROCESSES = 5
"""Fresh processes a re-measurement or a comparison times in."""
DEFAULT_PROFILE_RUNS = 50
"""Runs a profile times each side over."""
DEFAULT_PROFILE_ROUNDS = 3
"""Rounds a profile takes, each side in a fresh process in each: what shows its spread."""
DEFAULT_CHECK_BUDGET = "10m"
"""A ``check``'s whole time."""
DEFAULT_TOLERANCE = "5%"
"""The latency change a ``check`` allows."""
_DURATION_RE = re.compile(r"^(?:(?P<h>\d+(?:\.\d+)?)h)?(?:(?P<m>\d+(?:\.\d+)?)m)?(?:(?P<s>\d+(?:\.\d+)?)s?)?$")


def parse_duration(text: str | float | int) -> float:
    """Seconds from ``8h``, ``30m``, ``1h30m``, ``90s`` or a plain number of seconds."""
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        match = _DURATION_RE.match(text.strip())
        if not text.strip() or not match or not any(match.groupdict().values()):
            raise UserError(f"malformed duration {text!r}: use e.g. 8h, 30m, 1h30m, 90s or 90")
        seconds = sum(float(match[u] or 0) * k for u, k in (("h", 3600), ("m", 60), ("s", 1)))
    if seconds <= 0:
        raise UserError(f"duration must be positive, got {text!r}")
    return seconds


def parse_tolerance(text: str | float) -> float:
    """``5%``, ``0.05`` (or the number 0.05) as a fraction."""
    try:
        if isinstance(text, str):
            value = float(text.strip().removesuffix("%")) / (100 if text.strip().endswith("%") else 1)
        else:
            value = float(text)
    except ValueError:
        raise UserError(f"malformed --tolerance {text!r}: use e.g. 5% or 0.05") from None
    if not 0 <= value < 1:
        raise UserError(f"--tolerance must be a fraction below 1 (0.05) or a percentage below 100 (5%), got {text!r}")
    return value


def optional_path(text: str | Path | None) -> Path | None:
    """A path given, None where none was (or an empty flag)."""
    return Path(text) if text else None


def _file(value: str, folder: Path) -> Path:
    """A TOML file or folder relative to the TOML file's folder; a data loader (``module:function``,
    not a file or folder) as it is."""
    loader = ":" in value and not (folder / value).exists() and not Path(value).exists()
    return Path(value) if loader else folder / value


@dataclass(frozen=True)
class Kind:
    """What an option's value is: its flag's argparse keywords, the TOML types it takes (``expected`` names
    them in errors), and how the flag's value (None or empty: not given) and a TOML value become the field's."""

    expected: str
    toml_types: tuple[type, ...]
    argparse: dict[str, Any] = dataclasses.field(default_factory=dict)
    from_flag: Callable[[Any], Any] = lambda given: given
    from_toml: Callable[[Any, Path], Any] = lambda value, folder: value


TEXT = Kind("a string", (str,))
INT = Kind("an integer", (int,), {"type": int})
FLAG = Kind("true or false", (bool,), {"action": "store_true", "default": None})
"""An absent flag is None, so that it leaves the TOML value."""
DURATION = Kind(
    'a duration (e.g. "8h" or seconds)',
    (str, int, float),
    from_flag=lambda text: parse_duration(text) if text else None,
    from_toml=lambda value, folder: parse_duration(value),
)
FILE = Kind("a string", (str,), from_flag=optional_path, from_toml=_file)
FOLDER = Kind("a string", (str,), from_flag=optional_path, from_toml=lambda value, folder: folder / value)
TEXTS = Kind("a string or a list of strings", (str, list))
"""Comma-separated in one string, or a list."""
TEXT_LIST = Kind(
    "a string or a list of strings",
    (str, list),
    {"action": "append"},
    from_toml=lambda value, folder: [value] if isinstance(value, str) else value,
)
"""A repeatable flag; in TOML one string or a list."""


@dataclass(frozen=True)
class Option:
    """One tune option. With a ``field`` it is settable in TOML by its name (``n_trials``) and ``toml_aliases``;
    without, the command reads it itself (``--config``)."""

    flag: str
    field: str | None
    kind: Kind
    help: str
    argparse: dict[str, Any] = dataclasses.field(default_factory=dict)
    """argparse keywords beyond the kind's."""
    toml_aliases: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def toml_keys(self) -> tuple[str, ...]:
        return (self.dest, *self.toml_aliases) if self.field else ()


OPTIONS: tuple[Option, ...] = (
    Option("model", "model", FILE, "ONNX model file (or `model` in --config)", {"nargs": "?"}),
    Option(
        "--backend",
        "backend",
        TEXT,
        "onnxruntime (default), tensorrt (10.x/11.x), tensorrt-rtx, or package.module:Class; several separated by"
        " commas, or auto (every engine that runs here), are searched in one study: --backend onnxruntime,tensorrt",
    ),
    Option(
        "--accuracy", "accuracy", TEXT, 'criterion, e.g. "cosine>=0.9999 and max_abs<=1e-2" (default cosine>=0.9999)'
    ),
    Option(
        "--inputs",
        "inputs",
        FILE,
        "input samples: an .npz keyed by input name (a leading sample axis for several), a folder of "
        ".npz files, or a data loader module:function / script.py:function yielding feed dicts "
        "(default: one generated batch)",
    ),
    Option("--samples", "samples", INT, "use at most this many samples of --inputs"),
    Option(
        "--metric",
        "metric",
        TEXT,
        "module:function (or script.py:function) computing task metrics from the outputs, reference "
        "outputs and inputs of all samples; its names can be used in --accuracy, e.g. top1_agree>=0.99",
    ),
    Option(
        "--calibration",
        "calibration",
        FILE,
        "int8/fp8 calibration samples, in any form --inputs takes (default: the --inputs samples)",
    ),
    Option(
        "--shape",
        "shapes",
        TEXT_LIST,
        "input shape, e.g. x:1x3x224x224",
        {"metavar": "NAME:DIMS"},
        toml_aliases=("shapes",),
    ),
    Option("--n-trials", "n_trials", INT, "trials the study should hold when done (default 100 without --timeout)"),
    Option("--timeout", "timeout_s", DURATION, "stop after this long, e.g. 8h, 30m, 90s"),
    Option("--trial-timeout", "trial_timeout_s", DURATION, "deadline for one candidate (default 600 s)"),
    Option(
        "--storage",
        "storage",
        TEXT,
        "Optuna storage URL or an SQLite file's path (default sqlite:///studies/<study-name>.db)",
    ),
    Option(
        "--study-name",
        "study_name",
        TEXT,
        "study name (default: the model file's name and the backend, e.g. resnet50-onnxruntime)",
    ),
    Option(
        "--sampler",
        "sampler",
        TEXT,
        "tpe (default), gp (needs the gp extra), random or nsga2",
        {"choices": SAMPLERS},
    ),
    Option("--seed", "seed", INT, "sampler seed, 0 to 2**32 - 1"),
    Option(
        "--baseline-config",
        "baseline_config",
        FILE,
        "your own configuration, measured beside the engine's defaults and named in the verdict: ONNX Runtime"
        " providers, session_options and session_config_entries (TOML or JSON, an export's side file too);"
        " trtexec flags for TensorRT",
    ),
    Option("--config", None, TEXT, "tune.toml with the same keys, plus [measure] and [space] tables"),
    Option("--dry-run", "dry_run", FLAG, "build every candidate without running it; the value is the build time"),
    Option(
        "--confirm-top",
        "confirm_top",
        INT,
        f"finalists re-measured with the baseline after the search (default {DEFAULT_TOP}, 0: off)",
    ),
    Option(
        "--confirm-processes",
        "confirm_processes",
        INT,
        f"fresh processes the finalists are re-measured in (default {DEFAULT_PROCESSES})",
    ),
    Option(
        "--objectives",
        "objectives",
        TEXTS,
        "latency (default), or latency with any of error, memory (TensorRT), build_s: a multi-objective "
        "search, e.g. --objectives latency,error",
    ),
    Option("--workers", "workers", INT, "evaluation workers in parallel (default: one per --gpus entry, else one)"),
    Option("--gpus", "gpus", TEXT, "GPUs to search on, one worker pinned to each: all, or indices such as 0,1"),
    Option(
        "--allow-mixed-gpus",
        "allow_mixed_gpus",
        FLAG,
        "let workers on different GPU models search one study (their latencies are ranked together)",
    ),
    Option(
        "--artifacts",
        "artifacts",
        FOLDER,
        "artifact store folder for engines and the study's data (default studies/<study>/artifacts); "
        "a folder every host mounts lets workers on other hosts join",
    ),
    Option(
        "--keep-all-engines",
        "keep_all_engines",
        FLAG,
        "keep every feasible candidate's engine in the artifact store (default: the baseline's and the fastest"
        " ones', at least 10 and --confirm-top)",
    ),
    Option(
        "--no-seeds",
        "no_seeds",
        FLAG,
        "do not try the backend's every-speed-feature-on candidate right after the baseline",
    ),
    Option(
        "--warm-start",
        "warm_start",
        TEXT,
        "try first the best configurations of these studies in the same storage (comma-separated), "
        "or auto: every finished study of this backend measured on this device",
    ),
    Option(
        "--allow-io-change",
        "allow_io_change",
        FLAG,
        "let fp16/bf16 candidates take and return fp16/bf16 tensors (TOML: allow_io_change = true); "
        "by default every candidate keeps the model's input and output names, dtypes and ranks",
    ),
)
"""In ``gpt-optuna tune --help`` order."""
