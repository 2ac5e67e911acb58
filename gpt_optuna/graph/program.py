"""PyTorch programs (``torch.export.save``'d ``.pt2`` files) as models: the ONNX model the other
engines run, exported from the program once by torch's exporter, and the program an ONNX model so
made came from.

The ONNX model and a copy of the program are kept under the program's hash in the cache
(``$GPT_OPTUNA_CACHE/programs``, by default ``~/.cache/gpt_optuna/programs``), never beside the
user's file; the ONNX model names its program in its metadata (:data:`PROGRAM_KEY`), so that every
copy of it (a study's working copy) still leads to the program.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from gpt_optuna.core.errors import UserError
from gpt_optuna.core.files import atomic_path, locked
from gpt_optuna.graph.model import file_sha256, one_line

PROGRAM_SUFFIX = ".pt2"
PROGRAM_KEY = "gpt_optuna.program"
"""The ONNX metadata entry holding the absolute path of the program the model was exported from."""
PROGRAM_SHA_KEY = "gpt_optuna.program_sha256"
EXPORT_VERSION = "1"
"""Bumped when the export below changes what it writes: the cached ONNX models are made anew."""
OPSET = 18


def is_program(path: Path) -> bool:
    return path.suffix == PROGRAM_SUFFIX


def cache_root() -> Path:
    return Path(os.environ.get("GPT_OPTUNA_CACHE", Path.home() / ".cache" / "gpt_optuna")) / "programs"


def onnx_model(path: Path, timeout_s: float) -> Path:
    """The ONNX model at ``path``, or the one exported from the program there (:func:`onnx_of_program`)."""
    return onnx_of_program(path, timeout_s) if is_program(path) else path


def onnx_of_program(program: Path, timeout_s: float) -> Path:
    """The ONNX model exported from ``program`` (made once per program content, in a child process
    stopped after ``timeout_s``): a UserError in one line where the file is no program or torch's
    exporter cannot take it."""
    if not program.is_file():
        raise UserError(f"model file not found: {program}")
    sha = file_sha256(program)
    folder = cache_root() / f"{sha[:24]}-{EXPORT_VERSION}"
    out = folder / f"{program.stem}.onnx"
    kept = folder / f"program{PROGRAM_SUFFIX}"
    if out.is_file() and kept.is_file():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    with locked(out):
        if out.is_file() and kept.is_file():
            return out
        with atomic_path(kept) as tmp:
            shutil.copyfile(program, tmp)
        command = [sys.executable, "-m", __name__, str(kept), sha, str(out)]
        try:
            done = subprocess.run(command, capture_output=True, timeout=max(timeout_s, 1.0), check=False)
        except subprocess.TimeoutExpired:
            raise UserError(
                f"exporting {program} to ONNX did not end within {timeout_s:.0f} s: give the ONNX model too"
                " (export it with torch.onnx.export), or more time"
            ) from None
        if done.returncode != 0 or not out.is_file():
            lines = done.stderr.decode(errors="replace").strip().splitlines()
            reason = next((line for line in reversed(lines) if line.strip()), f"exit code {done.returncode}")
            raise UserError(f"{program} could not be exported to ONNX (the other engines run ONNX): {reason}")
    return out


def program_of(onnx_path: Path) -> Path | None:
    """The program an ONNX model was exported from (None for a model that was not), checked to be
    the file it was exported from: a UserError where it is gone or changed."""
    import onnx

    model = onnx.load(str(onnx_path), load_external_data=False)
    entries = {p.key: p.value for p in model.metadata_props}
    if PROGRAM_KEY not in entries:
        return None
    program = Path(entries[PROGRAM_KEY])
    if not program.is_file():
        raise UserError(f"the PyTorch program {onnx_path.name} was exported from is gone: {program}")
    if _sha_of(program) != entries.get(PROGRAM_SHA_KEY):
        raise UserError(f"the PyTorch program {onnx_path.name} was exported from has changed: {program}")
    return program


_SHAS: dict[tuple[Path, int, int], str] = {}


def _sha_of(path: Path) -> str:
    """The file's hash, computed once per process while its size and time of change stay."""
    stat = path.stat()
    key = (path, stat.st_size, stat.st_mtime_ns)
    if key not in _SHAS:
        _SHAS[key] = file_sha256(path)
    return _SHAS[key]


def load_program(path: Path) -> object:
    """The ``torch.export.ExportedProgram`` saved at ``path``; a UserError where it is none."""
    import torch

    try:
        return torch.export.load(str(path))
    except Exception as exc:  # a zip of something else, a program of a newer torch
        raise UserError(f"{path} is not a program torch.export.save wrote: {one_line(exc)}") from exc


def _export(program_path: Path, sha: str, out: Path) -> None:
    """The child process's work: export the program to ONNX at ``out`` with the program named in
    its metadata."""
    import onnx
    import torch

    program = load_program(program_path)
    with atomic_path(out, keep_suffix=True) as tmp:
        onnx_program = torch.onnx.export(program, (), dynamo=True, opset_version=OPSET, verbose=False)
        assert onnx_program is not None
        onnx_program.save(str(tmp))
        model = onnx.load(str(tmp))
        for key, value in ((PROGRAM_KEY, str(program_path.resolve())), (PROGRAM_SHA_KEY, sha)):
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value
        onnx.save(model, str(tmp))


if __name__ == "__main__":  # onnx_of_program's child: PROGRAM SHA256 OUT
    try:
        _export(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
    except UserError as exc:
        sys.exit(str(exc))
