"""What the verdict says for each strength of evidence, in the words of the study's device: real
studies (in memory) holding a confirmation made from rounds of known speedups."""

from __future__ import annotations

import numpy as np
import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import create_trial

from gpt_optuna.cli import main
from gpt_optuna.results.summary_text import format_summary, headline
from gpt_optuna.study.confirmation import summarize_rounds
from gpt_optuna.study.record import CONFIRMED_ATTR, HOST_ATTR, SPACE_ATTR
from gpt_optuna.study.summary import summarize_study
from gpt_optuna.usecases.host_check import HostCheck, gpu_clock_lines
from gpt_optuna.usecases.tune import advise


def study_confirmed(
    ratios: list[float], device: str = "cpu", threads: int = 0, storage: str | None = None
) -> optuna.Study:
    """A baseline (trial 0, 2 ms) and one candidate (trial 1: ``threads`` intra-op threads), the
    candidate re-measured in one process per ratio, each process sure of its own ratio."""
    rng = np.random.default_rng(0)
    rounds = np.array([[2.0, 2.0 / r] for r in ratios for _ in range(10)]) * (
        1 + 0.001 * rng.random((10 * len(ratios), 2))
    )
    return study_of_rounds(rounds, np.repeat(np.arange(len(ratios)), 10), device, threads, storage)


def study_of_rounds(
    rounds: np.ndarray, processes: np.ndarray, device: str = "cpu", threads: int = 0, storage: str | None = None
) -> optuna.Study:
    """The study of :func:`study_confirmed` (in ``storage``, else in memory), its confirmation made
    of ``rounds`` (baseline, candidate) timed in ``processes``."""
    study = optuna.create_study(storage=storage, study_name="words" if storage else None)
    choices = CategoricalDistribution([0, 1, 2])
    for number, ms in enumerate((2.0, 1.0)):
        study.add_trial(
            create_trial(
                params={"intra_op_num_threads": threads if number else 0},
                distributions={"intra_op_num_threads": choices},
                value=ms,
                user_attrs={"latency": {"median_ms": ms, "stable": True}, "gpu": device, "baseline": number == 0},
            )
        )
    why = "a thread count fits the cores of the host it was measured on"
    knob = {"name": "intra_op_num_threads", "choices": [0, 1, 2], "default": 0, "host_sensitive": why}
    study.set_user_attr(SPACE_ATTR, [knob])
    study.set_user_attr(CONFIRMED_ATTR, summarize_rounds([0, 1], rounds, processes))
    return study


@pytest.mark.parametrize(
    ("ratios", "verdict", "words"),
    [
        ([2.0, 2.01, 1.99], "faster", "verdict: faster: trial 1 is 2.000x the baseline [95% CI 1.9"),
        ([1.2, 2.4, 2.6], "inconclusive", "its speedup differed between the 3 processes (1.20x to 2.60x"),
        ([1.0, 1.002, 0.998], "not_significant", "an interval that includes 1.0 and no gain over 10%"),
        ([0.5, 0.501, 0.499], "baseline", "verdict: keep the default configuration: the baseline was faster"),
        ([2.0], "indicative", "verdict: indicative: trial 1 measured 2.00"),
    ],
)
def test_the_verdict_follows_the_evidence(ratios: list[float], verdict: str, words: str) -> None:
    summary = summarize_study(study_confirmed(ratios))
    assert summary.verdict == verdict
    assert words in headline(summary)
    assert summary.keeps_default == (verdict in ("inconclusive", "not_significant", "baseline"))
    assert summary.decided is (summary.baseline if summary.keeps_default else summary.best)


def test_two_agreeing_processes_are_too_few_and_the_headline_says_so_not_that_the_host_was_unsteady() -> None:
    text = headline(summarize_study(study_confirmed([1.02, 1.06])))
    assert text.startswith("verdict: inconclusive: ") and "2 processes are too few to tell" in text
    assert "unstable" not in text and "quiet host" not in text


def test_noise_between_rounds_is_named_as_such_and_more_rounds_advised() -> None:
    """Three processes that agree (each saw the same rounds, in another order) whose rounds scatter
    widely: the interval is wide because of the rounds, not the processes."""
    ratios = np.exp(np.random.default_rng(3).normal(0.25, 0.5, 10))
    rounds = np.array([[2.0, 2.0 / r] for p in range(3) for r in np.roll(ratios, p)])
    summary = summarize_study(study_of_rounds(rounds, np.repeat(np.arange(3), 10)))
    assert summary.verdict == "inconclusive"
    text = headline(summary)
    assert "varied from round to round within each process" in text and "too few rounds to decide" in text
    assert "confirm --rounds 40" in text and "--processes" not in text and "unstable" not in text
    advice = advise(summary)
    assert (advice.remeasure_rounds, advice.remeasure_processes) == (40, None)


def test_processes_that_disagree_beyond_their_rounds_name_the_host_and_advise_more_processes() -> None:
    summary = summarize_study(study_confirmed([1.2, 2.4, 2.6]))
    text = headline(summary)
    assert "differed between the 3 processes (1.20x to 2.60x, +-" in text and "more than the noise of their" in text
    assert "confirm --processes 6) on a quiet host" in text and "--rounds" not in text
    advice = advise(summary)
    assert (advice.remeasure_rounds, advice.remeasure_processes) == (None, 6)


def test_a_confirmation_recorded_before_its_noise_was_kept_still_reads() -> None:
    study = study_confirmed([1.2, 2.4, 2.6])
    stored = study.user_attrs[CONFIRMED_ATTR]
    for row in (stored["baseline"], *stored["ranking"]):
        del row["process_sd"], row["round_sd"]
    study.set_user_attr(CONFIRMED_ATTR, stored)
    summary = summarize_study(study)
    assert "its speedup differed between the 3 processes (1.20x to 2.60x): the host was too unstable" in headline(
        summary
    )
    assert advise(summary).remeasure_processes == 6


def test_a_cpu_study_speaks_of_cores_and_a_gpu_study_of_launches() -> None:
    cpu = format_summary(summarize_study(study_confirmed([1.5, 2.0, 1.8])))
    gpu = format_summary(summarize_study(study_confirmed([1.5, 2.0, 1.8], device="NVIDIA H200")))
    assert "a process runs as fast as the cores it gets" in cpu and "launch" not in cpu and "GPU" not in cpu
    assert "CPU-side launch work runs as fast as its process's CPU" in gpu
    assert "nvidia-smi --lock-gpu-clocks" in headline(summarize_study(study_confirmed([1.0, 3.0], "NVIDIA H200")))


def test_settings_tuned_for_this_host_and_a_busy_host_are_named() -> None:
    study = study_confirmed([2.0, 2.01, 1.99], threads=1)
    busy = HostCheck(cores=2, busy_cores=1.6, load=1.9, gpu_processes=("4242 trainer (30000 MiB)",))
    study.set_user_attr(HOST_ATTR, busy.to_record())
    text = format_summary(summarize_study(study))
    assert "tuned for this host: intra_op_num_threads=1 (a thread count fits the cores" in text
    assert "warning: the host was busy before the search: other work used 1.6 of its 2 cores" in text
    assert "warning: other processes use the GPU (4242 trainer (30000 MiB))" in text
    quiet = HostCheck(cores=16, busy_cores=0.2, load=0.3, gpu_processes=(), gpu_clocks=("0: 1980/1980 MHz",))
    assert quiet.warnings == [] and quiet.to_record()["warnings"] == []


def test_best_shows_the_host_warnings_status_shows(capsys: pytest.CaptureFixture[str]) -> None:
    study = study_confirmed([2.0, 2.01, 1.99], threads=1, storage="sqlite:///words.db")
    study.set_user_attr(HOST_ATTR, HostCheck(cores=2, busy_cores=1.6, load=1.9, gpu_processes=()).to_record())
    capsys.readouterr()
    assert main(["best", "--storage", "sqlite:///words.db", "--study-name", "words"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("verdict: faster: trial 1")
    assert "warning: the host was busy before the search: other work used 1.6 of its 2 cores" in out
    assert "tuned for this host: intra_op_num_threads=1" in out


def test_a_gpu_slowing_its_clocks_is_named() -> None:
    rows = [["0", "1980", "1980", *["Not Active"] * 3], ["1", "1185", "1980", "Not Active", "Active", "Not Active"]]
    clocks = gpu_clock_lines([*rows, ["an", "unexpected", "row"]])
    assert clocks == ["0: 1980/1980 MHz", "1: 1185/1980 MHz, sw thermal slowdown"]
    (warning,) = HostCheck(cores=16, busy_cores=0.0, load=0.1, gpu_processes=(), gpu_clocks=tuple(clocks)).warnings
    assert warning.startswith("a GPU was slowing its clocks (1: 1185/1980 MHz, sw thermal slowdown)")
