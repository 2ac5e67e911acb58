"""A study is self-contained: made in one folder with an absolute storage, it is read, confirmed,
exported, opened and extended from any other, and every command the tuner prints next runs as
printed from there."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest

import gpt_optuna

CONFIG = """[measure]
budget_s = 0.05
[space]
precision = ["fp16"]
graph_optimization_level = "default"
intra_op_num_threads = [1, 2]
"""


def gpt_optuna_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpt_optuna.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def printed_commands(out: str) -> dict[str, str]:
    """The next-step lines (``report: gpt-optuna report ...``) by their label."""
    return {
        line.split(": ", 1)[0]: line.split(": ", 1)[1]
        for line in out.splitlines()
        if ": gpt-optuna " in line or "&& gpt-optuna" in line
    }


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A printed command run by a shell, with this interpreter's gpt-optuna first on PATH."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=600, env={**os.environ, "PATH": path}
    )


@pytest.mark.slow
def test_a_study_is_used_from_any_folder_and_its_printed_commands_run_as_printed(
    cnn_path: Path, tmp_path: Path
) -> None:
    made, elsewhere = tmp_path / "made", tmp_path / "elsewhere"
    made.mkdir()
    elsewhere.mkdir()
    (made / "tune.toml").write_text(CONFIG)
    storage = f"sqlite:///{tmp_path}/s.db"
    where = ["--storage", storage, "--study-name", "s"]
    tuned = gpt_optuna_cli(
        "tune",
        str(cnn_path),
        "--config",
        "tune.toml",
        *where,
        "--n-trials",
        "3",
        "--confirm-top",
        "0",
        "--quiet",
        cwd=made,
    )
    assert tuned.returncode == 0, tuned.stderr
    steps = printed_commands(tuned.stdout)
    assert "export the winner" not in steps  # search figures only: no export is offered yet
    if tuned.stdout.startswith("verdict: not confirmed"):
        assert set(steps) == {"extend with", "confirm the finalists", "report"}
    else:  # the baseline was the fastest in the search: nothing to confirm is pressed on the user
        assert tuned.stdout.startswith("verdict: keep the default configuration") and set(steps) == {
            "extend with",
            "report",
        }
        steps["confirm the finalists"] = f"gpt-optuna confirm {shlex.join(where)}"
    for label in ("confirm the finalists", "report"):
        ran = shell(steps[label], elsewhere)
        assert ran.returncode == 0, (label, ran.stderr)
    assert Path(steps["report"].rpartition(" -o ")[2]).is_file()
    status = gpt_optuna_cli("status", *where, cwd=elsewhere)
    assert status.returncode == 0 and "(confirmed)" in status.stdout, status.stderr

    fp16 = next(
        t for t in optuna.load_study(study_name="s", storage=storage).trials if "transformed_model" in t.user_attrs
    )
    exported = gpt_optuna_cli("export", *where, "--trial", str(fp16.number), "-o", "fp16", cwd=elsewhere)
    assert exported.returncode == 0, exported.stderr  # the transformed model is found in the study's folder
    ran = made / "studies/s/models" / fp16.user_attrs["transformed_model"]
    assert (elsewhere / "fp16.onnx").read_bytes() == ran.read_bytes()
    os.chdir(elsewhere)
    session = gpt_optuna.open_session("fp16.onnx")
    out = session.run(None, {"input": np.zeros((1, 3, 64, 64), np.float32)})[0]
    assert out.dtype == np.float32 and np.isfinite(out).all()
    again = gpt_optuna_cli("export", *where, "--trial", str(fp16.number), "-o", "fp16.onnx", cwd=elsewhere)
    assert again.returncode == 2 and "already exist" in again.stderr and "--force" in again.stderr
    side = json.loads((elsewhere / "fp16.onnx.json").read_text())
    assert side["trial"] == fp16.number and side["interface"]["changed"] is False

    extended = shell(steps["extend with"], elsewhere)
    assert extended.returncode == 0, extended.stderr
    assert "resuming study s" in extended.stderr and not (elsewhere / "studies").exists()
    target = int(shlex.split(steps["extend with"])[-1])
    assert len(optuna.load_study(study_name="s", storage=storage).trials) == target
