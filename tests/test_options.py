"""The tune options table agrees with TuneConfig; a flag and its TOML key set the same value, the flag winning."""

from __future__ import annotations

import inspect
import re
from dataclasses import fields
from pathlib import Path

import pytest

from gpt_optuna.cli.commands import build_parser
from gpt_optuna.cli.parser import tune_config
from gpt_optuna.search.config import TuneConfig
from gpt_optuna.search.options import OPTIONS

NOT_OPTIONS = {"measure", "space", "seeds", "folder", "baseline_values", "engines_chosen"}
"""TuneConfig fields no flag sets: the TOML tables [measure] and [space], and what the search fills in."""


def config(*argv: str) -> TuneConfig:
    return tune_config(build_parser().parse_args(["tune", *argv]))


def test_the_table_names_every_option_field_once_and_tune_takes_its_flags() -> None:
    filled = [option.field for option in OPTIONS if option.field]
    assert len(filled) == len(set(filled))
    assert set(filled) == {f.name for f in fields(TuneConfig)} - NOT_OPTIONS
    every_command = {"command", "verbose", "quiet", "log_file"}  # -v, -q, --log-file: what a command says
    assert set(vars(build_parser().parse_args(["tune"]))) == {option.dest for option in OPTIONS} | every_command


@pytest.mark.parametrize(
    "flags, toml",
    [
        (["--backend", "tensorrt"], 'backend = "tensorrt"'),
        (["--samples", "3"], "samples = 3"),
        (["--trial-timeout", "90s"], 'trial-timeout = "90s"'),
        (["--no-seeds"], "no_seeds = true"),
        (["--shape", "x:1x2", "--shape", "y:3"], 'shapes = ["x:1x2", "y:3"]'),
        (["--objectives", "latency,error"], 'objectives = ["latency", "error"]'),
        (["--inputs", "/data/x.npz"], 'inputs = "/data/x.npz"'),
        (["--artifacts", "/data/art"], 'artifacts = "/data/art"'),
    ],
)
def test_a_flag_and_its_toml_key_give_the_same_config(tmp_path: Path, flags: list[str], toml: str) -> None:
    (tmp_path / "tune.toml").write_text(toml)
    from_toml = config("/m.onnx", "--config", str(tmp_path / "tune.toml"))
    assert config("/m.onnx", *flags) == from_toml != config("/m.onnx")


def test_a_flag_overrides_the_toml_value_and_an_absent_flag_keeps_it(tmp_path: Path) -> None:
    (tmp_path / "tune.toml").write_text('model = "m.onnx"\nn_trials = 7\ntimeout = "1h"\ndry_run = true\n')
    toml = config("--config", str(tmp_path / "tune.toml"))
    assert (toml.model, toml.n_trials, toml.timeout_s, toml.dry_run) == (tmp_path / "m.onnx", 7, 3600, True)
    both = config("/other.onnx", "--config", str(tmp_path / "tune.toml"), "--n-trials", "3", "--timeout", "90")
    assert (both.model, both.n_trials, both.timeout_s, both.dry_run) == (Path("/other.onnx"), 3, 90, True)


def api_values(**keywords: object) -> TuneConfig:
    """The TuneConfig ``gpt_optuna.tune`` makes of ``keywords`` (the others left out)."""
    from gpt_optuna.api.tuning import config_values, tune

    given = {name: parameter.default for name, parameter in inspect.signature(tune).parameters.items()}
    return TuneConfig(**config_values(given | {"model": "/m.onnx"} | keywords))


def test_the_apis_keywords_are_the_tune_options_and_its_page_names_each() -> None:
    from gpt_optuna.api.tuning import TABLES, keyword_of, tune

    keywords = set(inspect.signature(tune).parameters)
    assert keywords == {keyword_of(option) for option in OPTIONS} | set(TABLES) | {"progress"}
    page = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    table = page[page.index("| keyword | flag | takes |") : page.index("- **Isolation.**")]
    assert keywords - {"model"} == set(re.findall(r"`(\w+)`", table.split("\n| ", 1)[1])) & keywords


@pytest.mark.parametrize(
    "flags, keywords",
    [
        (["--backend", "tensorrt"], {"backend": "tensorrt"}),
        (["--trial-timeout", "90s"], {"trial_timeout": "90s"}),
        (["--timeout", "90"], {"timeout": 90}),
        (["--no-seeds"], {"no_seeds": True}),
        (["--shape", "x:1x2", "--shape", "y:3"], {"shapes": {"x": "1x2", "y": "3"}}),
        (["--objectives", "latency,error"], {"objectives": ["latency", "error"]}),
        (["--inputs", "/data/x.npz"], {"inputs": "/data/x.npz"}),
        (["--baseline-config", "/data/yours.toml"], {"baseline_config": "/data/yours.toml"}),
        (["--storage", "sqlite:////data/s.db"], {"storage": "/data/s.db"}),
    ],
)
def test_a_keyword_gives_the_config_its_flag_gives(flags: list[str], keywords: dict[str, object]) -> None:
    assert api_values(**keywords) == config("/m.onnx", *flags) != config("/m.onnx")
