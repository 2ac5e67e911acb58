"""The record a ``check`` judges against: the side file ``gpt-optuna export`` wrote, read field by
field (each problem one line, a user error), its samples, its input shapes, its exported model."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

from gpt_optuna.backends.side_file import SideFile, read_object
from gpt_optuna.core.errors import UserError
from gpt_optuna.graph import feeds as feeds_io
from gpt_optuna.graph import model as model_io
from gpt_optuna.graph.feeds import absolute_spec, script_spec
from gpt_optuna.protocol.accuracy import Criterion, parse_criterion


def _malformed(path: Path, what: str) -> UserError:
    return UserError(f"{path} is not a record gpt-optuna export writes: {what}; export the study again")


def load_record(path: Path, metric: str | None = None) -> tuple[SideFile, Criterion]:
    """The export's side file, checked field by field (each problem one line, a user error), with
    the paths of its sample files resolved beside it, and its metric as this host finds it
    (:func:`recorded_metric`; ``metric``, check --metric, replaces it); and its accuracy criterion."""
    if path.suffix != ".json":
        raise UserError(f"--baseline takes the record FILE.json that gpt-optuna export -o FILE wrote, not {path}")
    record = read_object(path.with_suffix(""))
    if not isinstance(record, dict):
        raise _malformed(path, f"it holds {json.dumps(record)[:40]}, not an object")
    for key, kinds, what in _FIELDS:
        value = record.get(key)
        if key not in record or not isinstance(value, kinds) or isinstance(value, bool) and bool not in kinds:
            raise _malformed(path, f"{key} must be {what}, got {json.dumps(value)[:80]}")
    if record.get("latency_ms") is None:
        raise UserError(f"{path} has no latency (a dry-run study?): export a measured trial")
    if not record["latency_ms"] > 0:
        raise _malformed(path, f"latency_ms must be positive, got {record['latency_ms']}")
    params = record["params"]
    if not all(isinstance(v, str | int | float | bool) or v is None for v in params.values()):
        raise _malformed(path, "params must map knob names to plain values")
    samples = record["samples"]
    if set(samples) != {"inputs", "reference"} or not all(isinstance(v, str) for v in samples.values()):
        raise _malformed(path, 'samples must be {"inputs": FILE, "reference": FILE}')
    found = {kind: path.parent / name for kind, name in samples.items()}
    for file in found.values():
        if not file.is_file():
            raise UserError(f"{path} needs {file} beside it (written by the same export)")
    metric_spec = recorded_metric(path, record.get("metric"), metric)
    try:
        criterion = parse_criterion(record["accuracy_criterion"], user_metrics=metric_spec is not None)
    except UserError as exc:
        raise _malformed(path, f"accuracy_criterion: {exc}") from None
    return replace(SideFile.of(record), samples=found, metric=metric_spec), criterion


def recorded_metric(path: Path, recorded: str | None, given: str | None) -> str | None:
    """The record's metric function as this host runs it: ``given`` (check --metric) where there is
    one; a module name as it is; a script by its path relative to the record (records exported
    before named it by its absolute path), else the script of that name beside the record."""
    if given is not None:
        if recorded is None:
            raise UserError(f"{path} was made without --metric: its accuracy criterion uses none to replace")
        return absolute_spec(given)
    if recorded is None:
        return None
    script = script_spec(recorded)
    if script is None:
        return recorded
    target, name = script
    places = list(dict.fromkeys([path.parent / target, path.parent / Path(target).name]))
    for place in places:
        if place.is_file():
            return f"{place.resolve()}:{name}"
    looked = " or ".join(str(p) for p in places)
    raise UserError(
        f"the record's metric {recorded} is not found ({looked}): copy the script beside the record, or name"
        " it: check --metric script.py:function (or an importable module:function)"
    )


_FIELDS: tuple[tuple[str, tuple[type, ...], str], ...] = (
    ("backend", (str,), "an engine name"),
    ("params", (dict,), "an object of knob values"),
    ("accuracy_criterion", (str,), "a criterion such as cosine>=0.9999"),
    ("samples", (dict,), "an object naming the sample files"),
    ("latency_ms", (int, float, type(None)), "a number of milliseconds"),
    ("shapes", (dict, type(None)), "an object of input shape ranges"),
    ("metric", (str, type(None)), "module:function"),
    ("interface", (dict, type(None)), "an object describing the inputs and outputs"),
)
"""The record's fields a check reads: name, accepted types, what they must be."""


def recorded_latency(record: SideFile) -> float:
    """The record's latency: the one its study judged its winner by (confirmed where it was confirmed)."""
    if "measurement" not in record.present and isinstance(record.confirmed, dict):  # exported before it said which
        return float(record.confirmed["median_ms"])
    return float(record.latency_ms)  # type: ignore[arg-type]  (load_record checked it)


def read_samples(record: SideFile, info: model_io.ModelInfo) -> tuple[list[model_io.Feeds], list[model_io.Feeds]]:
    """The recorded inputs and reference outputs, checked against the model's inputs and outputs."""
    loaded = []
    files = record.samples or {}
    for kind in ("inputs", "reference"):
        try:
            loaded.append(feeds_io.read_npz(files[kind]))
        except Exception as exc:  # a truncated or foreign file
            raise UserError(f"cannot read the record's {files[kind]}: {exc}") from None
    inputs, references = loaded
    for kind, arrays, specs in (("inputs", inputs, info.inputs), ("outputs", references, info.outputs)):
        names = sorted(spec.name for spec in specs)
        if sorted(arrays) != names:
            raise UserError(
                f"the record's {kind} ({', '.join(sorted(arrays))}) are not the model's ({', '.join(names)}):"
                " check the model against its own record"
            )
    return feeds_io.unstack(inputs), feeds_io.unstack(references)


def shape_flags(record: SideFile) -> list[str]:
    """The record's input shapes as ``--shape`` flags (a scalar input has none to give)."""
    return [
        f"{name}:" + "/".join("x".join(str(d) for d in dims) for dims in ranges)
        for name, ranges in (record.shapes or {}).items()
        if any(ranges)
    ]


def exported_model(record_path: Path, record: SideFile) -> tuple[Path | None, str]:
    """The record's exported model where it is beside the record, unchanged, and can be timed here
    (an ONNX Runtime model); else None and why."""
    path = record_path.with_name(record_path.name.removesuffix(".json"))
    if record.backend != "onnxruntime" or path.suffix != ".onnx":
        return None, f"a {record.backend} record's engine is not timed here"
    if not path.is_file():
        return None, f"the record's model {path} is not beside it"
    if hashlib.sha256(path.read_bytes()).hexdigest() != record.model_sha256:
        return None, f"the record's model {path} changed since it was exported"
    return path, ""
