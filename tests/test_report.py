"""The report and export, on real studies made by the tuner."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import onnx
import optuna
import pytest
from conftest import SYNTHETIC, printed, run_notebook, save

from gpt_optuna.cli import main
from gpt_optuna.results.report import TrialRow, collect, pareto_front, render
from gpt_optuna.testing.small_cnn import small_cnn


def row(number: int, latency: float, error: float, status: str = "feasible") -> TrialRow:
    return TrialRow(number, status, latency, error, None, {}, False)


def test_pareto_front_keeps_only_undominated_feasible_trials() -> None:
    rows = [row(0, 2.0, 0.0), row(1, 1.0, 0.5), row(2, 1.5, 0.1), row(3, 1.6, 0.2), row(4, 0.5, 0.0, "infeasible")]
    assert [r.number for r in pareto_front(rows)] == [1, 2, 0]


@pytest.fixture(scope="module")
def made_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One study with feasible, infeasible and failed trials and confirmed finalists, made once."""
    folder = tmp_path_factory.mktemp("made")
    model = save(small_cnn(), folder / "cnn.onnx")
    config = folder / "tune.toml"
    config.write_text('[measure]\nbudget_s = 0.05\n[space]\nmode = ["ok", "noisy", "crash"]\ndelay_us = [100, 0]\n')
    argv = ["tune", str(model), "--backend", SYNTHETIC, "--config", str(config), "--quiet", "--n-trials", "14"]
    here = Path.cwd()
    os.chdir(folder)
    try:
        assert main([*argv, "--sampler", "random", "--seed", "2", "--confirm-top", "2"]) == 0
    finally:
        os.chdir(here)
    return folder / "studies"


@pytest.fixture
def study_with_everything(made_study: Path) -> optuna.Study:
    shutil.copytree(made_study, "studies")
    return optuna.load_study(study_name="cnn-syntheticbackend", storage="sqlite:///studies/cnn-syntheticbackend.db")


def test_rows_carry_latency_error_and_status(study_with_everything: optuna.Study) -> None:
    rows = collect(study_with_everything)
    statuses = {r.status for r in rows}
    assert {"feasible", "infeasible", "failed"} <= statuses
    for r in rows:
        if r.status == "feasible":
            assert r.latency_ms is not None and r.error is not None and r.error < 1e-4  # cosine error
        if r.status == "infeasible":
            assert r.error is not None and r.error > 1e-4 and "fails cosine" in r.reason
        if r.status == "failed":
            assert "SIGSEGV" in r.reason
    assert rows[0].baseline
    trial = study_with_everything.trials[0]
    assert trial.user_attrs["gpu"] == "cpu" and trial.user_attrs["worker"].startswith(trial.user_attrs["host"])
    assert rows[0].measured_on == f"{trial.user_attrs['host']} cpu"  # shown in the report's tables


def test_report_is_one_self_contained_page_with_every_figure(study_with_everything: optuna.Study) -> None:
    page = render(study_with_everything)
    assert page.count("<script") >= 4 and not re.search(r"<script[^>]*\ssrc=", page)  # plotly.js inline
    assert len(re.findall(r'id="figure-\d"', page)) >= 3
    assert "Latency against error" in page and "Optimization history" in page
    assert "gpt-optuna export --study-name cnn-syntheticbackend --trial" in page
    assert "confirmed" in page
    assert main(["report", "-o", "report.html"]) == 0
    assert Path("report.html").read_text().startswith("<!DOCTYPE html>")


def test_export_writes_the_model_and_a_side_file(study_with_everything: optuna.Study, cnn_path: Path) -> None:
    assert main(["export", "-o", "out/best.onnx"]) == 2  # a folder that does not exist is not made
    Path("out").mkdir()
    assert main(["export", "-o", "out/best.onnx"]) == 0
    side = json.loads(Path("out/best.onnx.json").read_text())
    best = study_with_everything.user_attrs["confirmed"]["ranking"][0]["number"]
    assert side["trial"] == best and side["confirmed"]["number"] == best
    assert side["params"] == study_with_everything.trials[best].params
    assert side["accuracy"]["cosine"] > 0.9999 and "gpu" in side["versions"]
    onnx.checker.check_model("out/best.onnx")
    failed = next(t.number for t in study_with_everything.trials if t.state is optuna.trial.TrialState.FAIL)
    assert main(["export", "--trial", str(failed), "-o", "x.onnx"]) == 2


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tempfile.mkdtemp()}",
        "--virtual-time-budget=10000",
    ]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=120)  # type: ignore[list-item]


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium package (.ci/run installs it)")
def test_every_figure_draws_its_traces_in_a_real_browser(study_with_everything: optuna.Study) -> None:
    page = Path("report.html").resolve()
    page.write_text(render(study_with_everything))
    dom = chromium("--dump-dom", page.as_uri()).stdout
    figures = re.split(r'<div id="figure-\d"', dom)[1:]
    assert len(figures) >= 4, "a figure did not render"
    for figure in figures:
        assert "js-plotly-plot" in figure[:200]  # plotly.js ran and took the div over
        assert re.search(r'class="trace (scatter|bars)', figure), "a figure drew no trace"
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report.png"
    chromium("--window-size=1200,2400", f"--screenshot={shot}", page.as_uri())
    assert shot.stat().st_size > 20_000


def wsgi_get(app, path: str) -> tuple[str, bytes]:  # noqa: ANN001
    from wsgiref.util import setup_testing_defaults

    environ: dict = {"PATH_INFO": path.split("?")[0], "QUERY_STRING": path.partition("?")[2], "REQUEST_METHOD": "GET"}
    setup_testing_defaults(environ)
    status = []
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    return status[0], body


def test_the_study_opens_in_optuna_dashboard(study_with_everything: optuna.Study) -> None:
    optuna_dashboard = pytest.importorskip("optuna_dashboard")
    from optuna.artifacts import FileSystemArtifactStore

    from gpt_optuna.study.storage import open_storage

    storage = open_storage("sqlite:///studies/cnn-syntheticbackend.db", create=False)
    app = optuna_dashboard.wsgi(storage, FileSystemArtifactStore("studies/cnn-syntheticbackend/artifacts"))
    status, body = wsgi_get(app, "/api/studies")
    assert status.startswith("200"), body[:300]
    studies = json.loads(body)["study_summaries"]
    assert [s["study_name"] for s in studies] == ["cnn-syntheticbackend"]
    status, body = wsgi_get(app, f"/api/studies/{studies[0]['study_id']}?after=0")
    assert status.startswith("200"), body[:300]
    detail = json.loads(body)
    assert len(detail["trials"]) == len(study_with_everything.trials)
    assert {t["state"] for t in detail["trials"]} >= {"Complete", "Pruned", "Fail"}


def test_the_notebook_runs_top_to_bottom_on_a_study(
    study_with_everything: optuna.Study, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Path("notebooks").mkdir()  # run from notebooks/, where Jupyter starts, as from the repo root
    before = sorted(str(p) for p in Path(".").rglob("*"))
    outputs = run_notebook(Path("studies/cnn-syntheticbackend.db"), tmp_path, monkeypatch)
    text = printed(outputs)
    after = sorted(str(p) for p in Path(".").rglob("*") if not str(p).startswith("jupyter"))
    assert after == [p for p in before if not p.startswith("jupyter")]  # it created nothing
    assert "study cnn-syntheticbackend" in text and "Pareto front: [(" in text
    figures = [
        o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {}) or "text/html" in o.get("data", {})
    ]
    assert len(figures) >= 3


def test_multi_objective_search_over_latency_and_error(cnn_path: Path, tmp_path: Path) -> None:
    config = tmp_path / "tune.toml"
    config.write_text('[measure]\nbudget_s = 0.05\n[space]\nprecision = ["fp32", "fp16", "int8"]\n')
    argv = ["tune", str(cnn_path), "--config", str(config), "--quiet", "--n-trials", "10", "--confirm-top", "2"]
    assert main([*argv, "--objectives", "error,latency", "--accuracy", "cosine>=0.99", "--seed", "1"]) == 0
    study = optuna.load_study(study_name="cnn-onnxruntime", storage="sqlite:///studies/cnn-onnxruntime.db")
    assert len(study.directions) == 2
    assert study.user_attrs["gpt_optuna"]["objectives"] == ["latency", "error"]
    complete = [t for t in study.trials if t.state is optuna.trial.TrialState.COMPLETE]
    for t in complete:
        latency, error = t.values
        assert latency == t.user_attrs["latency"]["median_ms"]
        assert error == pytest.approx(1 - t.user_attrs["accuracy"]["cosine"])
    assert {t.params["precision"] for t in complete} > {"fp32"}
    assert study.best_trials and "confirmed" in study.user_attrs
    page = render(study)
    assert "Latency against error" in page and len(re.findall(r'id="figure-\d"', page)) >= 3
    assert main(["tune", str(cnn_path), "--quiet", "--n-trials", "10", "--objectives", "latency,size"]) == 2
    memory = [
        "tune",
        str(cnn_path),
        "--quiet",
        "--n-trials",
        "3",
        "--objectives",
        "latency,memory",
        "--study-name",
        "m",
    ]
    assert main(memory) == 2  # ONNX Runtime reports no engine memory: refused in one line before anything is made
    assert not Path("studies/m.db").exists() and not Path("studies/m").exists()
