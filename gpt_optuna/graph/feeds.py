"""Input feeds and samples: read, checked against the model, generated, stacked and cached."""

from __future__ import annotations

import hashlib
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from gpt_optuna.core.errors import UserError
from gpt_optuna.core.files import atomic_path, atomic_write
from gpt_optuna.graph.model import Feeds, ModelInfo, ShapeRange, check_shape, file_sha256, one_line


def _read_npz_file(npz_path: Path, what: str) -> Feeds:
    if not npz_path.is_file():
        raise UserError(f"{what} file not found: {npz_path}")
    if not zipfile.is_zipfile(npz_path):
        raise UserError(f"{npz_path} is not an .npz archive (arrays saved by numpy.savez, keyed by input name)")
    try:
        with np.load(npz_path, allow_pickle=False) as data:
            arrays = {key: np.ascontiguousarray(data[key]) for key in data.files}
    except Exception as exc:
        raise UserError(f"{npz_path} is not a readable .npz file: {one_line(exc)}") from exc
    if not arrays:
        raise UserError(f"{npz_path} holds no arrays: save the {what}, keyed by input name, with numpy.savez")
    return arrays


def check_feeds(npz_path: Path, feeds: Feeds, info: ModelInfo, shapes: dict[str, ShapeRange]) -> None:
    """Names, dtypes and shapes of one set of inputs against the model, naming the culprit."""
    expected = {spec.name for spec in info.inputs}
    missing = sorted(expected - feeds.keys())
    extra = sorted(feeds.keys() - expected)
    if missing:
        raise UserError(f"{npz_path} lacks model input {missing[0]!r} (it has: {', '.join(sorted(feeds))})")
    if extra:
        raise UserError(f"{npz_path} has {extra[0]!r}, which is not a model input ({', '.join(sorted(expected))})")
    for spec in info.inputs:
        array = feeds[spec.name]
        if array.dtype != spec.dtype:
            raise UserError(
                f"{npz_path}: input {spec.name!r} is {array.dtype.name}, the model expects {spec.describe()}"
            )
        check_shape(spec, tuple(array.shape), str(npz_path))
        if spec.name in shapes and tuple(array.shape) != shapes[spec.name].opt:
            raise UserError(
                f"{npz_path}: input {spec.name!r} has shape {'x'.join(map(str, array.shape))}, "
                f"but --shape says {'x'.join(map(str, shapes[spec.name].opt))}"
            )


def load_feeds(path: str | Path, info: ModelInfo, shapes: dict[str, ShapeRange]) -> Feeds:
    """Read an .npz keyed by input name and check names, dtypes and shapes against the model."""
    feeds = _read_npz_file(Path(path), "inputs")
    check_feeds(Path(path), feeds, info, shapes)
    return feeds


def load_samples(
    source: str | Path,
    info: ModelInfo,
    shapes: dict[str, ShapeRange],
    limit: int | None = None,
    what: str = "inputs",
    load: Callable[[str], list[Feeds]] | None = None,
) -> list[Feeds]:
    """Samples from an .npz (one sample, or arrays with one more leading axis: several), a folder
    of such files (in name order), or a data loader ``module:function`` / ``script.py:function``
    returning an iterable of feed dicts (Polygraphy's convention), called by ``load`` (default:
    :func:`loaded_samples`, in this process). Each sample is checked like --inputs and all must
    share one shape; ``limit`` keeps the first ones."""
    path = Path(source)
    if path.is_dir():
        files = sorted(path.glob("*.npz"))
        if not files:
            raise UserError(f"{path} holds no .npz files")
        samples = [s for f in files for s in _npz_samples(f, info, what)]
    elif ":" in str(source) and not path.is_file():
        samples = (load or loaded_samples)(str(source))
    else:
        samples = _npz_samples(path, info, what)
    samples = samples[:limit] if limit else samples
    if not samples:
        raise UserError(f"{source} gives no {what} samples")
    for index, sample in enumerate(samples):
        check_feeds(Path(f"{source} (sample {index})"), sample, info, shapes)
        if any(sample[n].shape != samples[0][n].shape for n in sample):
            raise UserError(f"{source}: sample {index} has other shapes than sample 0; give samples of one shape")
    return samples


def _npz_samples(path: Path, info: ModelInfo, what: str) -> list[Feeds]:
    arrays = _read_npz_file(path, what)
    ranks = {spec.name: len(spec.shape) for spec in info.inputs}
    stacked = {n: a[None] if n in ranks and a.ndim == ranks[n] else a for n, a in arrays.items()}
    if len({len(a) for a in stacked.values()}) != 1:
        counts = ", ".join(f"{n} {len(a)}{'' if n in ranks else ' (not a model input)'}" for n, a in stacked.items())
        raise UserError(f"{path}: its arrays hold different numbers of samples: {counts}")
    return unstack(stacked)


def loaded_samples(spec: str) -> list[Feeds]:
    """The feeds a user's data loader yields."""
    function = load_function(spec, "--inputs data loader")
    try:
        samples = [dict(feeds) for feeds in function()]
    except Exception as exc:
        raise UserError(f"the data loader {spec} failed: {type(exc).__name__}: {one_line(exc)}") from exc
    return [{name: _contiguous(np.asarray(array)) for name, array in feeds.items()} for feeds in samples]


def _contiguous(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array of the same rank (``np.ascontiguousarray`` makes a scalar 1-d)."""
    return array if array.flags.c_contiguous else array.copy(order="C")


def check_numeric_inputs(info: ModelInfo) -> None:
    """A UserError naming the first input that holds strings: candidates are fed numbers only."""
    for spec in info.inputs:
        if spec.dtype.kind in "OSU":
            raise UserError(
                f"{info.path}: input {spec.name!r} is a string tensor ({spec.describe()}); gpt-optuna tunes models"
                " whose inputs are numbers or booleans"
            )


def script_spec(spec: str) -> tuple[str, str] | None:
    """The script and the function of ``script.py:function``; None for ``module:function``."""
    target, colon, name = spec.rpartition(":")
    return (target, name) if colon and target.endswith(".py") else None


def absolute_spec(spec: str) -> str:
    """``script.py:function`` with the script's absolute path (a module name stays as it is), so
    that the study's record names the same function from any directory."""
    script = script_spec(spec)
    return f"{Path(script[0]).resolve()}:{script[1]}" if script else spec


def relative_spec(spec: str, folder: Path) -> str:
    """``script.py:function`` with the script's path relative to ``folder`` (a module name stays as
    it is), so that a record in ``folder`` names the same function wherever the two move together."""
    script = script_spec(spec)
    if script is None:
        return spec
    target, name = script
    try:
        return f"{Path(os.path.relpath(Path(target).resolve(), folder.resolve())).as_posix()}:{name}"
    except ValueError:  # another drive: no relative path leads there
        return absolute_spec(spec)


def load_function(spec: str, what: str) -> Any:
    """``module:function`` (importable, or from the working directory) or ``path/script.py:function``."""
    import importlib
    import importlib.util
    import sys

    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise UserError(f"{what} {spec!r}: expected module:function or script.py:function")
    try:
        if target.endswith(".py"):
            module_spec = importlib.util.spec_from_file_location(Path(target).stem, target)
            if module_spec is None or module_spec.loader is None or not Path(target).is_file():
                raise UserError(f"{what} {spec!r}: no such file {target}")
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            if str(Path.cwd()) not in sys.path:
                sys.path.insert(0, str(Path.cwd()))
            module = importlib.import_module(target)
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"{what} {spec!r} cannot be loaded: {type(exc).__name__}: {one_line(exc)}") from exc
    function = getattr(module, name, None)
    if not callable(function):
        raise UserError(f"{what} {spec!r}: {target} has no function {name!r}")
    return function


def stack(samples: list[Feeds]) -> Feeds:
    """Samples as arrays with a leading sample axis."""
    return {name: np.stack([s[name] for s in samples]) for name in samples[0]}


def unstack(arrays: Feeds) -> list[Feeds]:
    """Arrays with a leading sample axis as a list of samples."""
    count = len(next(iter(arrays.values()))) if arrays else 0
    # array[i, ...] keeps a scalar input's sample a 0-d array (array[i] would be a numpy scalar)
    return [{name: array[i, ...] for name, array in arrays.items()} for i in range(count)]


def samples_sha256(samples: list[Feeds]) -> str:
    """The data's content hash: of the one sample's arrays, as studies of one sample record it, or
    of the stacked samples."""
    return feeds_sha256(samples[0] if len(samples) == 1 else stack(samples))


def load_calibration(
    path: str | Path, info: ModelInfo, shapes: dict[str, ShapeRange], load: Callable[[str], list[Feeds]] | None = None
) -> Feeds:
    """Calibration samples stacked on a leading axis, from any source :func:`load_samples` reads."""
    return stack(load_samples(path, info, shapes, what="calibration", load=load))


def synthetic_feeds(info: ModelInfo, shapes: dict[str, ShapeRange], seed: int = 0) -> Feeds:
    """Deterministic inputs from the input specs: N(0,1) floats, 0/1 integers and booleans.

    Integers stay in {0, 1} so that index inputs (token ids, masks) are valid for any table.
    """
    rng = np.random.default_rng(seed)
    feeds: Feeds = {}
    for spec in info.inputs:
        shape = shapes[spec.name].opt
        if np.issubdtype(spec.dtype, np.floating):
            feeds[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
        elif spec.dtype == np.bool_ or np.issubdtype(spec.dtype, np.integer):
            feeds[spec.name] = rng.integers(0, 2, shape).astype(spec.dtype)
        else:
            raise UserError(
                f"cannot generate data for input {spec.describe()}; give real inputs with --inputs FEEDS.npz"
            )
    return feeds


def feeds_sha256(feeds: Feeds) -> str:
    digest = hashlib.sha256()
    for name in sorted(feeds):
        array = np.ascontiguousarray(feeds[name])
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def save_npz(path: Path, arrays: Feeds) -> None:
    """Write atomically so an interrupted run never leaves a half-written cache file, nor a
    temporary one after a failure (a full disk, say)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, tmp.open("wb") as f:
        np.savez(f, **arrays)


def cache_npz(path: Path, arrays: Feeds, key: str) -> None:
    """Save ``arrays`` unless ``path`` already holds them: a stamp beside it (``NAME.key``) names
    the content and the file's SHA-256; it is written after the data, so a stamp never vouches for
    a partial file, and a file changed since (corrupted, truncated) is written again."""
    stamp = path.with_name(path.name + ".key")
    if path.is_file() and stamp.is_file() and stamp.read_text() == f"{key}\n{file_sha256(path)}":
        return
    stamp.unlink(missing_ok=True)
    save_npz(path, arrays)
    atomic_write(stamp, f"{key}\n{file_sha256(path)}")


NEAR_CONSTANT = 1e-5
"""An output whose values span less than this (relative to its largest magnitude, at least 1)
is near-constant: ``cosine`` and relative metrics mean little on it."""


def check_reference(references: list[Feeds], generated: bool, notes: list[str]) -> None:
    """Refuse reference outputs that are NaN or Inf (nothing can be judged against them); warn
    when one is near-constant on generated inputs (a detector's map is all background on noise)."""
    for name, values in stack(references).items():
        if values.dtype.kind not in "fc":
            continue
        if not np.all(np.isfinite(values)):
            raise UserError(
                f"the model's own output {name!r} is NaN or Inf on these inputs: no candidate can be judged "
                "against it; give inputs it was made for with --inputs"
            )
        span = float(np.ptp(values)) if values.size else 0.0
        if generated and span <= NEAR_CONSTANT * max(1.0, float(np.abs(values).max(initial=0.0))):
            notes.append(
                f"warning: output {name!r} is near-constant on the generated inputs (its values span {span:.3g}),"
                " so cosine and relative metrics mean little: give real inputs with --inputs, or judge it with"
                " max_abs"
            )


def read_npz(path: Path) -> Feeds:
    with np.load(path, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}
