"""What a careless user does, through the real command in child processes: a study folder moved,
a read-only study, a full device for the log, a broken engine, numbers out of range, odd inputs and
an early Ctrl-C; each ends in advice the user can follow, or works."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import save
from onnx import TensorProto, helper
from test_faults import CLI, digest, gpt_optuna, mounted_tmpfs, one_line_error

import gpt_optuna as gpt_optuna_api
from gpt_optuna.core import log
from gpt_optuna.core.errors import UserError

QUICK = ("--n-trials", "3", "--quiet", "--confirm-top", "0")


@pytest.mark.slow
def test_compare_and_profile_on_a_read_only_study_write_their_logs_elsewhere(cnn_path: Path, tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "ro", "64m") as disk:
        assert gpt_optuna("tune", str(cnn_path), *QUICK, cwd=disk).returncode == 0
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        try:
            compared = gpt_optuna("compare", "0", "1", "--processes", "1", "--rounds", "3", "--json", cwd=disk)
            profiled = gpt_optuna("profile", "0", "--runs", "3", "--json", cwd=disk)
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
    for result in compared, profiled:
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 0 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert lines[0].startswith("warning: cannot write in the study folder") and "Read-only" in lines[0], lines
    assert json.loads(compared.stdout)["speedup"] is not None
    elsewhere = Path(profiled.stderr.split("writing to ")[-1].strip())
    assert (elsewhere / "profile.log").is_file() and (elsewhere / "profile-0.json").is_file()


@pytest.mark.slow
def test_a_compare_that_times_nothing_exits_2(cnn_path: Path, tmp_path: Path) -> None:
    """A side the engine cannot build (a model of the study's interface made of an operator no
    engine has) leaves nothing timed: the outputs are printed, and the command ends with one error
    line."""
    assert gpt_optuna("tune", str(cnn_path), *QUICK).returncode == 0
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 64, 64])
    y = helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])
    graph = helper.make_graph([helper.make_node("Nothing", ["input"], ["logits"], domain="no.such")], "g", [x], [y])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("no.such", 1)]
    other = save(helper.make_model(graph, opset_imports=opsets), tmp_path / "other.onnx")
    compared = gpt_optuna("compare", "0", str(other), "--processes", "1", "--rounds", "3")
    assert compared.returncode == 2 and "verdict: not timed" in compared.stdout, compared.stdout + compared.stderr
    assert compared.stderr.splitlines()[-1].startswith("gpt-optuna: error: compare timed nothing: ")


def test_a_log_file_on_a_full_device_is_refused_and_one_that_fills_up_is_left(tmp_path: Path) -> None:
    one_line_error(gpt_optuna("status", "--log-file", "/dev/full"), "--log-file /dev/full: No space left on device")
    log.configure(0, tmp_path / "run.log")
    handler = log.LOGGER.handlers[-1]
    handler.stream.close()
    handler.stream = open("/dev/full", "w")  # noqa: SIM115 (the handler closes it)
    try:
        with contextlib.redirect_stderr(io.StringIO()) as err:
            for n in range(3):
                log.logger("gpt_optuna.x").info(f"note {n}")
    finally:
        log.configure(0)
    lines = err.getvalue().splitlines()
    assert (
        lines[1]
        == f"warning: --log-file {tmp_path / 'run.log'}: No space left on device; nothing more is written to it"
    )
    assert lines == ["note 0", lines[1], "note 1", "note 2"], lines


def test_doctor_names_an_onnx_runtime_that_fails_to_import_and_reports_the_other_engines(tmp_path: Path) -> None:
    fake = tmp_path / "site" / "onnxruntime"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("libonnxruntime.so.1: cannot open shared object file")\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])}
    found = subprocess.run([*CLI, "doctor", "--json"], capture_output=True, text=True, timeout=600, env=env)
    assert found.returncode in (0, 1) and "Traceback" not in found.stderr, found.stderr
    engines = {e["name"]: e for e in json.loads(found.stdout)["engines"]}
    assert set(engines) == {"onnxruntime", "tensorrt", "tensorrt-rtx", "inductor"}
    assert engines["onnxruntime"]["missing"] == (
        "ONNX Runtime is installed but fails to import: libonnxruntime.so.1: cannot open shared object file"
    )


@pytest.mark.parametrize("seed", [-1, 2**32, 2**40])
def test_a_seed_out_of_range_is_one_line_from_the_command_and_a_user_error_from_the_api(
    cnn_path: Path, seed: int
) -> None:
    expected = f"--seed must be between 0 and 2**32 - 1 (4294967295), got {seed}"
    one_line_error(gpt_optuna("tune", str(cnn_path), *QUICK, "--seed", str(seed)), expected)
    with pytest.raises(UserError, match=re.escape(expected)):
        gpt_optuna_api.tune(cnn_path, n_trials=3, seed=seed)
    assert not Path("studies").exists()


def moved_study(cnn_path: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A study tuned in ``a/`` (its model there too), then ``a/`` moved to ``b/``: (a, b)."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    model = shutil.copy(cnn_path, a / "cnn.onnx")
    assert gpt_optuna("tune", str(model), *QUICK, cwd=a).returncode == 0
    a.rename(b)
    return a, b


@pytest.mark.slow
def test_a_moved_study_folder_is_named_with_the_link_that_puts_it_back(cnn_path: Path, tmp_path: Path) -> None:
    a, b = moved_study(cnn_path, tmp_path)
    folder = a / "studies" / "cnn-onnxruntime"
    for command in ("export", "-o", "x.onnx"), ("compare", "0", "1"):
        one_line_error(gpt_optuna(*command, cwd=b), f"keeps its files in {folder}, which is not there")
        one_line_error(gpt_optuna(*command, cwd=b), f"link them there: ln -s {b} {a}")
    a.symlink_to(b)  # as advised
    exported = gpt_optuna("export", "-o", "x.onnx", cwd=b)
    assert exported.returncode == 0 and (b / "x.onnx").is_file(), exported.stderr


@pytest.mark.slow
def test_a_resume_from_a_moved_study_folder_is_refused_rather_than_split(cnn_path: Path, tmp_path: Path) -> None:
    a, b = moved_study(cnn_path, tmp_path)
    before = digest(b)
    resumed = gpt_optuna("tune", "cnn.onnx", "--n-trials", "4", "--quiet", "--confirm-top", "0", cwd=b)
    one_line_error(resumed, f"study 'cnn-onnxruntime' keeps its files in {a / 'studies' / 'cnn-onnxruntime'}")
    assert not a.exists() and digest(b) == before


def write_npz(path: Path, kind: str) -> None:
    if kind == "empty":
        np.savez(path)
    elif kind == "text":
        path.write_text("notes, not arrays\n")
    else:
        np.savez(path, input=np.zeros((2, 1, 3, 64, 64), np.float32), mask=np.zeros((5, 2), np.float32))


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("empty", "kind.npz holds no arrays"),
        ("text", "kind.npz is not an .npz archive"),
        ("ragged", "its arrays hold different numbers of samples: input 2, mask 5 (not a model input)"),
    ],
)
def test_an_npz_that_is_empty_not_an_archive_or_ragged_is_named_in_one_line(
    cnn_path: Path, tmp_path: Path, kind: str, expected: str
) -> None:
    write_npz(tmp_path / "kind.npz", kind)
    one_line_error(gpt_optuna("tune", str(cnn_path), *QUICK, "--inputs", str(tmp_path / "kind.npz")), expected)
    assert not Path("studies").exists()


@pytest.mark.parametrize(
    ("space", "expected"),
    [
        ("intra_op_num_threads = -4", "[space] intra_op_num_threads = -4: give 0 or more"),
        ("inter_op_num_threads = [1, -2]", "[space] inter_op_num_threads = -2: give 0 or more"),
    ],
)
def test_a_negative_thread_count_in_space_is_refused_naming_the_key(
    cnn_path: Path, tmp_path: Path, space: str, expected: str
) -> None:
    config = tmp_path / "tune.toml"
    config.write_text(f"[space]\n{space}\n")
    one_line_error(gpt_optuna("tune", str(cnn_path), *QUICK, "--config", str(config)), expected)
    assert not Path("studies").exists()


SLOW_IMPORTS = """
import sys, time

class Slow:  # the command's libraries, imported slowly: a Ctrl-C lands among them
    def find_spec(self, name, path=None, target=None):
        if name == "gpt_optuna.cli.commands":
            print("importing", file=sys.stderr, flush=True)
            time.sleep(60)

sys.meta_path.insert(0, Slow())
sys.argv = ["gpt-optuna", "status"]
from gpt_optuna.cli import main
sys.exit(main())
"""


def test_ctrl_c_while_the_command_imports_its_libraries_is_one_line() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", SLOW_IMPORTS], stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stderr is not None and child.stderr.readline() == "importing\n"
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=30)
    assert child.returncode == 130 and err.splitlines() == [
        "gpt-optuna: stopped by Ctrl-C; run the same command again to carry on"
    ], err
