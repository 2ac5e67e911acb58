"""One truth in every number: the summary, status, best, best --json, the report and export name
the same winner, and every ratio is the ratio of the two latencies shown beside it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import SYNTHETIC, load, synthetic_config, tune

from gpt_optuna.cli import main
from gpt_optuna.report import best_rows, collect
from gpt_optuna.study import summarize_study


def confirmed_study(tmp_path: Path, delays: str, trials: str = "8") -> None:
    config = synthetic_config(tmp_path, f'mode = "ok"\ndelay_us = [{delays}]\nbuild_ms = [0]\na = [0, 1]\nb = [0]')
    argv = [str(Path(__file__).parent.parent / "gpt_optuna/data/small_cnn.onnx"), "--backend", SYNTHETIC]
    assert tune(*argv, "--config", str(config), "--n-trials", trials, "--confirm-top", "3") in (0, 3)


def verdict(text: str) -> tuple[float, float, float]:
    """(baseline ms, best ms, speedup) from the lines the summary, status and best print."""
    base = float(re.search(r"baseline \(trial \d+\): ([\d.e-]+) ms \(confirmed\)", text)[1])  # type: ignore[index]
    best = re.search(r"best \(trial \d+\): ([\d.e-]+) ms \(confirmed\), ([\d.]+)x the baseline", text)
    return base, float(best[1]), float(best[2])  # type: ignore[index]


def test_every_reader_names_the_same_winner_with_consistent_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    confirmed_study(tmp_path, "100, 50")
    tuned = capsys.readouterr().out
    summary = summarize_study(load("small_cnn-syntheticbackend"))
    assert summary.measurement == "confirmed" and not summary.baseline_wins
    for text in (tuned, run("status", capsys), run("best", capsys)):
        base, best, speedup = verdict(text)
        assert speedup == pytest.approx(base / best, rel=2e-3)  # the ratio of what is shown (to 4 digits)
        assert f"best (trial {summary.best.number})" in text
    record = json.loads(run("best", capsys, "--json"))
    assert record["number"] == summary.best.number and record["measurement"] == "confirmed"
    assert record["speedup"] == pytest.approx(record["baseline_latency_ms"] / record["latency_ms"])
    ranking = record["confirmed"]["ranking"]
    assert [r["speedup"] for r in ranking] == sorted((r["speedup"] for r in ranking), reverse=True)
    table = best_rows(collect(load("small_cnn-syntheticbackend")), summary)
    assert table[0]["trial"] == summary.best.number and table[0]["measured"] == "confirmed"
    assert len({row["trial"] for row in table}) == len(table)
    assert all(row["trial"] not in reused_numbers() for row in table)  # duplicates collapsed
    assert main(["export", "-o", str(tmp_path / "w.onnx")]) == 0
    assert json.loads((tmp_path / "w.onnx.json").read_text())["trial"] == summary.best.number


def test_when_the_baseline_wins_every_reader_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every searched candidate is slower than the engine's default (200 µs): keep the default."""
    confirmed_study(tmp_path, "800, 1600", trials="4")
    study = load("small_cnn-syntheticbackend")
    summary = summarize_study(study)
    assert summary.baseline_wins and summary.best.number == summary.baseline.number
    status = run("status", capsys)
    assert "best: the baseline itself" in status and "keep the default configuration" in status
    record = json.loads(run("best", capsys, "--json"))
    assert record["baseline_wins"] and record["number"] == summary.baseline.number and record["speedup"] == 1.0
    assert main(["export", "-o", str(tmp_path / "w.onnx")]) == 0
    assert json.loads((tmp_path / "w.onnx.json").read_text())["trial"] == summary.baseline.number


def run(command: str, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    capsys.readouterr()
    assert main([command, *flags]) == 0
    return capsys.readouterr().out


def reused_numbers() -> set[int]:
    return {t.number for t in load("small_cnn-syntheticbackend").get_trials() if "reused_from" in t.user_attrs}
