"""A real model on real photographs: int8 calibrated on them keeps top-1 agreement, int8 calibrated
on noise loses it, and the search tells them apart through the user's own metric."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import load, tune
from optuna.trial import TrialState

from gpt_optuna.cli import main
from gpt_optuna.results.report import render

CRITERION = 0.45
"""Top-1 agreement with the fp32 model that int8 must keep."""
TOP1 = '''
import numpy as np

def top1(outputs, references, inputs):
    """Share of samples whose top-1 class is the fp32 reference's."""
    agree = [np.argmax(o["logits"], -1) == np.argmax(r["logits"], -1) for o, r in zip(outputs, references)]
    return {"top1_agree": float(np.mean(np.concatenate(agree)))}
'''


def only_precision(model: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """A tune.toml searching fp32, fp16 and int8 (Q/DQ on convolutions and matrix products), with
    every other knob of this machine's space at its default."""
    capsys.readouterr()
    assert main(["space", str(model), "--shape", "input:1x3x224x224", "--json"]) == 0
    knobs = [k["name"] for k in json.loads(capsys.readouterr().out)["knobs"]]
    lines = ['precision = ["fp32", "fp16", "int8"]', 'quantize_ops = "conv+matmul"']
    lines += [f'"{name}" = "default"' for name in knobs if name not in ("precision", "quantize_ops")]
    return "[measure]\nbudget_s = 0.05\nmin_samples = 5\n[space]\n" + "\n".join(lines) + "\n"


@pytest.mark.slow
def test_int8_calibrated_on_real_photos_keeps_top1_where_noise_calibration_loses_it(
    mobilenet_v2_path: Path, photo_crops: np.ndarray, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the tuner guarantees, on data with a wide margin: each candidate is judged by the user's
    metric on all 30 photos, pruned exactly when it falls below the criterion, and int8 calibrated
    on the photos keeps more top-1 agreement than int8 calibrated on noise. Where the quantizer's
    numbers land depends on the ONNX Runtime build and the CPU (photo-calibrated int8 top-1
    agreement 0.63-0.80 and noise-calibrated 0.27 were seen with 1.31-1.32), so the criterion sits
    between them with room on both sides."""
    (tmp_path / "imagenet_metrics.py").write_text(TOP1)
    (tmp_path / "tune.toml").write_text(only_precision(mobilenet_v2_path, capsys))
    np.savez(tmp_path / "photos.npz", input=photo_crops)
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "noise.npz", input=rng.standard_normal((8, 1, 3, 224, 224)).astype(np.float32))
    argv = [str(mobilenet_v2_path), "--shape", "input:1x3x224x224", "--inputs", str(tmp_path / "photos.npz")]
    argv += ["--metric", f"{tmp_path / 'imagenet_metrics.py'}:top1", "--accuracy", f"top1_agree>={CRITERION}"]
    argv += ["--config", str(tmp_path / "tune.toml"), "--n-trials", "3", "--confirm-top", "0", "--seed", "0"]

    assert tune(*argv, "--study-name", "real") == 0
    assert tune(*argv, "--study-name", "noise", "--calibration", str(tmp_path / "noise.npz")) == 0

    def by_precision(name: str) -> dict[str, tuple[TrialState, dict[str, float]]]:
        trials = load(name).get_trials()
        return {t.params["precision"]: (t.state, t.user_attrs["accuracy"]) for t in trials}

    real, noise = by_precision("real"), by_precision("noise")
    assert set(real) == set(noise) == {"fp32", "fp16", "int8"}
    for study in (real, noise):
        assert study["fp32"][0] is TrialState.COMPLETE and study["fp32"][1]["top1_agree"] == 1.0
        for state, accuracy in study.values():  # pruned exactly below the criterion, on every photo
            assert accuracy["samples"] == 30
            assert (state is TrialState.COMPLETE) == (accuracy["top1_agree"] >= CRITERION), (state, accuracy)
    assert real["int8"][1]["top1_agree"] > noise["int8"][1]["top1_agree"] + 0.2
    assert real["int8"][0] is TrialState.COMPLETE and noise["int8"][0] is TrialState.PRUNED

    page = render(load("noise"))  # the criterion, and every trial's metrics
    assert (
        f"Accuracy criterion: top1_agree&gt;={CRITERION}, on 30 samples" in page and "imagenet_metrics.py:top1" in page
    )
    table = page[page.index('<details id="accuracy">') :]
    header = re.findall(r"<th>([^<]+)</th>", table[: table.index("</tr>")])
    assert header[:4] == ["trial", "status", "latency_ms", "top1_agree"] and {"cosine", "samples"} <= set(header)
    int8_row = re.findall(r"<td[^>]*>([^<]*)</td>", table.split("<tr>")[[*noise].index("int8") + 2])
    assert int8_row[1] == "infeasible" and float(int8_row[3]) == pytest.approx(noise["int8"][1]["top1_agree"], 1e-3)
    assert main(["confirm", "--study-name", "real", "--top", "2", "--processes", "1"]) == 0  # the metric goes along
