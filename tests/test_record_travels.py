"""A CI record made with ``--metric`` moves: exported beside a metric script, copied with it to
another folder, it passes ``check`` there in a fresh process; its metric is found beside the record
or by module name, ``check --metric`` replaces it, and records that named it by an absolute path
still read. The gate measures only the defaults and the recorded configuration before its comparison."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from conftest import tune

from gpt_optuna.cli import main
from gpt_optuna.core.errors import UserError
from gpt_optuna.usecases.check_record import recorded_metric

AGREE = '''
import numpy as np

def agree(outputs, references, inputs):
    """Share of samples whose top class is the reference's."""
    same = [np.argmax(o["logits"], -1) == np.argmax(r["logits"], -1) for o, r in zip(outputs, references)]
    return {"agree": float(np.mean(np.concatenate(same)))}
'''
CONFIG = '[measure]\nbudget_s = 0.05\nmin_samples = 5\n[space]\nprecision = "default"\n'


@pytest.mark.slow
def test_a_record_made_with_a_metric_passes_check_from_a_copy_in_another_folder(cnn_path: Path, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "ci").mkdir(parents=True)
    (project / "metrics.py").write_text(AGREE)
    (tmp_path / "tune.toml").write_text(CONFIG)
    flags = ["--config", str(tmp_path / "tune.toml"), "--metric", f"{project / 'metrics.py'}:agree"]
    flags += ["--accuracy", "agree>=0.9", "--n-trials", "2", "--confirm-top", "0"]
    assert tune(str(cnn_path), *flags) == 0
    assert main(["export", "-o", str(project / "ci" / "cnn.onnx")]) == 0
    assert json.loads((project / "ci" / "cnn.onnx.json").read_text())["metric"] == "../metrics.py:agree"

    copy = tmp_path / "runner" / "checkout"  # the project as another folder (a fresh clone) holds it
    shutil.copytree(project, copy)
    shutil.rmtree(project)  # nothing left where the record was made
    shutil.copy(cnn_path, copy / "model.onnx")
    check = [sys.executable, "-m", "gpt_optuna.cli", "check", "model.onnx", "--baseline", "ci/cnn.onnx.json"]
    check += ["--budget", "40s", "--tolerance", "90%"]
    done = subprocess.run(check, capture_output=True, text=True, timeout=300, cwd=copy)
    # the latency's word is this host's to give (a loaded runner may leave it undecided, exit 5); the record reads
    assert done.returncode in (0, 5), done.stdout + done.stderr
    assert "ok: the model's outputs meet agree>=0.9 against the record" in done.stdout, done.stdout
    (db,) = (copy / "studies").glob("check-*.db")  # the gate's budget went to its comparison, not to a search
    assert len(optuna.load_study(study_name=db.stem, storage=f"sqlite:///{db}").trials) == 2


def test_the_metric_is_found_beside_the_record_by_module_name_or_by_check_metric(tmp_path: Path) -> None:
    record = tmp_path / "ci" / "cnn.onnx.json"
    record.parent.mkdir()
    (tmp_path / "metrics.py").write_text(AGREE)
    here = f"{(tmp_path / 'metrics.py').resolve()}:agree"
    assert recorded_metric(record, "../metrics.py:agree", None) == here  # relative to the record
    assert recorded_metric(record, "mypackage.metrics:agree", None) == "mypackage.metrics:agree"
    assert recorded_metric(record, None, None) is None
    gone = "/gone/where/the/record/was/made/metrics.py:agree"  # a record exported before: an absolute path
    with pytest.raises(UserError, match="copy the script beside the record, or name it: check --metric"):
        recorded_metric(record, gone, None)
    assert recorded_metric(record, gone, "metrics.py:agree") == here  # check --metric, from the working folder
    shutil.copy(tmp_path / "metrics.py", record.parent)
    assert recorded_metric(record, gone, None) == f"{(record.parent / 'metrics.py').resolve()}:agree"
    assert recorded_metric(record, here, None) == here  # an old record on the host that made it
    with pytest.raises(UserError, match="made without --metric"):
        recorded_metric(record, None, "metrics.py:agree")
