"""Bad input gets one clear line and a non-zero exit, never a traceback: the real command."""

import importlib.util
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from gpt_optuna.cli.commands import _resolve_storage
from gpt_optuna.core.errors import UserError
from gpt_optuna.core.words import counted


def gpt_optuna(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpt_optuna.cli", *args], capture_output=True, text=True, timeout=120)


def one_line_error(result: subprocess.CompletedProcess[str], expected: str) -> None:
    assert result.returncode == 2, result
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpt-optuna: error: ")
    assert expected in lines[0], lines[0]


def test_missing_model() -> None:
    one_line_error(gpt_optuna("tune", "missing.onnx"), "model file not found: missing.onnx")


def test_malformed_model(tmp_path: Path) -> None:
    (tmp_path / "m.onnx").write_bytes(b"\x08\x07garbage\xff\xff")
    one_line_error(gpt_optuna("tune", str(tmp_path / "m.onnx")), "m.onnx")


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--backend", "tensorflow"], "unknown backend 'tensorflow'"),
        (["--accuracy", "cosine>>0.9"], "malformed --accuracy clause"),
        (["--accuracy", "psnr>=30"], "unknown accuracy metric 'psnr'"),
        (["--storage", "sqlite:////nonexistent/dir/x.db"], "the folder of /nonexistent/dir/x.db does not exist"),
        (["--storage", "mysql://user@127.0.0.1:1/db"], "storage 'mysql://user@127.0.0.1:1/db'"),
        (["--timeout", "soon"], "malformed duration 'soon'"),
        (["--shape", "input:1x3x64"], "rank 3"),
        (["--confirm-processes", "0"], "--confirm-processes must be at least 1, got 0"),
        (["--study-name", "x" * 260], "study name of 260 characters: at most 200"),
    ],
)
def test_bad_flags(cnn_path: Path, flags: list[str], expected: str) -> None:
    one_line_error(gpt_optuna("tune", str(cnn_path), *flags), expected)


@pytest.mark.parametrize(
    "line, expected",
    [
        ('intra_op_num_threads = "lots"', '[space] intra_op_num_threads = "lots": give a number'),
        ('graph_optimization_level = "ORT_ENABLE_EVERYTHING"', 'not a value it offers here ("ORT_DISABLE_ALL"'),
        ("mem_pattern = 3", "[space] mem_pattern = 3: give true or false"),
        ('precision = ["fp32", "fp64"]', '[space] precision = "fp64": not a value it offers here'),
    ],
)
def test_space_values_of_the_wrong_kind(cnn_path: Path, tmp_path: Path, line: str, expected: str) -> None:
    (tmp_path / "bad.toml").write_text(f"[space]\n{line}\n")
    for command in ("tune", "space"):
        one_line_error(gpt_optuna(command, str(cnn_path), "--config", str(tmp_path / "bad.toml")), expected)


def test_npz_that_does_not_match(cnn_path: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "f.npz", input=np.zeros((1, 3, 32, 32), np.float32))
    one_line_error(gpt_optuna("tune", str(cnn_path), "--inputs", str(tmp_path / "f.npz")), "size 32 on axis 2")


def test_status_and_best_without_a_study() -> None:
    one_line_error(gpt_optuna("status"), "no study found under studies/")
    one_line_error(gpt_optuna("best", "--study-name", "nope"), f"no study database at {Path.cwd()}/studies/nope.db")
    one_line_error(gpt_optuna("status", "--study-name", "x" * 300), "study name of 300 characters: at most 200")


def test_a_reader_without_study_name_sets_the_studies_of_check_aside() -> None:
    studies = Path("studies")
    studies.mkdir()
    for name in ("cnn-onnxruntime", "check-cnn-20260101-120000"):
        (studies / f"{name}.db").touch()
    assert _resolve_storage(Namespace(storage=None, study_name=None))[1] == "cnn-onnxruntime"
    (studies / "other.db").touch()
    with pytest.raises(UserError, match=r"\(cnn-onnxruntime, other; 1 more made by gpt-optuna check\); choose one"):
        _resolve_storage(Namespace(storage=None, study_name=None))
    assert [counted(n, "process", "processes") for n in (1, 2)] == ["1 process", "2 processes"]
    assert [counted(n, "finalist") for n in (1, 1200)] == ["1 finalist", "1,200 finalists"]


def test_help_works_without_heavy_imports() -> None:
    code = (
        "import sys; from gpt_optuna.cli.commands import build_parser; build_parser(); "
        "print(sorted(m for m in ('onnxruntime', 'optuna', 'cupy') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]"
    assert gpt_optuna("--help").returncode == 0


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--backend", "tensorrt"], "pip install 'gpt-optuna[tensorrt]'"),
        (["--backend", "nosuch.module:Thing"], "cannot import backend module 'nosuch.module'"),
        (["--objectives", "latency,memory"], "does not report engine device memory"),
        (["--sampler", "gp"], "pip install 'gpt-optuna[gp]'"),
        (["--config", "bad.toml"], "[space] names unknown knob 'noknob'"),
    ],
)
def test_a_refused_run_leaves_no_database_and_no_folder(
    cnn_path: Path, tmp_path: Path, flags: list[str], expected: str
) -> None:
    """Refused before the study exists, whether before the model is read (a backend whose library
    is missing, an objective it cannot measure) or after its space was found (a bad [space] knob):
    nothing stays behind, so a later bare `status` finds no half-made study."""
    if "tensorrt" in flags and any(importlib.util.find_spec(m) for m in ("tensorrt", "tensorrt_bindings")):
        pytest.skip("TensorRT is installed here")
    if "gp" in flags and importlib.util.find_spec("torch") and importlib.util.find_spec("scipy"):
        pytest.skip("the gp extra is installed here")
    (tmp_path / "bad.toml").write_text("[space]\nnoknob = [1]\n")
    one_line_error(gpt_optuna("tune", str(cnn_path), "--quiet", *flags), expected)
    assert not Path("studies").exists()


def test_a_refused_resume_keeps_the_study_it_found(cnn_path: Path, tmp_path: Path) -> None:
    assert gpt_optuna("tune", str(cnn_path), "--n-trials", "1", "--confirm-top", "0", "--quiet").returncode == 0
    before = sorted(str(p) for p in Path("studies").rglob("*"))
    (tmp_path / "bad.toml").write_text("[space]\nnoknob = [1]\n")
    one_line_error(gpt_optuna("tune", str(cnn_path), "--config", str(tmp_path / "bad.toml")), "unknown knob")
    assert sorted(str(p) for p in Path("studies").rglob("*")) == before
