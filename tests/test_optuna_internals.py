"""The contract of Optuna's private parts the tuner uses (``gpt_optuna.study.optuna_internals``),
checked against the installed Optuna; ``.ci/run`` runs this module again under each supported release."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState

from gpt_optuna.study import optuna_internals as internals
from gpt_optuna.study.storage import open_storage

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def study(tmp_path: Path) -> optuna.Study:
    """A study in a SQLite file, opened as the tuner opens one (Optuna's cache over the database)."""
    return optuna.create_study(storage=open_storage(f"sqlite:///{tmp_path / 'contract.db'}"), study_name="contract")


def release(version: str) -> str:
    return ".".join(version.split(".")[:2])


def test_the_installed_optuna_is_a_supported_release_and_the_requirement_bounds_it_to_them() -> None:
    assert release(optuna.__version__) in internals.SUPPORTED_RELEASES
    requirements = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (optuna_requirement,) = [r for r in requirements if re.match(r"optuna\b", r)]
    lowest, highest = internals.SUPPORTED_RELEASES[0], internals.SUPPORTED_RELEASES[-1]
    major, minor = highest.split(".")
    assert optuna_requirement == f"optuna>={lowest},<{major}.{int(minor) + 1}"
    ci = (ROOT / ".ci" / "run").read_text()
    for supported in internals.SUPPORTED_RELEASES:
        assert f"optuna=={supported}." in ci, f"CI does not run this contract under Optuna {supported}"


def test_a_study_and_a_trial_are_found_in_their_storage_by_their_ids(study: optuna.Study) -> None:
    trial = study.ask()
    storage = internals.storage_of(study)
    assert internals.study_id(study) == storage.get_study_id_from_name("contract")
    assert storage.get_trial(internals.trial_id(trial)).number == trial.number
    study.tell(trial, 1.0)
    (frozen,) = study.get_trials()
    assert internals.trial_id(frozen) == internals.trial_id(trial)
    target = internals.note_target(study, frozen)
    assert (target.storage, target.study, target._trial_id) == (storage, study, internals.trial_id(frozen))


def test_the_shared_trials_are_the_studys_trials_not_copied(study: optuna.Study) -> None:
    for value in (1.0, 2.0):
        study.tell(study.ask(), value)
    shared = internals.shared_trials(study)
    assert [t.value for t in shared] == [t.value for t in study.get_trials()] == [1.0, 2.0]
    assert all(a is b for a, b in zip(shared, internals.shared_trials(study), strict=True))


def test_the_database_is_found_behind_the_cache_and_nowhere_else(study: optuna.Study, tmp_path: Path) -> None:
    storage = internals.storage_of(study)
    assert internals.is_cached(storage)
    backend = internals.database(storage)
    assert isinstance(backend, optuna.storages.RDBStorage) and backend.engine.name in internals.UPSERTS
    assert internals.database(optuna.storages.InMemoryStorage()) is None
    journal = open_storage(f"journal:{tmp_path / 'journal.log'}")
    assert not internals.is_cached(journal) and internals.database(journal) is None


def test_params_given_inside_the_block_are_held_not_written(study: optuna.Study) -> None:
    trial = study.ask()
    storage = trial.storage
    with internals.params_held(trial) as held:
        value = trial.suggest_categorical("a", (0, 1, 2))
    assert trial.storage is storage
    assert held == [("a", value, CategoricalDistribution((0, 1, 2)))]
    assert study.get_trials()[0].params == {}


def test_a_running_trial_is_written_in_one_transaction_as_optuna_writes_it(study: optuna.Study) -> None:
    backend = internals.database(internals.storage_of(study))
    assert backend is not None
    distribution = CategoricalDistribution((0, 1, 2))
    for number in range(2):  # the first param new to this process, then known to it
        trial = study.ask()
        params = [("a", distribution.to_internal_repr(number), distribution)]
        system = {f"{internals.CONSTRAINTS_KEY}:accuracy": -0.5}
        internals.write_running_trial(trial, backend, {"owner": "host:1"}, system, params)
        study.tell(trial, 1.0)
    for number, frozen in enumerate(study.get_trials()):
        assert frozen.params == {"a": number} and frozen.distributions == {"a": distribution}
        assert frozen.user_attrs == {"owner": "host:1"} and frozen.constraints == {"accuracy": -0.5}
    trial = study.ask()
    other = [("a", 0.5, FloatDistribution(0.0, 1.0))]
    with pytest.raises(ValueError):  # a param of another distribution than the study gave it
        internals.write_running_trial(trial, backend, {}, {}, other)
    study.tell(trial, state=TrialState.FAIL)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        internals.write_running_trial(trial, backend, {"late": 1}, {}, [])


def test_a_constraint_is_stored_under_the_key_optuna_reads(study: optuna.Study) -> None:
    trial = study.ask()
    trial.set_constraint("accuracy", 0.25)
    assert internals.storage_of(study).get_trial(internals.trial_id(trial)).system_attrs == {
        f"{internals.CONSTRAINTS_KEY}:accuracy": 0.25
    }


def test_the_database_counts_trials_by_state(study: optuna.Study) -> None:
    study.tell(study.ask(), 1.0)
    study.tell(study.ask(), state=TrialState.FAIL)
    study.ask()
    backend = internals.database(internals.storage_of(study))
    assert backend is not None
    counted = internals.count_in_database(backend, study)
    assert counted == {TrialState.COMPLETE: 1, TrialState.FAIL: 1, TrialState.RUNNING: 1}


def test_a_storage_lists_its_studies_as_frozen_studies(study: optuna.Study) -> None:
    (listed,) = internals.storage_of(study).get_all_studies()
    assert isinstance(listed, internals.FrozenStudy) and listed.study_name == "contract"
