"""The sampler a search uses, by name."""

from __future__ import annotations

import warnings

import optuna

from gpt_optuna.core.errors import MissingDependencyError
from gpt_optuna.core.space import Space
from gpt_optuna.graph.transforms import is_transform_knob
from gpt_optuna.search.sampling import FreshSampler


def make_sampler(name: str, seed: int | None, space: Space) -> optuna.samplers.BaseSampler:
    """TPE (multivariate, few start-up trials) by default; it handles several objectives too.

    Whichever it is, it proposes only candidates the study does not hold yet (:class:`FreshSampler`).
    """
    return FreshSampler(_base_sampler(name, seed), space, is_transform_knob, seed)


def check_sampler(name: str) -> None:
    """A MissingDependencyError where the sampler needs a library that is not installed (GPSampler
    fits with PyTorch and SciPy), found without importing it."""
    import importlib.util

    if name == "gp":
        for module, library in (("torch", "PyTorch"), ("scipy", "SciPy")):
            if importlib.util.find_spec(module) is None:
                raise MissingDependencyError(f"{library} (needed by the GP sampler)", "gp")


def _base_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        check_sampler(name)
        return optuna.samplers.GPSampler(seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # constant liar: a running trial counts as a bad result, so parallel workers spread out
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=5, constant_liar=True)
