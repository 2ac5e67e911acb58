"""Every reader of a study for every kind of criterion and input: the summary, status, best, the
report, the notebook, confirm, export (and the session it opens), Triton and check, each run for
real (ONNX Runtime on the CPU, real worker processes) on a study whose criterion is a built-in
metric, a parametrized one, an average over samples or the user's own metric, and whose model
takes float, int64 and bool scalars and an int32 tensor besides a float one."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import printed, run_notebook, tune
from onnx import TensorProto, helper, numpy_helper

import gpt_optuna
from gpt_optuna.cli import main
from gpt_optuna.core.errors import EXIT_INCONCLUSIVE, EXIT_USER_ERROR
from gpt_optuna.protocol.accuracy import parse_criterion

CONFIG = 'confirm_processes = 2\n[measure]\nbudget_s = 0.05\nmin_samples = 5\n[space]\nprecision = "fp32"\n'
"""Every candidate in fp32, so that each meets every criterion and ``confirm`` has finalists whatever the
sampler draws (a reduced precision may fail the stricter criteria, and three trials may hold no other candidate)."""
METRIC = '''import numpy as np


def agree(outputs, references, inputs):
    """Top-1 agreement over the samples."""
    same = [np.argmax(o["logits"]) == np.argmax(r["logits"]) for o, r in zip(outputs, references)]
    return {"agree": float(np.mean(same))}
'''
STUDY = "readers"
CRITERIA = {
    "built-in": "cosine>=0.999",
    "topk": "topk(1)>=1",
    "outside": "outside(atol=1e-3, rtol=1e-3)<=0.05",
    "mean": "mean(rel_l2)<=0.01",
    "user metric": "agree>=0.5 and cosine>=0.99",
}


def model(mixed: bool) -> onnx.ModelProto:
    """Logits [1, 10] from x [1, 16]; ``mixed``: scaled by an int64 scalar, signed by a bool scalar
    and shifted by the sum of an int32 [1, 4] tensor."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((16, 10)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits" if not mixed else "h"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])]
    if mixed:
        nodes += [
            helper.make_node("Cast", ["sr"], ["srf"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["h", "srf"], ["hs"]),
            helper.make_node("Neg", ["hs"], ["nhs"]),
            helper.make_node("Where", ["flag", "hs", "nhs"], ["signed"]),
            helper.make_node("Cast", ["ids"], ["idsf"], to=TensorProto.FLOAT),
            helper.make_node("ReduceSum", ["idsf"], ["shift"], keepdims=0),
            helper.make_node("Add", ["signed", "shift"], ["logits"]),
        ]
        inputs += [
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
            helper.make_tensor_value_info("ids", TensorProto.INT32, [1, 4]),
        ]
    graph = helper.make_graph(
        nodes, "readers", inputs, [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], [weight]
    )
    made = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(made, full_check=True)
    return made


def samples(mixed: bool) -> list[dict[str, np.ndarray]]:
    """Three samples, each in the model's own shapes (scalars as 0-d arrays)."""
    rng = np.random.default_rng(1)
    found = []
    for index in range(3):
        feeds = {"x": rng.standard_normal((1, 16)).astype(np.float32)}
        if mixed:
            feeds |= {
                "sr": np.array(16000 if index % 2 else 8000, np.int64),
                "flag": np.array(index != 1),
                "ids": rng.integers(0, 5, (1, 4)).astype(np.int32),
            }
        found.append(feeds)
    return found


@pytest.mark.slow
@pytest.mark.parametrize(
    ("inputs", "kind"),
    [("mixed", kind) for kind in CRITERIA] + [("float", "topk")],
)
def test_every_reader_reads_the_study_for_every_criterion_and_input_kind(
    inputs: str, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    mixed = inputs == "mixed"
    onnx.save(model(mixed), "model.onnx")
    Path("samples").mkdir()
    for index, feeds in enumerate(samples(mixed)):
        np.savez(f"samples/{index}.npz", **feeds)
    (tmp_path / "tune.toml").write_text(CONFIG)
    (tmp_path / "metric.py").write_text(METRIC)
    flags = ["--inputs", "samples", "--accuracy", CRITERIA[kind], "--config", str(tmp_path / "tune.toml")]
    flags += ["--study-name", STUDY]
    if kind == "user metric":
        flags += ["--metric", f"{tmp_path / 'metric.py'}:agree"]
    assert tune("model.onnx", *flags, "--n-trials", "3", "--confirm-top", "1") == 0
    summary = capsys.readouterr().out
    assert summary.startswith("verdict: ")
    headline = summary.splitlines()[0]
    study = gpt_optuna_study()
    recorded = study.user_attrs["gpt_optuna"]["accuracy"]
    assert parse_criterion(recorded, user_metrics=kind == "user metric").text == recorded  # it reads back

    for command in (["status"], ["best"]):
        assert main(command) == 0
        assert capsys.readouterr().out.splitlines()[0] == headline, command
    assert main(["best", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)
    assert best["headline"] == headline and set(best["accuracy"]) >= {"cosine", "samples"}
    assert main(["report", "-o", "report.html"]) == 0
    assert html.escape(headline) in Path("report.html").read_text()
    assert headline in printed(run_notebook(tmp_path / "studies" / f"{STUDY}.db", tmp_path, monkeypatch))

    assert main(["confirm", "--top", "1", "--processes", "2", "--rounds", "3"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].strip()  # a summary, then the confirmation's lines
    assert main(["export", "-o", "best.onnx"]) == 0
    record = json.loads(Path("best.onnx.json").read_text())
    assert record["accuracy_criterion"] == recorded
    session = gpt_optuna.open_session("best.onnx")
    (logits,) = session.run(None, samples(mixed)[0])
    assert logits.shape == (1, 10) and np.all(np.isfinite(logits))

    Path("repo").mkdir()
    capsys.readouterr()
    if mixed:  # scalars: Triton loads no configuration of them, and the export says so before writing
        assert main(["export", "--format", "triton", "-o", "repo"]) == EXIT_USER_ERROR
        assert "sr, flag are scalars (0-d)" in capsys.readouterr().err
        assert not any(Path("repo").iterdir())
    else:
        assert main(["export", "--format", "triton", "-o", "repo"]) == 0
        assert Path("repo/model/config.pbtxt").is_file() and Path("repo/model/1/model.onnx").is_file()
        assert not list(Path("repo/model/1").glob("*.npz"))  # the samples stay outside the version folder
        assert json.loads(Path("repo/model/1/model.onnx.json").read_text())["samples"]["inputs"].startswith("../")

    code = main(["check", "model.onnx", "--baseline", "best.onnx.json", "--budget", "8s", "--quiet"])
    out = capsys.readouterr().out
    assert code in (0, EXIT_INCONCLUSIVE), out  # never a regression of an unchanged model, never an error
    assert re.search(r"^ok: the model's outputs meet ", out, re.M), out


def gpt_optuna_study():  # noqa: ANN201 - an optuna.Study
    import optuna

    return optuna.load_study(study_name=STUDY, storage=f"sqlite:///studies/{STUDY}.db")
