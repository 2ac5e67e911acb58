"""The report and export, on real studies made by the tuner."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import onnx
import optuna
import pytest
from conftest import SYNTHETIC, printed, run_notebook, save

import gpt_optuna
from gpt_optuna.cli import main
from gpt_optuna.results.report import render
from gpt_optuna.results.rows import TrialRow, collect, pareto_front
from gpt_optuna.study.summary import summarize_study
from gpt_optuna.testing.small_cnn import small_cnn


def row(number: int, latency: float, error: float, status: str = "feasible") -> TrialRow:
    return TrialRow(number, status, latency, error, None, {}, False)


def test_pareto_front_keeps_only_undominated_feasible_trials() -> None:
    rows = [row(0, 2.0, 0.0), row(1, 1.0, 0.5), row(2, 1.5, 0.1), row(3, 1.6, 0.2), row(4, 0.5, 0.0, "infeasible")]
    assert [r.number for r in pareto_front(rows)] == [1, 2, 0]


@pytest.fixture(scope="module")
def made_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One study with feasible, infeasible and failed trials and confirmed finalists, made once: a
    space of 12 candidates and the baseline, each evaluated whatever the sampler draws (it proposes
    none twice), so its latencies span over 50x (a 5 ms delay beside the baseline's 0.2 ms and less)
    and its feasible trials differ in max_abs (``scaled`` outputs) but not in cosine."""
    folder = tmp_path_factory.mktemp("made")
    model = save(small_cnn(), folder / "cnn.onnx")
    config = folder / "tune.toml"
    space = 'mode = ["ok", "scaled", "noisy", "crash"]\ndelay_us = [5000, 50, 0]\nbuild_ms = [0]\n'
    space += 'a = [0]\nb = [0]\nc = "x"\n'
    config.write_text(f"[measure]\nbudget_s = 0.05\n[space]\n{space}")
    argv = ["tune", str(model), "--backend", SYNTHETIC, "--config", str(config), "--quiet", "--n-trials", "16"]
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


@pytest.fixture
def inconclusive_study(made_study: Path) -> optuna.Study:
    """The same study with its confirmation's intervals widened to include both 1.0 and gains worth
    having, as a noisy host leaves them: the verdict keeps the baseline, its best finalist not
    shown faster."""
    from gpt_optuna.results.winner import record_winner

    shutil.copytree(made_study, "studies")
    study = optuna.load_study(study_name="cnn-syntheticbackend", storage="sqlite:///studies/cnn-syntheticbackend.db")
    confirmed = study.user_attrs["confirmed"]
    for finalist in confirmed["ranking"]:
        finalist |= {"ci_low": 0.6, "ci_high": 3.0, "significant": False}
    study.set_user_attr("confirmed", confirmed)
    summary = record_winner(study)
    assert summary.verdict == "inconclusive" and summary.decided is not None
    assert summary.best is not None and summary.decided.number == 0 != summary.best.number
    return study


def test_an_inconclusive_study_deploys_the_baseline_and_calls_no_finalist_winner(
    inconclusive_study: optuna.Study,
) -> None:
    from gpt_optuna.results.report import best_rows
    from gpt_optuna.results.winner import winner_figure

    study = gpt_optuna.load("studies/cnn-syntheticbackend.db")
    assert study.verdict == "inconclusive" and study.deploy.number == 0
    best = study.best
    assert best is not None and study.winner == best and not best.deployed and best.number != 0
    table = study.trials_dataframe()
    assert list(table.index[table["deploy"]]) == [0] and list(table.index[table["winner"]]) == [best.number]
    summary = summarize_study(inconclusive_study)
    rows = best_rows(collect(inconclusive_study), summary)
    assert rows[0]["trial"] == 0 and rows[0]["deploy"] == "yes" and "winner" not in rows[0]
    shown = winner_figure(summary)
    assert shown.layout.title.text == "gpt-optuna deploys trial 0 (the baseline)"
    assert f"trial {best.number}: not shown faster, not deployed" in shown.data[0].cells.values[1]
    page = render(inconclusive_study)
    assert "winner (trial" not in page and "winner: yes" not in page
    assert f"best finalist, not shown faster (trial {best.number}, confirmed)" in page


@pytest.mark.slow
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
    assert "Latency against max_abs (lower is better)" in page and "Optimization history" in page
    assert "Trials by outcome and reason" in page
    assert "gpt-optuna export --study-name cnn-syntheticbackend --trial N -o FILE" in page
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


GEOMETRY = """<script>
window.addEventListener("load", () => setTimeout(() => {
  const figures = [];
  for (const gd of document.querySelectorAll(".js-plotly-plot")) {
    const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, points = [];
    gd._fullData.forEach((trace, index) => {
      if (trace.type !== "scatter" || !trace.x) return;
      trace.x.forEach((x, i) => {
        const y = trace.y[i];
        if (x === null || y === null) return;
        const trial = trace.customdata ? trace.customdata[i] : null;
        points.push({trace: trace.name, meta: trace.meta || "", index: index, trial: trial,
                     x: xa.l2p(xa.d2l(x)), y: ya.l2p(ya.d2l(y))});
      });
    });
    const traces = gd._fullData.map((t) => t.type);
    const xticks = Array.from(gd.querySelectorAll(".xtick text")).map((t) => t.textContent);
    const notes = (gd._fullLayout.annotations || []).map((a) => a.text);
    figures.push({title: gd._fullLayout.title.text, xtype: xa.type, ytype: ya.type, width: xa._length,
                  height: ya._length, points: points, traces: traces, xticks: xticks, notes: notes});
  }
  const broken = [];  // a number in a cell, or a header's word, laid out over more than one line
  for (const cell of document.querySelectorAll("td, th")) {
    const tokens = cell.tagName === "TH" ? /\\S+/g : /-?\\d[\\d.]*(e[+-]?\\d+)?/g;
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const match of node.textContent.matchAll(tokens)) {
        const range = document.createRange();
        range.setStart(node, match.index);
        range.setEnd(node, match.index + match[0].length);
        const lines = new Set(Array.from(range.getClientRects()).map((r) => Math.round(r.top)));
        if (lines.size > 1) broken.push(match[0]);
      }
    }
  }
  document.body.setAttribute("data-figures", JSON.stringify(figures));
  document.body.setAttribute("data-broken", JSON.stringify(broken));
  document.body.setAttribute("data-page-width", document.documentElement.scrollWidth);
}, 1000));
</script>"""
"""Measures, in the browser, where plotly drew each point of each figure (pixels inside its plot
area, with its trace's kind and its trial), the figures' x ticks and notes, the table cells' numbers
and headers' words laid out over more than one line, and how wide the page is, into attributes
of the page's body."""


def drawn(page: Path, width: int = 1400) -> tuple[list[dict[str, Any]], int]:
    """Each figure of ``page`` as the browser drew it (title, axis types, every scatter point's
    pixel position in its plot area) and the page's width, at a ``width``-pixel window."""
    figures, page_width, _ = laid_out(page, width)
    return figures, page_width


def laid_out(page: Path, width: int = 1400) -> tuple[list[dict[str, Any]], int, list[str]]:
    """:func:`drawn`, and the numbers and header words the browser broke over two lines."""
    measured = page.with_name(page.stem + "-measured.html")
    measured.write_text(page.read_text().replace("</body>", GEOMETRY + "</body>"))
    dom = chromium(f"--window-size={width},3000", "--dump-dom", measured.as_uri()).stdout
    figures = re.search(r'data-figures="([^"]*)"', dom)
    broken = re.search(r'data-broken="([^"]*)"', dom)
    page_width = re.search(r'data-page-width="(\d+)"', dom)
    assert figures and broken and page_width, "the page's figures did not render"
    return json.loads(html.unescape(figures[1])), int(page_width[1]), json.loads(html.unescape(broken[1]))


def assert_readable(figures: list[dict[str, Any]]) -> None:
    """Every point in view; the Pareto front and every latency axis spanning more than 10x on a log
    scale; every mark on its own trial's point, the baseline's apart from the best candidate's; the
    Pareto front drawn above the marks; the history ticked at whole trials."""
    assert figures and all(f["traces"] for f in figures), "a figure drew no trace"
    for figure in figures:
        for point in figure["points"]:
            inside = -2 <= point["x"] <= figure["width"] + 2 and -2 <= point["y"] <= figure["height"] + 2
            assert inside, (figure["title"], point)
        trials = {p["trial"]: p for p in figure["points"] if p["meta"] == "trial"}
        marks = [p for p in figure["points"] if p["meta"] == "mark"]
        for mark in marks:  # on its trial's own point, not at another measurement's latency
            own = trials[mark["trial"]]
            assert abs(mark["x"] - own["x"]) < 1 and abs(mark["y"] - own["y"]) < 1, (figure["title"], mark, own)
        kinds = {p["trace"].split(" (")[0]: p for p in marks}
        best = next((p for name, p in kinds.items() if name.startswith(("winner", "best finalist"))), None)
        if "baseline" in kinds and best is not None:
            apart = abs(kinds["baseline"]["x"] - best["x"]) + abs(kinds["baseline"]["y"] - best["y"])
            assert apart > 25, (figure["title"], kinds)
    pareto = next(f for f in figures if f["title"].startswith("Latency against"))
    assert pareto["xtype"] == "log"
    front = [p for p in pareto["points"] if p["meta"] == "front"]
    assert front and all(p["index"] > m["index"] for p in front for m in pareto["points"] if m["meta"] != "front")
    assert {"baseline", "deployed"} <= {p["trace"].split(" (")[0] for p in pareto["points"] if p["meta"] == "mark"}
    history = next(f for f in figures if f["title"].startswith("Optimization history"))
    assert history["ytype"] == "log" and history["xticks"] and all(t.isdigit() for t in history["xticks"])


def assert_tells_the_truth(study: optuna.Study, figures: list[dict[str, Any]]) -> None:
    """On the Pareto plot, every timed trial drawn once at its search latency, the deploy mark on
    the deployed trial, each re-measured latency on its trial's row, apart from it, and nothing
    called winner that the verdict does not deploy; the accuracy axis tells the feasible trials
    apart where an output metric does."""
    tuned = gpt_optuna.TunedStudy(study, "")  # read as the API reads it
    rows = collect(study)
    pareto = next(f for f in figures if f["title"].startswith("Latency against"))
    drawn_trials = [p["trial"] for p in pareto["points"] if p["meta"] == "trial"]
    assert sorted(drawn_trials) == sorted(r.number for r in rows if r.latency_ms is not None)  # each once
    deployed = [p for p in pareto["points"] if p["trace"].startswith("deployed")]
    assert [p["trial"] for p in deployed] == [tuned.deploy.number]
    names = {p["trace"] for f in figures for p in f["points"]}
    assert tuned.best is not None
    if tuned.best.deployed:
        assert f"winner (trial {tuned.best.number}, confirmed)" in names
    else:
        assert not any(n.startswith("winner") for n in names), names
        assert f"best finalist, not shown faster (trial {tuned.best.number}, confirmed)" in names
    trials = {p["trial"]: p for p in pareto["points"] if p["meta"] == "trial"}
    confirmed = [p for p in pareto["points"] if p["meta"] == "confirmed"]
    assert {p["trial"] for p in confirmed} == {0, tuned.best.number}
    for point in confirmed:
        assert abs(point["y"] - trials[point["trial"]]["y"]) < 1
    figure = tuned.pareto_figure()  # the same, as data: each latency where its measurement put it, named
    search = {r.number: r.latency_ms for r in rows}
    confirmation = summarize_study(study).confirmation
    assert confirmation is not None
    for trace in figure.data:
        for number, x in zip(trace.customdata, trace.x, strict=True) if trace.meta != "link" else ():
            if trace.meta == "confirmed":
                assert x == confirmation.row(number).median_ms  # type: ignore[union-attr]
            else:
                assert x == search[number], (trace.name, number)
        for hover in trace.hovertext or ():
            unnamed = [line for line in hover.split("<br>") if " ms" in line and " latency " not in f" {line}"]
            assert not unnamed, hover  # every latency says which measurement it is
    feasible = [r for r in rows if r.status == "feasible"]
    varies = any(len({r.accuracy[m] for r in feasible}) > 1 for m in ("max_abs", "mean_abs", "rel_l2", "cosine"))
    assert varies  # the study is one where the default axis must tell the trials apart
    feasible_y = {round(trials[r.number]["y"]) for r in feasible if r.number in trials}
    assert len(feasible_y) >= 2, pareto["title"]


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium package (.ci/run installs it)")
@pytest.mark.parametrize("verdict", ["faster", "inconclusive"])
def test_every_figure_draws_its_points_and_marks_in_view_in_a_real_browser(
    request: pytest.FixtureRequest, verdict: str
) -> None:
    study = request.getfixturevalue("study_with_everything" if verdict == "faster" else "inconclusive_study")
    assert summarize_study(study).verdict == verdict
    latencies = [t.user_attrs["latency"]["median_ms"] for t in study.trials if "latency" in t.user_attrs]
    assert max(latencies) / min(latencies) > 50
    page = Path(f"report-{verdict}.html").resolve()
    page.write_text(render(study))
    figures, page_width, broken = laid_out(page)
    assert len(figures) >= 4
    assert_readable(figures)
    assert_tells_the_truth(study, figures)
    assert broken == []  # no number broken inside a cell, no header mid-word
    assert page_width <= 1400  # the tables fit the page
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"report-{verdict}.png"
    chromium("--window-size=1400,5200", f"--screenshot={shot}", page.as_uri())
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
    # the study's first page names the winner: a figure above the dashboard's Best Trial, and the
    # verdict among the user attrs beside it
    winner = gpt_optuna.load("studies/cnn-syntheticbackend.db").winner
    assert winner is not None
    figures = {f["id"]: json.dumps(f["graph_object"]) for f in detail["plotly_graph_objects"]}
    assert f"gpt-optuna's winner: trial {winner.number}" in figures["gpt-optuna-winner"]
    attrs = {a["key"]: a["value"] for a in detail["user_attrs"]}
    assert attrs["Verdict"] == winner.headline and detail["user_attrs"][0]["key"] == "Verdict"  # first


@pytest.mark.slow
@pytest.mark.parametrize("papermill", [False, True], ids=["environment", "papermill"])
def test_the_notebook_runs_as_shipped_from_another_folder_and_names_the_winner(
    study_with_everything: optuna.Study, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, papermill: bool
) -> None:
    before = sorted(str(p) for p in Path("studies").rglob("*"))
    outputs = run_notebook(Path("studies/cnn-syntheticbackend.db"), tmp_path, monkeypatch, papermill=papermill)
    assert sorted(str(p) for p in Path("studies").rglob("*")) == before  # it created nothing
    assert not list((tmp_path / "notebook-run").iterdir())
    text = printed(outputs)
    winner = gpt_optuna.load("studies/cnn-syntheticbackend.db").winner
    assert winner is not None and winner.headline in text
    assert "Pareto front, fastest first (search latencies): trials [" in text
    assert "Warning" not in "".join(o.get("text", "") for o in outputs if o.get("name") == "stderr")
    pages = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert f"winner (trial {winner.number}, {winner.measurement})" in "".join(pages)
    assert not re.search(r"<script[^>]*\ssrc=", "".join(pages))  # nothing fetched: no MathJax from a CDN
    table = next(page for page in pages if "params_mode" in page)  # the parameters shown, not behind "..."
    assert "params_delay_us" in table and "<th>...</th>" not in table
    if CHROMIUM is not None and not papermill:  # the notebook's figures, as a browser draws them
        page = tmp_path / "notebook-figures.html"
        page.write_text(f"<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>{''.join(pages)}</body></html>")
        figures, _ = drawn(page)
        assert len(figures) >= 4
        assert_readable(figures)
        ARTIFACTS.mkdir(exist_ok=True)
        chromium("--window-size=1400,4000", f"--screenshot={ARTIFACTS / 'notebook.png'}", page.as_uri())
        assert (ARTIFACTS / "notebook.png").stat().st_size > 20_000


@pytest.mark.slow
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
    assert "Latency against 1 - cosine" in page and len(re.findall(r'id="figure-\d"', page)) >= 3
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


def test_the_error_axis_is_the_clause_that_tells_the_feasible_trials_apart() -> None:
    from gpt_optuna.protocol.accuracy import parse_criterion
    from gpt_optuna.results.figures import latency_axis
    from gpt_optuna.results.rows import error_axis

    criterion = parse_criterion("det_agree>=1 and box_px<=1 and psnr>=30", user_metrics=True)

    def trial(number: int, latency: float, box_px: float, psnr: float) -> TrialRow:
        accuracy = {"det_agree": 1.0, "box_px": box_px, "psnr": psnr, "cosine": 0.999}
        return TrialRow(number, "feasible", latency, 0.0, None, {}, number == 0, accuracy=accuracy)

    rows = [trial(0, 2.0, 0.0, 60.0), trial(1, 1.0, 0.5, 35.0), trial(2, 1.5, 0.2, 40.0), trial(3, 1.6, 0.4, 50.0)]
    axis = error_axis(rows, criterion)  # every feasible trial agrees on every detection: box_px tells them apart
    assert (axis.metric, axis.title) == ("box_px", "box_px (lower is better)")
    assert [r.number for r in pareto_front(rows, axis)] == [1, 2, 0]
    assert error_axis(rows, criterion, "det_agree").title == "1 - det_agree"  # a similarity, as an error
    cosine = error_axis(rows, criterion, "cosine")
    assert cosine.value({"cosine": 1.0000000000000002}) == 0.0  # a rounded similarity is no negative error
    psnr = error_axis(rows, criterion, "psnr")
    assert psnr.title == "psnr (higher is better)" and [r.number for r in pareto_front(rows, psnr)] == [1, 2, 3, 0]
    assert error_axis(rows, criterion, "max_abs").metric == "max_abs"  # the output metrics every trial records
    with pytest.raises(gpt_optuna.UserError, match="no accuracy metric 'mAP'.*det_agree, box_px, psnr"):
        error_axis(rows, criterion, "mAP")
    assert latency_axis([0.1, 1.2])["type"] == "log" and "type" not in latency_axis([0.1, 0.9, None])


def test_an_agreement_every_feasible_trial_meets_falls_back_to_an_output_metric_that_varies() -> None:
    from gpt_optuna.protocol.accuracy import parse_criterion
    from gpt_optuna.results.figures import pareto_figure
    from gpt_optuna.results.rows import error_axis, tells_apart

    criterion = parse_criterion("note_f1>=1", user_metrics=True)

    def trial(number: int, max_abs: float) -> TrialRow:
        accuracy = {"note_f1": 1.0, "max_abs": max_abs, "mean_abs": max_abs / 10, "rel_l2": 0.0, "cosine": 1.0}
        return TrialRow(number, "feasible", 1.0 + number, 0.0, None, {}, number == 0, accuracy=accuracy)

    rows = [trial(0, 0.0), trial(1, 0.02), trial(2, 0.01)]
    axis = error_axis(rows, criterion)  # note_f1 = 1 for every feasible trial: max_abs tells them apart
    assert axis.metric == "max_abs" and tells_apart(rows, axis)
    same = [trial(0, 0.0), trial(1, 0.0)]
    flat = error_axis(same, criterion)  # nothing tells them apart: the criterion's metric, and the plot says so
    assert flat.metric == "note_f1" and not tells_apart(same, flat)
    notes = [a.text for a in pareto_figure(same, flat).layout.annotations]
    assert "all 2 feasible trials measure the same 1 - note_f1: this axis cannot tell them apart" in notes
    assert not pareto_figure(rows, axis).layout.annotations


def test_importances_need_twenty_feasible_trials_and_leave_out_the_knobs_that_never_varied() -> None:
    from gpt_optuna.results.figures import MIN_IMPORTANCE_TRIALS, importance_absence, importance_figure

    study = optuna.create_study()
    study.enqueue_trial({"threads": 1, "fixed": 0})

    def objective(trial: optuna.Trial) -> float:
        threads, fixed = trial.suggest_int("threads", 1, 8), trial.suggest_categorical("fixed", [0])
        return 10.0 / threads + fixed

    study.optimize(objective, n_trials=MIN_IMPORTANCE_TRIALS - 1)
    assert importance_figure(study) is None
    assert importance_absence(study).startswith("Parameter importances: not drawn: 19 feasible trials")
    study.optimize(objective, n_trials=1)
    figure = importance_figure(study)
    assert figure is not None and list(figure.data[0].y) == ["threads"]  # no empty bar for the fixed knob
    assert "20 feasible trials" in figure.layout.title.text and "rough" in figure.layout.annotations[0].text


def test_the_history_is_ticked_at_whole_trials() -> None:
    from gpt_optuna.results.figures import trial_axis

    assert trial_axis([0, 1, 2])["dtick"] == 1 and trial_axis([0, 37])["dtick"] == 5
    assert trial_axis(list(range(1001)))["dtick"] == 100 and trial_axis([])["dtick"] == 1


def test_an_error_objective_that_may_not_vary_is_said_before_the_search() -> None:
    from gpt_optuna.protocol.accuracy import parse_criterion
    from gpt_optuna.search.error_objective import error_objective_note

    def note(accuracy: str, objectives: tuple[str, ...] = ("latency", "error")) -> list[str]:
        return error_objective_note(objectives, parse_criterion(accuracy, user_metrics=True))

    (demanded,) = note("note_f1>=1")
    assert "every feasible candidate has note_f1 = 1 (its clause demands it), so the search is over latency" in demanded
    (maybe,) = note("note_f1>=0.95 and max_abs<=0.1")
    assert "where every feasible candidate scores the same note_f1" in maybe and "max_abs" in maybe
    assert note("cosine>=0.99") == [] and note("max_abs<=0.1 and note_f1>=1") == []
    assert note("note_f1>=1", ("latency",)) == []
