"""Files other processes read: written whole or not at all, one writer at a time under a lock, and
the locks that tell tuning runs on one host of each other."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

import pytest

from gpt_optuna.core.files import atomic_path, atomic_write, locked
from gpt_optuna.study.recovery import no_tuner_runs_here, tuner_presence


def test_a_write_that_fails_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "timing.cache"
    atomic_write(target, b"old")
    with pytest.raises(OSError, match="disk full"), atomic_path(target) as tmp:
        tmp.write_bytes(b"half of the new")
        raise OSError("disk full")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in target.parent.iterdir()) == ["timing.cache"]
    with atomic_path(tmp_path / "model.onnx", keep_suffix=True) as tmp:
        assert tmp.suffix == ".onnx" and ".tmp" in tmp.name and tmp.parent == tmp_path
        tmp.write_text("graph")
    assert (tmp_path / "model.onnx").read_text() == "graph"
    assert [p.name for p in tmp_path.iterdir() if ".tmp" in p.name] == []


def test_a_reader_sees_one_writers_whole_file_while_many_write_at_once(tmp_path: Path) -> None:
    """Threads of one process share its number: each temporary name is still their own."""
    target = tmp_path / "sensitivity.json"
    payloads = [bytes([i]) * 200_000 for i in range(8)]
    atomic_write(target, payloads[0])
    seen: set[bytes] = set()
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            seen.add(target.read_bytes())

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=lambda d=d: [atomic_write(target, d) for _ in range(10)]) for d in payloads]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join()
    done.set()
    reader.join()
    assert seen <= set(payloads)
    assert target.read_bytes() in payloads
    assert [p.name for p in tmp_path.iterdir()] == ["sensitivity.json"]


def _count(path: Path, times: int) -> None:
    for _ in range(times):
        with locked(path):
            atomic_write(path, str(int(path.read_text()) + 1))


def test_processes_that_read_and_write_under_the_lock_lose_no_update(tmp_path: Path) -> None:
    counter = tmp_path / "counter"
    atomic_write(counter, "0")
    spawn = multiprocessing.get_context("spawn")
    processes = [spawn.Process(target=_count, args=(counter, 25)) for _ in range(3)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0
    assert counter.read_text() == "75"


def _hold_presence(folder: Path, told: multiprocessing.Queue, stop: threading.Event) -> None:
    with tuner_presence(folder) as alone:
        told.put(alone)
        stop.wait(120)


def test_a_tuner_sees_another_on_its_host_and_not_one_that_was_killed(tmp_path: Path) -> None:
    assert no_tuner_runs_here(tmp_path) and list(tmp_path.iterdir()) == []  # a reader creates nothing
    spawn = multiprocessing.get_context("spawn")
    told, stop = spawn.Queue(), spawn.Event()
    other = spawn.Process(target=_hold_presence, args=(tmp_path, told, stop))
    other.start()
    assert told.get(timeout=60) is True
    assert not no_tuner_runs_here(tmp_path)
    with tuner_presence(tmp_path) as alone:
        assert alone is False
    other.kill()
    other.join(60)
    assert no_tuner_runs_here(tmp_path)
    with tuner_presence(tmp_path) as alone:
        assert alone is True
        assert not no_tuner_runs_here(tmp_path)  # this process's own run counts
    assert no_tuner_runs_here(tmp_path)


KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from gpt_optuna.core import files

out, moves = Path(sys.argv[1]), int(sys.argv[2])
targets = [out / "best.onnx", out / "best.onnx.inputs.npz", out / "notes.txt", out / "best.onnx.json"]
staging = files.Staging(targets, targets[-1])
for target in targets:
    staging.path(target).write_text("new " + target.name)
replace, moved = os.replace, []


def replace_then_die(source, target):
    replace(source, target)
    moved.append(target)
    if len(moved) == moves:
        os.kill(os.getpid(), signal.SIGKILL)


os.replace = replace_then_die
staging.commit()
"""
OLD = {"best.onnx": "old model", "best.onnx.json": "old record", "notes.txt": "the user's own"}


def contents(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in folder.iterdir() if p.is_file()}


@pytest.mark.parametrize("moves", [1, 3, 4, 6, 7])
def test_a_staged_set_killed_while_it_moves_in_is_rolled_back_or_whole(tmp_path: Path, moves: int) -> None:
    """A real SIGKILL after ``moves`` of the set's seven moves (three files of the old set aside, the
    record first; four new ones in, the record last): the next writer of the same record finds the
    old files back, or the whole new set, and no staging folder."""
    import subprocess
    import sys

    from gpt_optuna.core.files import STAGING_SUFFIX, roll_back_dead

    for name, text in OLD.items():
        (tmp_path / name).write_text(text)
    killed = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(tmp_path), str(moves)])
    assert killed.returncode == -9
    roll_back_dead(tmp_path / "best.onnx.json")
    new = {name: "new " + name for name in ("best.onnx", "best.onnx.inputs.npz", "notes.txt", "best.onnx.json")}
    assert contents(tmp_path) == (new if moves == 7 else OLD)
    assert not list(tmp_path.glob(f"*{STAGING_SUFFIX}"))


def test_a_staged_set_interrupted_while_it_moves_in_is_rolled_back_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from gpt_optuna.core.files import Staging

    for name, text in OLD.items():
        (tmp_path / name).write_text(text)
    targets = [tmp_path / n for n in ("best.onnx", "best.onnx.inputs.npz", "notes.txt", "best.onnx.json")]
    replace, moved = os.replace, []

    def replace_then_stop(source: Path, target: Path) -> None:
        replace(source, target)
        moved.append(target)
        if len(moved) == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt), Staging(targets, targets[-1]) as staging:
        for target in targets:
            staging.path(target).write_text("new")
        monkeypatch.setattr(os, "replace", replace_then_stop)
        staging.commit()
    monkeypatch.undo()
    assert contents(tmp_path) == OLD and sorted(p.name for p in tmp_path.iterdir()) == sorted(OLD)
