"""What an export ships is what was tuned, and nothing of the user's is lost writing it: targets
that are the study's own files refused, a replaced model or moved weights refused, a killed export
left as one the same command completes. Real child processes, real files, real SIGKILL."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import matmul_model, save
from test_faults import CLI, gpt_optuna, one_line_error

from gpt_optuna.testing.wide_matmul import save_wide_matmul


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tuned(model: Path) -> None:
    result = gpt_optuna("tune", str(model), "--study-name", "S", "--n-trials", "2", "--confirm-top", "0", "--quiet")
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_a_target_the_study_reads_is_refused_and_left_as_it_is(cnn_path: Path) -> None:
    tuned(cnn_path)
    db = Path("studies/S.db")
    before = {cnn_path: sha(cnn_path), db: sha(db)}
    one_line_error(gpt_optuna("export", "--study-name", "S", "-o", str(cnn_path), "--force"), "which the study reads")
    one_line_error(gpt_optuna("export", "--study-name", "S", "-o", str(db), "--force"), "which the study reads")
    one_line_error(gpt_optuna("report", "--study-name", "S", "-o", str(db)), "which the study reads")
    one_line_error(gpt_optuna("export", "--study-name", "S", "-o", "studies/S/best.onnx"), "inside the study's folder")
    triton = ["--format", "triton", "-o", "studies", "--model-name", "S", "--force"]
    one_line_error(gpt_optuna("export", "--study-name", "S", *triton), "inside the study's folder")
    assert {path: sha(path) for path in before} == before
    assert gpt_optuna("export", "--study-name", "S", "-o", "best").returncode == 0


@pytest.mark.slow
def test_a_model_replaced_after_tuning_is_not_shipped(cnn_path: Path, tmp_path: Path) -> None:
    tuned(cnn_path)
    save(matmul_model(batch=2), cnn_path)  # another valid model under the tuned one's name
    for args in (["--trial", "0"], []):
        one_line_error(gpt_optuna("export", "--study-name", "S", "-o", "out", *args), "has changed since")
    cnn_path.write_text("notes, not a model\n")
    one_line_error(gpt_optuna("export", "--study-name", "S", "-o", "out", "--trial", "0"), "has changed since")
    (tmp_path / "repo").mkdir()
    one_line_error(gpt_optuna("export", "--study-name", "S", "--format", "triton", "-o", "repo"), "has changed since")
    assert not list(Path().glob("out*")) and not list((tmp_path / "repo").iterdir())


@pytest.mark.slow
def test_external_weights_moved_or_changed_are_refused(tmp_path: Path) -> None:
    model = save_wide_matmul(tmp_path / "wide.onnx", 2, "wide.weights")
    tuned(model)
    weights = tmp_path / "wide.weights"
    kept = weights.read_bytes()
    weights.rename(tmp_path / "elsewhere")
    one_line_error(gpt_optuna("export", "--study-name", "S", "-o", "out", "--trial", "0"), "are gone")
    weights.write_bytes(kept[:-4] + b"\0\0\0\0")
    one_line_error(gpt_optuna("export", "--study-name", "S", "-o", "out", "--trial", "0"), "have changed since")
    one_line_error(gpt_optuna("confirm", "--study-name", "S"), "have changed since")  # nor timed as if tuned
    weights.write_bytes(kept)
    assert gpt_optuna("export", "--study-name", "S", "-o", "out", "--trial", "0").returncode == 0


def started(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*CLI, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def killed_while_writing(args: list[str], folder: Path, attempts: int = 8) -> bool:
    """Start ``export ARGS`` and SIGKILL it as soon as anything new appears in ``folder`` (where it
    writes); whether a kill landed before the export ended (else what it wrote is removed again)."""
    before = set(folder.iterdir())
    for _ in range(attempts):
        run = started(args)
        while run.poll() is None and set(folder.iterdir()) == before:
            time.sleep(0.001)
        if run.poll() is None:
            os.kill(run.pid, signal.SIGKILL)
            run.wait()
            return True
        for left in set(folder.iterdir()) - before:
            subprocess.run(["rm", "-rf", str(left)], check=True)
    return False


@pytest.mark.slow
@pytest.mark.parametrize("form", ["file", "file over an export", "triton"])
def test_an_export_killed_midway_leaves_the_old_files_and_the_same_command_works(tmp_path: Path, form: str) -> None:
    model = save_wide_matmul(tmp_path / "wide.onnx", 60)
    tuned(model)
    out = tmp_path / "out"
    out.mkdir()
    target = ["-o", str(out / "best.onnx")] if form != "triton" else ["--format", "triton", "-o", str(out)]
    args = ["export", "--study-name", "S", "--trial", "0", *target]
    if form == "file over an export":
        assert gpt_optuna(*args).returncode == 0
        args.append("--force")
    if not killed_while_writing(args, out):
        pytest.skip("every export ended before it could be killed")
    result = gpt_optuna(*args)
    assert result.returncode == 0, result.stderr
    written = out / "best.onnx" if form != "triton" else out / "wide" / "1" / "model.onnx"
    record = json.loads(written.with_name(written.name + ".json").read_text())
    assert sha(written) == record["model_sha256"] == sha(model)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []  # nothing staged left behind


@pytest.mark.slow
def test_triton_force_keeps_what_it_does_not_write_and_never_replaces_the_study(cnn_path: Path, tmp_path: Path) -> None:
    tuned(cnn_path)
    repo = tmp_path / "repo"
    repo.mkdir()
    entry = ["export", "--study-name", "S", "--format", "triton", "-o", str(repo), "--model-name", "cnn"]
    assert gpt_optuna(*entry).returncode == 0
    (repo / "cnn" / "2").mkdir()
    (repo / "cnn" / "2" / "model.onnx").write_bytes(cnn_path.read_bytes())
    (repo / "cnn" / "README.txt").write_text("the user's own notes")
    result = gpt_optuna(*entry, "--force")
    assert result.returncode == 0, result.stderr
    assert (repo / "cnn" / "README.txt").read_text() == "the user's own notes"
    assert sha(repo / "cnn" / "2" / "model.onnx") == sha(cnn_path) and (repo / "cnn" / "config.pbtxt").is_file()
    over = ["export", "--study-name", "S", "--format", "triton", "-o", ".", "--model-name", "studies", "--force"]
    one_line_error(gpt_optuna(*over), "holds files the study reads")
    assert Path("studies/S.db").is_file() and Path("studies/S").is_dir()
