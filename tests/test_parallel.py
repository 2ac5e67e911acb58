"""Several workers on one study: threads of one tuner, and worker processes joining from another
folder over a journal file, PostgreSQL or the gRPC storage proxy; real processes and real kills."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import optuna
import pytest
from conftest import SYNTHETIC, matmul_model, save, synthetic_config, tune
from optuna.trial import FrozenTrial, TrialState

from gpt_optuna.cli import main
from gpt_optuna.core.errors import EXIT_NO_FEASIBLE, UserError
from gpt_optuna.protocol.process import Worker, gpu_names
from gpt_optuna.search.lanes import check_devices
from gpt_optuna.search.objective import Lane
from gpt_optuna.study.record import SPACE_ATTR
from gpt_optuna.study.storage import open_storage
from gpt_optuna.study.taxonomy import has_own_result, retried_numbers

SLOW = 'mode = ["ok"]\nbuild_ms = [1000]'
"""Every candidate sleeps a second in its build: trials overlap only if workers run in parallel."""


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpt_optuna.cli", *args]


def evaluated(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    retried = retried_numbers(trials)
    return [t for t in trials if has_own_result(t, retried)]


def assert_one_search(trials: list[FrozenTrial], n_trials: int) -> None:
    """Exactly ``n_trials`` results, the baseline once, no candidate evaluated twice."""
    done = evaluated(trials)
    assert len(done) == n_trials, [(t.number, t.state) for t in trials]
    assert sum(1 for t in done if t.user_attrs.get("baseline")) == 1
    own = [tuple(sorted(t.params.items())) for t in done if "reused_from" not in t.user_attrs]
    assert len(own) == len(set(own)), Counter(own).most_common(2)
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]


def overlapping(trials: list[FrozenTrial]) -> int:
    """Pairs of trials of different workers that ran at the same time."""
    spans = [(t.datetime_start, t.datetime_complete, t.user_attrs["worker"]) for t in evaluated(trials)]
    return sum(
        1 for i, (a0, a1, wa) in enumerate(spans) for b0, b1, wb in spans[i + 1 :] if wa != wb and a0 < b1 and b0 < a1
    )


@pytest.mark.slow
def test_workers_of_one_tuner_search_at_once_without_duplicates(cnn_path: Path, tmp_path: Path) -> None:
    config = synthetic_config(tmp_path, SLOW)
    args = ["--backend", SYNTHETIC, "--config", str(config), "--n-trials", "9", "--workers", "3", "--confirm-top", "0"]
    assert tune(str(cnn_path), *args) == 0
    study = optuna.load_study(study_name="cnn-syntheticbackend", storage="sqlite:///studies/cnn-syntheticbackend.db")
    trials = study.get_trials()
    assert_one_search(trials, 9)
    workers = Counter(t.user_attrs["worker"] for t in trials)
    assert len(workers) == 3 and all(w.startswith(f"{socket.gethostname()}:") for w in workers)
    assert {t.user_attrs["gpu"] for t in trials} == {"cpu"}
    assert overlapping(trials) >= 3  # the one-second builds ran at the same time, not one after the other
    # a resumed search with more workers than trials left ends at the target, not beyond it
    assert tune(str(cnn_path), *args[:-4], "--n-trials", "11", "--workers", "4", "--confirm-top", "0") == 0
    assert_one_search(study.get_trials(), 11)


def test_threads_asking_at_once_never_take_the_same_queued_trial(tmp_path: Path) -> None:
    storage = open_storage(f"sqlite:///{tmp_path / 'race.db'}")
    study = optuna.create_study(storage=storage, study_name="race")
    for value in range(40):
        study.enqueue_trial({"x": value})
    taken: list[int] = []

    def ask_five() -> None:
        own = optuna.load_study(study_name="race", storage=storage)
        for _ in range(5):
            trial = own.ask()
            taken.append(trial.number)
            trial.suggest_int("x", 0, 100)

    threads = [threading.Thread(target=ask_five) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(taken) == list(range(40))  # SQLite has no SELECT ... FOR UPDATE: BEGIN IMMEDIATE stands in


def lane(index: int, device: str, gpu: str | None = None) -> Lane:
    return Lane(index, Worker(Path("unused.log")), gpu, device)


def test_workers_on_different_gpu_models_are_refused_unless_allowed() -> None:
    same = [lane(0, "NVIDIA H200", "0"), lane(1, "NVIDIA H200", "1")]
    assert check_devices(same, "NVIDIA H200", allow_mixed=False) == []
    mixed = [lane(0, "NVIDIA H200", "0"), lane(1, "NVIDIA A100-SXM4-80GB", "1")]
    with pytest.raises(UserError, match="NVIDIA A100-SXM4-80GB, NVIDIA H200.*--allow-mixed-gpus"):
        check_devices(mixed, None, allow_mixed=False)
    with pytest.raises(UserError, match="the study was measured on NVIDIA H100"):
        check_devices(same, "NVIDIA H100 80GB HBM3", allow_mixed=False)
    assert check_devices(mixed, "NVIDIA H200", allow_mixed=True) == []
    crowded = check_devices([lane(0, "cpu"), lane(1, "cpu")], "cpu", allow_mixed=False)
    assert len(crowded) == 1 and "2 workers share the default device" in crowded[0]


def wait_for(condition, what: str, limit_s: float = 120, procs: tuple[subprocess.Popen, ...] = ()) -> None:  # noqa: ANN001
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        for proc in procs:
            assert proc.poll() is None, proc.communicate()
        try:
            if condition():
                return
        except (UserError, KeyError, ValueError):  # the study is not there yet
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def study_of(url: str, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=open_storage(url, create=False))


def joined_search(cnn_path: Path, tmp_path: Path, url: str, name: str, n_trials: int) -> None:
    """A tuner and a worker joining from another folder (no study folder of its own there: the data
    comes from the artifact store); the worker is killed with SIGKILL mid-trial, a second worker
    joins, and the study still ends with exactly its trials, the killed one's candidate retried."""
    config = synthetic_config(tmp_path, SLOW)
    tuner = subprocess.Popen(
        cli("tune", str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--n-trials", str(n_trials),
            "--storage", url, "--study-name", name, "--quiet", "--confirm-top", "0", "--sampler", "random"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    elsewhere = tmp_path / "other-host"
    elsewhere.mkdir()
    model = shutil.copy(cnn_path, elsewhere / "model-copy.onnx")
    wait_for(lambda: SPACE_ATTR in study_of(url, name).user_attrs, "the search to start", procs=(tuner,))
    join = cli("worker", "--storage", url, "--study-name", name, "--model", str(model), "--quiet")
    worker = subprocess.Popen(join, cwd=elsewhere, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def worker_running() -> bool:
        return any(
            t.state is TrialState.RUNNING and t.user_attrs.get("owner", "").endswith(f":{worker.pid}")
            for t in study_of(url, name).get_trials()
        )

    wait_for(worker_running, "the worker to run a trial", procs=(tuner, worker))
    time.sleep(0.3)  # well inside the trial's one-second build
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)
    second = subprocess.run(join, cwd=elsewhere, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    out, err = tuner.communicate(timeout=300)
    assert tuner.returncode == 0, err
    trials = study_of(url, name).get_trials()
    assert_one_search(trials, n_trials)
    killed = [
        t
        for t in trials
        if t.user_attrs.get("owner", "").endswith(f":{worker.pid}") and not has_own_result(t, retried_numbers(trials))
    ]
    assert len(killed) == 1 and killed[0].state is TrialState.FAIL
    retry = [t for t in trials if t.system_attrs.get("failed_trial") == killed[0].number]
    assert len(retry) == 1 and retry[0].params == killed[0].params and has_own_result(retry[0], set())
    owners = {t.user_attrs["owner"].rpartition(":")[2] for t in evaluated(trials)}
    assert str(tuner.pid) in owners and owners - {str(tuner.pid), str(worker.pid)}, owners  # the second worker too
    assert (elsewhere / "studies" / name / "inputs.npz").is_file()  # fetched from the artifact store


@pytest.mark.slow
def test_a_worker_joins_over_a_journal_file_and_a_killed_one_loses_nothing(cnn_path: Path, tmp_path: Path) -> None:
    joined_search(cnn_path, tmp_path, f"journal:{tmp_path / 'search.journal'}", "joined", 10)


def test_a_retry_is_queued_by_the_process_that_failed_the_trial_until_it_is_gone(tmp_path: Path) -> None:
    """A worker joining from another folder holds no other tuner's lock there (``alone``); it must
    not queue the retry of a trial another live process has just failed and is about to queue."""
    from gpt_optuna.study.recovery import recover_interrupted

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="s")
    trial = study.ask({"x": optuna.distributions.CategoricalDistribution(["a", "b"])})
    failer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "gpt_optuna"])
    try:
        trial.set_user_attr("owner", f"{socket.gethostname()}:{failer.pid}")
        trial.set_user_attr("interrupted_by", f"{socket.gethostname()}:{failer.pid}")
        trial.set_user_attr("interrupted", "the tuner was killed")
        study.tell(trial, state=TrialState.FAIL)
        assert recover_interrupted(study, alone=True) == []
        assert study.get_trials(states=(TrialState.WAITING,)) == []  # the failer queues it
    finally:
        failer.kill()
        failer.wait()
    recover_interrupted(study)  # the failer died before it queued the retry
    recover_interrupted(study, alone=True)
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert [(t.params, t.system_attrs["failed_trial"]) for t in waiting] == [(trial.params, trial.number)]


def test_a_worker_with_another_model_or_no_search_is_refused(
    cnn_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = synthetic_config(tmp_path, 'mode = ["ok"]')
    url = f"journal:{tmp_path / 'search.journal'}"
    base = ["--backend", SYNTHETIC, "--config", str(config), "--storage", url, "--study-name", "s"]
    assert tune(str(cnn_path), *base, "--n-trials", "2", "--confirm-top", "0") == 0
    other = save(matmul_model(), tmp_path / "other.onnx")
    capsys.readouterr()
    assert main(["worker", "--storage", url, "--study-name", "s", "--model", str(other), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is not the study's model" in err
    assert main(["worker", "--storage", url, "--study-name", "nothing", "--quiet"]) == 2
    assert "no study named 'nothing'; studies there: s" in capsys.readouterr().err
    cnn_path.rename(tmp_path / "moved.onnx")
    assert main(["worker", "--storage", url, "--study-name", "s", "--quiet"]) == 2
    assert "(the path the study recorded): give --model" in capsys.readouterr().err
    # the study already holds its two trials: a worker that joins has nothing to do
    assert (
        main(["worker", "--storage", url, "--study-name", "s", "--model", str(tmp_path / "moved.onnx"), "--quiet"]) == 0
    )
    assert len(evaluated(study_of(url, "s").get_trials())) == 2


POSTGRES = os.environ.get("GPT_OPTUNA_TEST_POSTGRES")


@pytest.mark.skipif(not POSTGRES, reason="no PostgreSQL server: .ci/run starts one and sets GPT_OPTUNA_TEST_POSTGRES")
def test_a_tuner_and_workers_share_a_study_on_postgresql(cnn_path: Path, tmp_path: Path) -> None:
    assert POSTGRES is not None
    joined_search(cnn_path, tmp_path, POSTGRES, f"pg-{uuid.uuid4().hex[:8]}", 10)


@pytest.mark.skipif(not POSTGRES, reason="no PostgreSQL server: .ci/run starts one and sets GPT_OPTUNA_TEST_POSTGRES")
@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_a_lost_hosts_trial_is_failed_by_the_heartbeat_and_its_candidate_retried(
    cnn_path: Path, tmp_path: Path
) -> None:
    import sqlalchemy

    assert POSTGRES is not None
    name = f"lost-{uuid.uuid4().hex[:8]}"
    config = synthetic_config(tmp_path, 'mode = ["ok"]')
    args = [str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--storage", POSTGRES, "--study-name", name]
    assert tune(*args, "--n-trials", "3", "--confirm-top", "0") == 0
    storage = open_storage(POSTGRES)
    study = optuna.load_study(study_name=name, storage=storage)
    earlier = study.get_trials()[1]
    lost = study.ask(fixed_distributions=earlier.distributions)  # a trial of a host that is gone
    lost.set_user_attr("owner", "a-host-that-is-gone:4242")
    storage.record_heartbeat(lost._trial_id)
    with storage.engine.begin() as connection:  # its last heartbeat, ten minutes ago
        connection.execute(
            sqlalchemy.text(
                "UPDATE trial_heartbeats SET heartbeat = heartbeat - interval '10 minutes' WHERE trial_id = :id"
            ),
            {"id": lost._trial_id},
        )
    assert tune(*args, "--n-trials", "5", "--confirm-top", "0") == 0
    trials = study.get_trials()
    assert trials[lost.number].state is TrialState.FAIL
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == lost.number]
    assert len(retries) == 1 and retries[0].params == lost.params and retries[0].state is TrialState.COMPLETE
    assert_one_search(trials, 5)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_workers_share_a_study_through_the_grpc_storage_proxy(cnn_path: Path, tmp_path: Path) -> None:
    pytest.importorskip("grpc")
    port = free_port()
    proxy = subprocess.Popen(
        cli("storage-proxy", "--storage", f"sqlite:///{tmp_path / 'served.db'}", "--port", str(port)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: proxy.stdout is not None and "serving" in proxy.stdout.readline(), "the proxy", procs=(proxy,))
        url = f"grpc://localhost:{port}"
        config = synthetic_config(tmp_path, SLOW)
        tuner = subprocess.Popen(
            cli("tune", str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--n-trials", "8",
                "--storage", url, "--study-name", "proxied", "--quiet", "--confirm-top", "0", "--workers", "2"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        wait_for(lambda: SPACE_ATTR in study_of(url, "proxied").user_attrs, "the search to start", procs=(tuner,))
        worker = subprocess.run(
            cli("worker", "--storage", url, "--study-name", "proxied", "--workers", "2", "--quiet"),
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert worker.returncode == 0, worker.stderr
        out, err = tuner.communicate(timeout=300)
        assert tuner.returncode == 0, err
        trials = study_of(url, "proxied").get_trials()
        assert_one_search(trials, 8)
        assert len({t.user_attrs["worker"] for t in evaluated(trials)}) >= 3
        assert "this host's workers evaluated" in worker.stdout
    finally:
        proxy.send_signal(signal.SIGINT)
        proxy.wait(timeout=30)


@pytest.mark.gpu
def test_one_worker_pinned_to_each_listed_gpu(cnn_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpt_optuna.protocol.process import gpu_names
    from gpt_optuna.search.lanes import pinned

    names = gpu_names()
    for index, name in enumerate(names):
        with Worker(Path(f"probe-{index}.log"), pinned(str(index))) as probe:
            assert probe.run(gpu_names, 120.0) == [name]  # the worker process sees its GPU alone
    assert tune(str(cnn_path), "--gpus", "all", "--n-trials", "6", "--confirm-top", "0") == 0
    trials = optuna.load_study(
        study_name="cnn-onnxruntime", storage="sqlite:///studies/cnn-onnxruntime.db"
    ).get_trials()
    assert_one_search(trials, 6)
    assert {t.user_attrs["gpu"] for t in trials} == {names[0]}
    assert len({t.user_attrs["worker"] for t in trials}) == min(len(names), 6)
    assert tune(str(cnn_path), "--gpus", str(len(names)), "--n-trials", "7") == 2
    assert f"no GPU {len(names)} here; this host has 0 {names[0]}" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_stops_every_worker_and_the_rerun_retries_their_candidates(cnn_path: Path, tmp_path: Path) -> None:
    config = synthetic_config(tmp_path, SLOW)
    url = f"journal:{tmp_path / 'search.journal'}"
    command = cli("tune", str(cnn_path), "--backend", SYNTHETIC, "--config", str(config), "--n-trials", "8",
                  "--workers", "3", "--storage", url, "--study-name", "s", "--quiet", "--confirm-top", "0")  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def three_running() -> bool:  # each in its one-second build (the baseline builds at once)
        trials = study_of(url, "s").get_trials()
        return sum(t.state is TrialState.RUNNING and t.params.get("build_ms") == 1000 for t in trials) == 3

    wait_for(three_running, "three trials running at once", procs=(proc,))
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "stopped by Ctrl-C" in err and "Traceback" not in err
    after = study_of(url, "s").get_trials()
    stopped = [t for t in after if t.user_attrs.get("interrupted") == "stopped by the user"]
    # every worker inside a trial stopped it (one may have been between trials on a slow machine)
    assert len(stopped) >= 2 and not [t for t in after if t.state is TrialState.RUNNING]
    assert sorted(t.params["delay_us"] for t in after if t.state is TrialState.WAITING) == sorted(
        t.params["delay_us"] for t in stopped
    )
    rerun = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    trials = study_of(url, "s").get_trials()
    assert_one_search(trials, 8)
    for trial in stopped:
        assert [t.params for t in trials if t.system_attrs.get("failed_trial") == trial.number] == [trial.params]


@pytest.mark.skipif(bool(gpu_names()), reason="this host has a GPU")
def test_gpus_without_a_gpu_is_one_line(cnn_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tune(str(cnn_path), "--gpus", "0", "--n-trials", "2") == 2
    assert "--gpus: no GPU is visible here" in capsys.readouterr().err


def test_a_worker_stops_when_the_search_it_joined_ends(cnn_path: Path, tmp_path: Path) -> None:
    from gpt_optuna.usecases.join import search_deadline

    now = time.monotonic()
    assert search_deadline(None, None) is None
    assert search_deadline(time.time() + 60, now + 10) == now + 10
    assert abs(search_deadline(time.time() + 5, None) - (now + 5)) < 1  # type: ignore[operator]
    config = synthetic_config(tmp_path, 'mode = ["ok"]')
    url = f"journal:{tmp_path / 'search.journal'}"
    args = ["--backend", SYNTHETIC, "--config", str(config), "--storage", url, "--study-name", "s"]
    # a busy host may spend the three seconds before a trial completes (exit 3: nothing feasible in time)
    assert tune(str(cnn_path), *args, "--timeout", "3s", "--confirm-top", "0") in (0, EXIT_NO_FEASIBLE)
    done = len(study_of(url, "s").get_trials())
    assert main(["worker", "--storage", url, "--study-name", "s", "--quiet"]) == 0  # its time is over
    assert len(study_of(url, "s").get_trials()) == done
