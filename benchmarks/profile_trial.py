"""Where a trial's time goes: ONNX Runtime's profiler on a study's trial (default: the best), time
per operator type and per GPU kernel, summed over timed runs.

Opens the exported trial with the settings it was tuned with, and profiling on, runs
it ``--runs`` times after a warm-up on the study's inputs, and prints the largest entries.

    python benchmarks/profile_trial.py --study-name NAME [--storage URL] [--trial N] [--runs 50]
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
import optuna

from gpt_optuna.backends.onnxruntime import options_from_settings
from gpt_optuna.export import export_trial
from gpt_optuna.model import read_npz, unstack
from gpt_optuna.session import read_record

_DTYPES = {"tensor(float16)": np.float16, "tensor(float)": np.float32}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study-name", required=True)
    parser.add_argument("--storage")
    parser.add_argument("--trial", type=int)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    storage = args.storage or f"sqlite:///studies/{args.study_name}.db"
    study = optuna.load_study(study_name=args.study_name, storage=storage)
    feeds = unstack(read_npz(Path("studies") / args.study_name / "inputs.npz"))[0]
    with tempfile.TemporaryDirectory() as tmp:
        written, _ = export_trial(study, args.trial, Path(tmp) / "trial.onnx")
        side = json.loads(written.with_name(written.name + ".json").read_text())
        settings = read_record(written)["onnxruntime"]
        options = options_from_settings(settings)
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "profile")
        session = ort.InferenceSession(str(written), options, providers=[tuple(p) for p in settings["providers"]])
        types = {i.name: i.type for i in session.get_inputs()}
        inputs = {k: v.astype(_DTYPES.get(types[k], v.dtype)) for k, v in feeds.items() if k in types}
        for _ in range(10):
            session.run(None, inputs)
        for _ in range(args.runs):
            session.run(None, inputs)
        events = json.loads(Path(session.end_profiling()).read_text())
    by_op: collections.Counter[str] = collections.Counter()
    by_kernel: collections.Counter[str] = collections.Counter()
    for event in events:
        args_ = event.get("args", {})
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            by_op[args_.get("op_name", "?")] += event["dur"]
        elif event.get("cat") == "Kernel":
            by_kernel[event.get("name", "?")[:90]] += event["dur"]
    runs = args.runs + 10
    print(f"trial {side['trial']} of {args.study_name}: {side['latency_ms']:.4g} ms in the search")
    print("  " + ", ".join(f"{k}={v}" for k, v in side["params"].items()))
    for title, counter in (("per operator type", by_op), ("per GPU kernel", by_kernel)):
        total = sum(counter.values())
        print(f"{title}: {total / runs / 1000:.4f} ms per run in all")
        for name, dur in counter.most_common(args.top):
            print(f"  {dur / runs / 1000:8.4f} ms  {100 * dur / max(total, 1):5.1f} %  {name}")


if __name__ == "__main__":
    main()
