"""What the inductor engine's exported trial ships, read by the tuner and export without the engine
itself: the program a model was exported from, the compile settings of a candidate, the side file's
section (timed in a fresh process), and where a study keeps Inductor's caches."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpt_optuna.backends.base import ExportedTrial
from gpt_optuna.backends.inductor.deploy import CACHE_SUFFIX, SECTION
from gpt_optuna.backends.inductor.fresh import compiled_fresh
from gpt_optuna.backends.inductor.knobs import CUDAGRAPHS, PRECISION, SDPA_BACKEND, compile_options
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.space import Candidate
from gpt_optuna.graph.program import program_of

CACHE_FOLDER = "inductor"
"""Inductor's caches (compiled graphs, kernels, autotuning results), in the study folder: trials of
one configuration compile once, and a resumed study finds them."""
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def inductor_caches(folder: Path) -> Path:
    """Where a study's compiles keep Inductor's caches: the folder ``TORCHINDUCTOR_CACHE_DIR``
    names where it is set (the user's own, shared), else :data:`CACHE_FOLDER` in ``folder`` (the engine's caches);
    absolute, since Inductor's compilers run in other folders."""
    given = os.environ.get(CACHE_ENV)
    return (Path(given) if given else folder / CACHE_FOLDER).resolve()


def needs_program(onnx_path: Path) -> Path:
    """The program the ONNX model at ``onnx_path`` was exported from (what an export ships); a
    UserError where it is an ONNX model of its own."""
    program = program_of(onnx_path)
    if program is None:
        raise UserError(
            "the inductor engine compiles PyTorch programs: give the model as a .pt2 file (torch.export.save of"
            " torch.export.export(model, example_inputs)); an ONNX model has none"
        )
    return program


def settings_of(candidate: Candidate, device: str) -> dict[str, Any]:
    """What :class:`CompiledProgram` takes for ``candidate`` (the export's side file keeps it)."""
    return {
        "options": compile_options(candidate),
        "precision": candidate.get(PRECISION, "fp32"),
        "sdpa_backend": candidate.get(SDPA_BACKEND, "default"),
        "device": device,
    }


def side_file(trial: ExportedTrial) -> dict[str, Any]:
    """What :func:`~gpt_optuna.backends.inductor.deploy.load` compiles the exported program with
    (the trial's settings, on the device it was tuned on), and what that compile took and its latency
    in a fresh process (:func:`compiled_fresh`, which writes the caches shipped beside it)."""
    device = "cuda" if CUDAGRAPHS in trial.params else "cpu"  # the knob is offered on the GPU alone
    settings = settings_of(dict(trial.params), device)
    cache = trial.out.with_name(trial.out.name + CACHE_SUFFIX)
    fresh = compiled_fresh(trial.out, settings, trial.inputs, inductor_caches(trial.paths.caches), cache)
    return {SECTION: settings, "fresh_process": fresh}
