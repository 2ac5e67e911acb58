"""The readers' direct view of a study's SQLite file against Optuna's own database storage: the same
studies and trials, field by field, on a study written by Optuna with every kind of value; what a
tuner commits beside it seen at the next read; writes refused; a file of another schema left to
Optuna."""

from __future__ import annotations

import math
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

import gpt_optuna
from gpt_optuna.study.sqlite_reader import SQLiteReader, open_reader
from gpt_optuna.study.storage import count_by_state, open_storage


def _objective(trial: optuna.Trial) -> float:
    x = trial.suggest_float("x", -2.0, 2.0)
    trial.suggest_int("n", 1, 64, log=True)
    choice = trial.suggest_categorical("kind", ["fp16", None, 3, True])
    trial.suggest_float("step", 0.0, 1.0, step=0.25)
    trial.set_user_attr("nested", {"list": [1, 2.5, "a"], "none": None})
    trial.storage.set_trial_system_attr(trial._trial_id, "constraints", [x - 1.0])
    for step, value in enumerate((1.0, float("nan"), float("inf"), -float("inf"))):
        trial.report(value, step)
    if choice == 3:
        raise optuna.TrialPruned()
    if choice is True:
        raise RuntimeError("a failed trial")
    return float("inf") if choice is None else x * x


@pytest.fixture()
def study_file(tmp_path: Path) -> Path:
    """A study file written by Optuna: 24 trials of every state and kind of value, a waiting and a
    running trial, a second study of two objectives."""
    path = tmp_path / "study.db"
    url = f"sqlite:///{path}"
    study = optuna.create_study(study_name="one", storage=url, sampler=optuna.samplers.RandomSampler(seed=0))
    study.set_user_attr("summary", {"trials": 3, "nested": [None, 1.5]})
    study.set_metric_names(["latency"])
    for kind in ("fp16", None, 3, True):  # complete, complete at inf, pruned, failed: whatever the sampler draws
        study.enqueue_trial({"kind": kind})
    study.optimize(_objective, n_trials=24, catch=(RuntimeError,))
    study.enqueue_trial({"x": 0.5})
    study.ask()
    study.enqueue_trial({"x": 0.25})
    two = optuna.create_study(study_name="two", storage=url, directions=["minimize", "maximize"])
    two.optimize(lambda t: (t.suggest_float("y", 0, 1), -1.0), n_trials=3)
    return path


def _fields(trial: FrozenTrial) -> dict[str, object]:
    """A trial's fields, NaN written as a string (NaN equals nothing)."""

    def plain(value: object) -> object:
        return "nan" if isinstance(value, float) and math.isnan(value) else value

    fields = {key: value for key, value in vars(trial).items() if "intermediate" not in key}
    return fields | {"intermediate": {k: plain(v) for k, v in trial.intermediate_values.items()}}


def test_the_reader_reads_what_optunas_storage_reads(study_file: Path) -> None:
    reader = open_reader(study_file)
    assert reader is not None
    optunas = optuna.storages.RDBStorage(f"sqlite:///{study_file}", skip_table_creation=True)
    assert [vars(s) for s in reader.get_all_studies()] == [vars(s) for s in optunas.get_all_studies()]
    for name in ("one", "two"):
        study_id = optunas.get_study_id_from_name(name)
        assert reader.get_study_id_from_name(name) == study_id
        assert reader.get_study_name_from_id(study_id) == name
        assert reader.get_study_directions(study_id) == optunas.get_study_directions(study_id)
        assert reader.get_study_user_attrs(study_id) == optunas.get_study_user_attrs(study_id)
        assert reader.get_study_system_attrs(study_id) == optunas.get_study_system_attrs(study_id)
        theirs = optunas.get_all_trials(study_id)
        assert [_fields(t) for t in reader.get_all_trials(study_id)] == [_fields(t) for t in theirs]
        for state in TrialState:
            assert reader.get_n_trials(study_id, state) == optunas.get_n_trials(study_id, state)
            chosen = reader.get_all_trials(study_id, states=(state,))
            assert [t.number for t in chosen] == [t.number for t in theirs if t.state == state]
        last = theirs[-1]
        assert reader.get_trial_id_from_study_id_trial_number(study_id, last.number) == last._trial_id
        assert _fields(reader.get_trial(last._trial_id)) == _fields(last)
    one = optunas.get_study_id_from_name("one")
    states = {t.state for t in optunas.get_all_trials(one)}
    assert states == set(TrialState), "the study holds a trial of every state"
    with pytest.raises(KeyError):
        reader.get_study_id_from_name("three")
    with pytest.raises(KeyError):
        reader.get_trial_id_from_study_id_trial_number(one, 999)


def test_a_read_only_open_reads_through_the_reader_and_counts_by_state(study_file: Path) -> None:
    study = optuna.load_study(study_name="one", storage=open_storage(f"sqlite:///{study_file}", read_only=True))
    assert isinstance(study._storage, SQLiteReader)
    expected = optuna.load_study(study_name="one", storage=f"sqlite:///{study_file}")
    assert count_by_state(study) == count_by_state(expected)
    assert study.best_trial.number == expected.best_trial.number
    assert study.user_attrs == expected.user_attrs


def test_what_a_writer_commits_is_read_next_time_and_writes_are_refused(study_file: Path) -> None:
    reader = open_reader(study_file)
    assert reader is not None
    study_id = reader.get_study_id_from_name("one")
    before = reader.get_all_trials(study_id, deepcopy=False)
    assert reader.get_all_trials(study_id, deepcopy=False) == before
    script = (
        "import optuna, sys; s = optuna.load_study(study_name='one', storage=sys.argv[1]);"
        " s.optimize(lambda t: t.suggest_float('x', -2, 2) ** 2, n_trials=2)"
    )
    subprocess.run([sys.executable, "-c", script, f"sqlite:///{study_file}"], check=True)
    after = reader.get_all_trials(study_id, deepcopy=False)
    complete = [sum(t.state == TrialState.COMPLETE for t in trials) for trials in (before, after)]
    assert complete[1] == complete[0] + 2  # the waiting trial and a new one
    copied = reader.get_all_trials(study_id)
    copied[0].user_attrs["nested"]["list"].append("changed")
    assert "changed" not in reader.get_all_trials(study_id, deepcopy=False)[0].user_attrs["nested"]["list"]
    study = optuna.load_study(study_name="one", storage=reader)
    with pytest.raises(PermissionError, match="for reading only"):
        study.set_user_attr("a", 1)
    with pytest.raises(PermissionError, match="for reading only"):
        study.ask()


def test_a_file_of_another_schema_is_left_to_optuna(study_file: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    shutil.copy(study_file, other)
    with sqlite3.connect(other) as db:
        db.execute("UPDATE version_info SET schema_version = schema_version + 1")
    assert open_reader(other) is None
    empty = tmp_path / "being-created.db"
    empty.touch()
    assert open_reader(empty) is None


def test_gpt_optuna_load_reads_a_study_optuna_wrote(study_file: Path) -> None:
    study = gpt_optuna.load(study_file, "one")
    assert isinstance(study.study._storage, SQLiteReader)
    assert len(study.study.trials) == 26


def test_a_reader_leaves_no_file_beside_a_study_in_wal_mode(study_file: Path) -> None:
    db = sqlite3.connect(study_file)
    db.execute("PRAGMA journal_mode=WAL")  # as a tuner leaves the file
    db.close()
    folder = sorted(study_file.parent.iterdir())
    script = "import gpt_optuna, sys; print(len(gpt_optuna.load(sys.argv[1], 'one').study.trials))"  # never closed
    read = subprocess.run([sys.executable, "-c", script, str(study_file)], check=True, capture_output=True, text=True)
    assert read.stdout.strip() == "26" and sorted(study_file.parent.iterdir()) == folder
    reader = open_reader(study_file)
    assert reader is not None and len(reader.get_all_studies()) == 2
    reader.close()
    assert sorted(study_file.parent.iterdir()) == folder
    tuner = sqlite3.connect(study_file, isolation_level=None)  # a tuner's companions: left while it has the file
    tuner.execute("SELECT count(*) FROM trials").fetchall()
    companions = sorted(study_file.parent.iterdir())
    assert len(companions) == 3
    reader = open_reader(study_file)
    assert reader is not None and len(reader.get_all_studies()) == 2
    reader.close()
    assert sorted(study_file.parent.iterdir()) == companions
    tuner.execute("UPDATE studies SET study_name = 'renamed' WHERE study_name = 'two'")
    tuner.close()
    assert sorted(study_file.parent.iterdir()) == folder
    assert "renamed" in {s.study_name for s in optuna.get_all_study_summaries(f"sqlite:///{study_file}")}
