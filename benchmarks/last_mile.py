"""What the user takes home, checked end to end on the CPU: every reader of a study agrees.

For three models (the shipped CNN; an fp16-friendly MLP tuned with ``--allow-io-change``, where a
reduced-precision candidate may change the model's I/O dtypes; PP-OCRv4's text recognizer from
the registry, with dynamic dims) it tunes in one folder with an absolute storage, then from
another folder reads the study with every reader (the summary, status, best, best --json, the
report's text, best table and plots, the notebook, the study's winner attrs for optuna-dashboard),
exports the winner (no extension given), opens it with ``open_session`` and feeds it the original
model's dtypes, and runs ``check`` against the export's record. It prints one table: reader x
(winner, latency, speedup), and whether every row of a model agrees; then the exported I/O dtypes
against the original's (equal unless the study opted in, and then declared), and for the opted-in
model an export of its best fp16 candidate with reduced-precision I/O, opened by ``open_session``.

    python -m benchmarks.last_mile [--trials 12] [--check-budget 20s] [--workdir DIR] [--no-notebook]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from benchmarks import ROOT, child_env
from benchmarks.models import OCR, PPOCR_REC
from gpt_optuna.graph.feeds import synthetic_feeds
from gpt_optuna.graph.model import load_model_info, parse_shapes, resolve_shapes
from gpt_optuna.testing.registry import download_one
from gpt_optuna.worker.self_test import TINY_MODEL

MEASURE = "[measure]\nbudget_s = 0.1\nmin_samples = 10\n"


def mlp(path: Path) -> Path:
    """An fp16-friendly MLP block, x[8, 256] -> 1024 -> 256 with LayerNorm: fp16 keeps cosine ~1."""
    rng = np.random.default_rng(0)

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name)

    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["o"]),
        helper.make_node("Add", ["o", "x"], ["s"]),
        helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1),
    ]
    init = [weight("w1", 256, 1024), weight("w2", 1024, 256)]
    init += [numpy_helper.from_array(np.ones(256, np.float32), "gamma")]
    init += [numpy_helper.from_array(np.zeros(256, np.float32), "beta")]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 256])],
        init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "gpt_optuna.cli", *args]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=child_env(), timeout=3600)
    if done.returncode not in (0, 1, 3):
        raise SystemExit(f"gpt-optuna {' '.join(args)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return done


def from_text(text: str) -> tuple[int | None, float | None, float | None]:
    """(winner, its latency, speedup) from the verdict lines every text reader prints."""
    base = re.search(r"baseline \(trial (\d+)\): ([\d.e+-]+) ms", text)
    if re.search(r"^best: the baseline itself", text, re.MULTILINE) and base:
        return int(base[1]), float(base[2]), 1.0
    best = re.search(r"best \(trial (\d+)\): ([\d.e+-]+) ms \(\w+\), ([\d.]+)x the baseline", text)
    return (int(best[1]), float(best[2]), float(best[3])) if best else (None, None, None)


def from_record(record: dict, number_key: str = "number") -> tuple[int | None, float | None, float | None]:
    return record.get(number_key), record.get("latency_ms"), record.get("speedup")


def readers(where: list[str], cwd: Path, tuned: str, notebook: bool) -> tuple[dict[str, tuple], Path]:
    """Each reader's (winner, latency, speedup), and the exported file."""
    import optuna

    from gpt_optuna.results.report import best_rows
    from gpt_optuna.results.rows import collect, marks
    from gpt_optuna.study.storage import load_study, open_storage
    from gpt_optuna.study.summary import summarize_study

    seen = {"summary (tune)": from_text(tuned)}
    seen["status"] = from_text(cli("status", *where, cwd=cwd).stdout)
    seen["best"] = from_text(cli("best", *where, cwd=cwd).stdout)
    seen["best --json"] = from_record(json.loads(cli("best", *where, "--json", cwd=cwd).stdout))
    cli("report", *where, "-o", "report.html", cwd=cwd)
    page = (cwd / "report.html").read_text().replace("&#x27;", "'")
    seen["report text"] = from_text(page[page.index("<pre>") : page.index("</pre>")])
    storage = open_storage(where[1], create=False, read_only=True)
    study = load_study(storage, where[3])
    summary = summarize_study(study)
    rows = collect(study)
    top = best_rows(rows, summary)[0]
    speedup = float(top["speedup"].split("x")[0]) if top["speedup"] else None
    seen["report best table"] = (top["trial"], top["latency_ms"], speedup)
    placed = {m.label: m for m in marks(summary)}
    winner = placed.get("winner") or placed.get("baseline, the winner")
    plotted = None if winner is None else winner.latency_ms if winner.confirmed_ms is None else winner.confirmed_ms
    seen["report plots"] = (winner.trial, plotted, None) if winner else (None, None, None)
    attrs = optuna.load_study(study_name=where[3], storage=storage).user_attrs.get("winner", {})
    seen["study attrs (dashboard)"] = from_record(attrs, "trial")
    if notebook:
        seen["notebook"] = from_text(run_notebook(where[1].removeprefix("sqlite:///"), cwd))
    exported = cli("export", *where, "-o", "winner", cwd=cwd)
    out = Path(exported.stdout.split()[1])
    side = json.loads((cwd / f"{out}.json").read_text())
    seen["export side file"] = from_record(side, "trial")
    seen["export (printed)"] = from_headline(exported.stdout)
    return seen, cwd / out


def from_headline(text: str) -> tuple[int | None, float | None, float | None]:
    """(winner, latency, speedup) from a verdict headline that names them."""
    found = re.search(r"trial (\d+)[^(]* ([\d.]+)x the baseline.*?\(([\d.e+-]+) ms against", text)
    if found:
        return int(found[1]), float(found[3]), float(found[2])
    return (None, None, None)


def run_notebook(database: str, cwd: Path) -> str:
    """The shipped notebook, executed on the study; what it printed."""
    import nbclient
    import nbformat

    notebook = nbformat.read(ROOT / "notebooks" / "pareto.ipynb", as_version=4)
    resources = {"metadata": {"path": str(cwd)}}
    os.environ["GPT_OPTUNA_STORAGE"] = database  # the kernel's environment names the study
    try:
        nbclient.NotebookClient(notebook, timeout=600, kernel_name="python3", resources=resources).execute()
    finally:
        del os.environ["GPT_OPTUNA_STORAGE"]
    return "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.outputs)


def agree(seen: dict[str, tuple]) -> bool:
    """Every reader names the same winner with the same latency (4 digits) and speedup (3 decimals)."""
    first = seen["best --json"]
    for number, latency, speedup in seen.values():
        if number != first[0] or latency is None or abs(latency / first[1] - 1) > 1e-3:
            return False
        if speedup is not None and abs(speedup - first[2]) > 2e-3:
            return False
    return True


def dtypes(path: Path) -> str:
    info = load_model_info(path)
    return ", ".join(f"{s.name}:{s.dtype.name}" for s in (*info.inputs, *info.outputs))


def opened(exported: Path, original: Path, feeds: dict[str, np.ndarray]) -> float:
    """The export opened by open_session, fed the original model's dtypes: cosine to the original's outputs."""
    import onnxruntime as ort

    import gpt_optuna

    session = gpt_optuna.open_session(exported)
    got = session.run(None, feeds)[0].astype(np.float64).ravel()
    want = ort.InferenceSession(str(original), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    want = want.astype(np.float64).ravel()
    return float(got @ want / (np.linalg.norm(got) * np.linalg.norm(want)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--check-budget", default="20s")
    parser.add_argument("--workdir", type=Path, help="keep the studies here (default: a temporary folder)")
    parser.add_argument("--no-notebook", action="store_true", help="skip executing the notebook")
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="last_mile-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    ocr = download_one(OCR, PPOCR_REC)
    cases = [
        ("small CNN (shipped)", TINY_MODEL, [], ""),
        ("MLP, --allow-io-change", mlp(work / "mlp.onnx"), ["--allow-io-change"], "keep_io_fp32 = [true, false]\n"),
        ("PP-OCRv4 recognizer (dynamic)", ocr, ["--shape", "x:1x3x48x320"], ""),
    ]
    tables, exports = [], []
    for index, (label, model, flags, space) in enumerate(cases):
        made, elsewhere = work / f"m{index}" / "made", work / f"m{index}" / "elsewhere"
        made.mkdir(parents=True, exist_ok=True)
        elsewhere.mkdir(parents=True, exist_ok=True)
        (made / "tune.toml").write_text(MEASURE + '[space]\nprecision = ["fp32", "fp16"]\n' + space)
        where = ["--storage", f"sqlite:///{work}/m{index}/study.db", "--study-name", f"m{index}"]
        print(f"== {label}: tuning {args.trials} trials ...", file=sys.stderr, flush=True)
        search = ["--config", "tune.toml", *where, "--n-trials", str(args.trials), *flags, "--quiet"]
        tuned = cli("tune", str(model), *search, cwd=made)
        seen, exported = readers(where, elsewhere, tuned.stdout, not args.no_notebook)
        info = load_model_info(model)
        feeds = synthetic_feeds(info, resolve_shapes(info, parse_shapes([f for f in flags if ":" in f])))
        cosine = opened(exported, model, feeds)
        gate = ["--baseline", f"{exported}.json", "--budget", args.check_budget, "--tolerance", "50%"]
        check = cli("check", str(model), *gate, "--config", str(made / "tune.toml"), "--quiet", cwd=elsewhere)
        verdicts = [line for line in check.stdout.splitlines() if line.startswith(("ok:", "FAILED:"))]
        recorded = re.search(r"against the recorded ([\d.e+-]+) ms", check.stdout)
        seen["check (recorded latency)"] = (seen["best --json"][0], float(recorded[1]) if recorded else None, None)
        tables.append((label, tuned.stdout.splitlines()[0], seen, agree(seen), check.returncode, verdicts))
        allowed = "--allow-io-change" in flags
        exports.append((label, "winner", dtypes(model), dtypes(exported), allowed, cosine))
        if allowed:
            exports.append(opted_in_export(where, elsewhere, model, feeds))
    for label, headline, seen, same, code, verdicts in tables:
        print(f"\n{label}\n  {headline}")
        print(f"  {'reader':<28}{'winner':>8}{'latency ms':>13}{'speedup':>10}")
        for reader, (number, latency, speedup) in seen.items():
            shown = f"{speedup:.3f}x" if speedup is not None else "-"
            print(
                f"  {reader:<28}{number if number is not None else '-':>8}{latency or float('nan'):>13.4f}{shown:>10}"
            )
        print(f"  every row equal: {'yes' if same else 'NO'}; check exit {code}: {' / '.join(verdicts)}")
    print(f"\n{'model':<32}{'export':<18}{'opt-in':<8}{'same I/O':<10}{'cosine':>9}  exported I/O (original I/O)")
    for label, which, original, exported_io, allowed, cosine in exports:
        same = "yes" if original == exported_io else "declared" if allowed else "NO"
        print(
            f"{label:<32}{which:<18}{'yes' if allowed else 'no':<8}{same:<10}{cosine:>9.6f}  {exported_io} ({original})"
        )


def opted_in_export(where: list[str], cwd: Path, model: Path, feeds: dict[str, np.ndarray]) -> tuple:
    """The best feasible fp16 candidate with reduced-precision I/O of an opted-in study, exported and opened."""
    from optuna.trial import TrialState

    from gpt_optuna.study.storage import load_study, open_storage

    study = load_study(open_storage(where[1], create=False, read_only=True), where[3])
    changed = [t for t in study.trials if t.state is TrialState.COMPLETE and "io_dtypes" in t.user_attrs]
    if not changed:
        return ("MLP, --allow-io-change", "no fp16-I/O trial", dtypes(model), "-", True, float("nan"))
    best = min(changed, key=lambda t: t.values[0])
    cli("export", *where, "--trial", str(best.number), "-o", "half", cwd=cwd)
    exported = cwd / "half.onnx"
    side = json.loads((cwd / "half.onnx.json").read_text())["interface"]
    which = f"trial {best.number} fp16 I/O" + ("" if side["changed"] else " (undeclared!)")
    return ("MLP, --allow-io-change", which, dtypes(model), dtypes(exported), True, opened(exported, model, feeds))


if __name__ == "__main__":
    main()
