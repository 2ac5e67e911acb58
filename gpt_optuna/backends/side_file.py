"""The side file ``gpt-optuna export`` writes beside what it exports (``FILE.json``): one frozen
record, its writer and its one reader side by side, with the format it was written in. What an
engine adds (its deployment's ``side_file``: settings, command lines) travels in its own sections,
read by that engine's ``open_session``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from gpt_optuna.core.errors import UserError

FORMAT = 1
"""The side file's format, recorded in it as ``format`` (files written before it was versioned have none)."""


@dataclass(frozen=True)
class SideFile:
    """One export's record: which trial of which study, its configuration and figures (as ``best
    --json`` states them), the criterion and data it was judged on, the model's interface, and the
    engine's own sections. A field a file written by an earlier gpt-optuna lacks reads as None."""

    study: str | None = None
    trial: int | None = None
    backend: str | None = None
    params: dict[str, Any] | None = None
    headline: str | None = None
    decided: bool | None = None
    measurement: str | None = None
    latency_ms: float | None = None
    baseline_latency_ms: float | None = None
    speedup: float | None = None
    speedup_ci95: list[float] | None = None
    significant: bool | None = None
    search_latency_ms: float | None = None
    winner: bool | None = None
    verdict: str | None = None
    your_configuration: dict[str, Any] | None = None
    engine: str | None = None
    engine_defaults: dict[str, Any] | None = None
    latency: dict[str, Any] | None = None
    accuracy: dict[str, Any] | None = None
    accuracy_criterion: str | None = None
    metric: str | None = None
    shapes: dict[str, Any] | None = None
    interface: dict[str, Any] | None = None
    samples: dict[str, Any] | None = None
    """Each sample file (``inputs``, ``reference``): as written, its path relative to the side file;
    as a check reads it, the file's path."""
    confirmed: dict[str, Any] | None = None
    confirmed_baseline: dict[str, Any] | None = None
    versions: dict[str, str] | None = None
    file: str | None = None
    """What the exported file is: ``engine``, ``onnx model`` or ``pytorch program``."""
    model_sha256: str | None = None
    sections: dict[str, Any] = field(default_factory=dict)
    """What the engine's deployment added, by its keys (written at the top level of the file)."""
    present: frozenset[str] = frozenset()
    """The keys the file held (a reader tells an absent field from a null one)."""

    @classmethod
    def of(cls, record: dict[str, Any]) -> SideFile:
        """The record a side file's JSON object holds."""
        named = {f.name for f in fields(cls)} - {"sections", "present"}
        return cls(
            **{k: v for k, v in record.items() if k in named},
            sections={k: v for k, v in record.items() if k not in named and k != "format"},
            present=frozenset(record),
        )

    @classmethod
    def read(cls, path: str | Path) -> SideFile:
        """The side file ``PATH.json`` beside ``PATH``."""
        return cls.of(read_object(path))

    def to_json(self) -> str:
        """The file's text: ``format`` first, then each field, then the engine's sections."""
        written = {k: v for k, v in asdict(self).items() if k not in ("sections", "present")}
        return json.dumps({"format": FORMAT, **written, **self.sections}, indent=2)


def read_object(path: str | Path) -> dict[str, Any]:
    """The JSON object of the side file ``PATH.json`` beside ``PATH``, as written; a user error for
    a file that is missing, no JSON, or of a later format than this gpt-optuna reads."""
    side = Path(f"{path}.json")
    if not side.is_file():
        raise UserError(f"{side} is missing: open a file written by gpt-optuna export")
    try:
        record = json.loads(side.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{side} is not the JSON gpt-optuna export writes: {exc}") from exc
    written = record.get("format", FORMAT) if isinstance(record, dict) else FORMAT
    if not isinstance(written, int) or written > FORMAT:
        raise UserError(
            f"{side} is of format {written!r}, which a later gpt-optuna writes: this one reads format"
            f" {FORMAT} and earlier; upgrade gpt-optuna"
        )
    return record
