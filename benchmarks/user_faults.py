"""Faults a careless user makes, each for real, through the real command: does anything of the
user's change, and does the command work again once the cause is gone?

One study of a model of ``--megabytes`` MB (its weights in the file, so an export copies all of
them), then each case: an export over the tuned model; an export killed with SIGKILL while it
writes; the model replaced (by another, by garbage) before an export; a journal or SQLite storage
named at a file of notes; a ``--metric`` and a data loader that hang; a corrupt, truncated, empty
and locked database; a folder given as the database. Per case: the exit code, the time taken,
whether any file of the user's changed, the first line printed, and the exit code of the command
run again once the cause is gone (the same command after a kill).

    python -m benchmarks.user_faults [--megabytes 300] [--timeout 20]
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import child_env
from gpt_optuna.testing.wide_matmul import save_wide_matmul

CLI = [sys.executable, "-m", "gpt_optuna.cli"]
STUDY = "S"
HANGS = (
    "import time\n\ndef metric(outputs, references, inputs):\n    time.sleep(3600)\n\n"
    "def load():\n    time.sleep(3600)\n"
)
WORKS = (
    "import numpy as np\n\ndef metric(outputs, references, inputs):\n    return {'agree': 1.0}\n\n"
    "def load():\n    return [{'x': np.ones((1, N), np.float32)}]\n"
)


@dataclass
class Case:
    """A command run as a user would, what it must leave as it was, and the command once the cause
    is gone (``then``: None, the same command)."""

    name: str
    argv: list[str]
    watched: list[str]
    then: list[str] | None = None
    prepare: Callable[[Path], None] = lambda folder: None
    mend: Callable[[Path], None] = lambda folder: None
    kill_when: Callable[[Path], bool] | None = None
    hold: Callable[[Path], contextlib.AbstractContextManager[object]] | None = None
    row: dict[str, str] = field(default_factory=dict)


def digest(folder: Path, names: list[str]) -> dict[str, str]:
    found = {}
    for name in names:
        path = folder / name
        found[name] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "absent"
    return found


def run(argv: list[str], folder: Path, kill_when: Callable[[Path], bool] | None = None) -> tuple[int, float, str]:
    """``gpt-optuna ARGV`` in ``folder``: its exit code, seconds, and the first line it printed
    to stderr (its own error line where it wrote one, else its last); killed with SIGKILL as soon
    as ``kill_when`` holds."""
    started = time.monotonic()
    child = subprocess.Popen(
        [*CLI, *argv], cwd=folder, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if kill_when is not None:
        while child.poll() is None and not kill_when(folder):
            time.sleep(0.001)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)
    _, err = child.communicate(timeout=900)
    lines = [line for line in err.splitlines() if line.startswith("gpt-optuna:")] or err.splitlines()[-1:]
    return child.returncode, time.monotonic() - started, (lines[0] if lines else "")[:150]


@contextlib.contextmanager
def locked_database(db: Path) -> Iterator[object]:
    """Another process holding ``db`` locked to all others (its exclusive locking mode: a write-ahead
    log's readers are kept out too) until the block ends."""
    code = (
        f"import sqlite3, time; c = sqlite3.connect({str(db)!r}); c.execute('PRAGMA locking_mode=EXCLUSIVE');"
        " c.execute('BEGIN EXCLUSIVE'); print(1, flush=True)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code + "; time.sleep(3600)"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "1"
    try:
        yield holder
    finally:
        holder.kill()
        holder.wait()


def cases(timeout: str, n: int) -> list[Case]:
    db = f"studies/{STUDY}.db"
    copy = "case.db"
    on_copy = ["status", "--storage", f"sqlite:///{copy}", "--study-name", STUDY]

    def copy_of_db(change: Callable[[bytes], bytes]) -> Callable[[Path], None]:
        return lambda folder: (folder / copy).write_bytes(change((folder / db).read_bytes()))

    def restore(folder: Path) -> None:
        shutil.copyfile(folder / db, folder / copy)

    def replace_model(content: Callable[[Path], bytes]) -> Callable[[Path], None]:
        def prepare(folder: Path) -> None:
            shutil.copyfile(folder / "model.onnx", folder / "model.kept")
            (folder / "model.onnx").write_bytes(content(folder))

        return prepare

    def put_model_back(folder: Path) -> None:
        os.replace(folder / "model.kept", folder / "model.onnx")

    def staged_or_written(folder: Path) -> bool:
        return any((folder / "killed").iterdir())

    export = ["export", "--study-name", STUDY, "--trial", "0"]
    new_tune = ["tune", "model.onnx", "--n-trials", "1", "--confirm-top", "0", "--timeout", timeout, "-q"]
    return [
        Case(
            "export -o the tuned model --force",
            [*export, "-o", "model.onnx", "--force"],
            ["model.onnx", db],
            then=[*export, "-o", "out/over"],
        ),
        Case(
            "export killed (SIGKILL) while it writes",
            [*export, "-o", "killed/best"],
            ["model.onnx", db],
            kill_when=staged_or_written,
        ),
        Case(
            "export of a model replaced by another",
            [*export, "-o", "out/replaced"],
            [db],
            prepare=replace_model(lambda f: (f / "other.onnx").read_bytes()),
            mend=put_model_back,
        ),
        Case(
            "export of a model replaced by garbage",
            [*export, "-o", "out/garbage"],
            [db],
            prepare=replace_model(lambda f: b"notes, not a model\n"),
            mend=put_model_back,
        ),
        Case(
            "tune --storage journal:NOTES",
            [*new_tune, "--storage", "journal:notes.txt", "--study-name", "J"],
            ["notes.txt", "model.onnx"],
            then=[*new_tune, "--storage", "journal:j.log", "--study-name", "J"],
        ),
        Case(
            "tune --storage sqlite:///NOTES",
            [*new_tune, "--storage", "sqlite:///notes.txt", "--study-name", "Q"],
            ["notes.txt", "model.onnx"],
            then=[*new_tune, "--storage", "sqlite:///q.db", "--study-name", "Q"],
        ),
        Case(
            "tune --metric that hangs",
            [*new_tune, "--study-name", "M", "--metric", "hangs.py:metric"],
            ["model.onnx", db],
            then=[*new_tune, "--study-name", "M", "--metric", "works.py:metric"],
        ),
        Case(
            "tune --inputs loader that hangs",
            [*new_tune, "--study-name", "L", "--inputs", "hangs.py:load"],
            ["model.onnx", db],
            then=[*new_tune, "--study-name", "L", "--inputs", "works.py:load"],
        ),
        Case(
            "status on a corrupt database",
            on_copy,
            [db],
            prepare=copy_of_db(lambda b: os.urandom(len(b))),
            mend=restore,
        ),
        Case(
            "status on a truncated database",
            on_copy,
            [db],
            prepare=copy_of_db(lambda b: b[: len(b) // 3]),
            mend=restore,
        ),
        Case("status on an empty database", on_copy, [db], prepare=copy_of_db(lambda b: b""), mend=restore),
        Case(
            "status on a locked database",
            ["status", "--study-name", STUDY],
            [db, "model.onnx"],
            hold=lambda folder: locked_database(folder / db),
        ),
        Case(
            "status --storage sqlite:///FOLDER",
            ["status", "--storage", "sqlite:///out", "--study-name", STUDY],
            [db],
            then=["status", "--study-name", STUDY],
        ),
    ]


def run_case(case: Case, folder: Path) -> None:
    case.prepare(folder)
    before = digest(folder, case.watched)
    with case.hold(folder) if case.hold is not None else contextlib.nullcontext():
        code, seconds, line = run(case.argv, folder, case.kill_when)
    changed = [name for name, value in digest(folder, case.watched).items() if before[name] != value]
    case.mend(folder)
    again, _, again_line = run(case.then or case.argv, folder)
    case.row = {
        "exit": str(code),
        "s": f"{seconds:.1f}",
        "user files changed": ", ".join(changed) or "none",
        "printed": line.replace("|", "/"),
        "then": f"{again}" + ("" if again == 0 else f" ({again_line[:80]})"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=300.0, help="the model's size")
    parser.add_argument("--timeout", default="20", help="--timeout of the cases that tune")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = save_wide_matmul(folder / "model.onnx", args.megabytes)
        n = int(max(8, (args.megabytes * 1e6 / 4) ** 0.5))
        save_wide_matmul(folder / "other.onnx", 1)
        (folder / "notes.txt").write_text("my notes: not a storage\n")
        (folder / "hangs.py").write_text(HANGS)
        (folder / "works.py").write_text(WORKS.replace("N", str(n)))
        (folder / "out").mkdir()
        (folder / "killed").mkdir()
        made = run(["tune", model.name, "--study-name", STUDY, "--n-trials", "2", "--confirm-top", "0", "-q"], folder)
        print(f"study of a {model.stat().st_size / 1e6:.0f} MB model made in {made[1]:.1f} s (exit {made[0]})")
        if made[0] != 0:
            print(made[2])
            return 1
        every = cases(args.timeout, n)
        for case in every:
            run_case(case, folder)
            print(f"  {case.name}: {case.row}", file=sys.stderr)
    print("| case | exit | s | user files changed | printed | run again once mended |")
    print("| --- | --- | --- | --- | --- | --- |")
    for case in every:
        r = case.row
        print(f"| {case.name} | {r['exit']} | {r['s']} | {r['user files changed']} | {r['printed']} | {r['then']} |")
    failed = [c.name for c in every if c.row["user files changed"] != "none" or c.row["then"] != "0"]
    print(f"\ncases where a file of the user's changed or the command failed again: {len(failed)} {failed or ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
