from pathlib import Path

import pytest

from gpt_optuna.core.errors import UserError
from gpt_optuna.search.config import TuneConfig, read_toml
from gpt_optuna.search.options import parse_duration


@pytest.mark.parametrize(
    "text, seconds", [("8h", 28800), ("30m", 1800), ("1h30m", 5400), ("90s", 90), ("90", 90), ("1.5h", 5400), (12, 12)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "8 hours", "-5", "0"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(UserError):
        parse_duration(text)


def test_defaults_name_the_study_after_model_and_backend() -> None:
    config = TuneConfig(model=Path("models/resnet.onnx"))
    assert config.study_name == "resnet-onnxruntime"
    assert config.storage == "sqlite:///studies/resnet-onnxruntime.db"
    assert config.n_trials == 100
    assert TuneConfig(model=Path("m.onnx"), timeout_s=60).n_trials is None


def test_a_config_is_filled_in_once_and_a_replace_fills_it_in_again() -> None:
    import dataclasses

    config = TuneConfig(model=Path("m.onnx"), objectives="error, latency")
    assert config.objectives == ("latency", "error")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.n_trials = 3  # type: ignore[misc]
    renamed = dataclasses.replace(config, study_name="other", storage=None)
    assert renamed.storage == "sqlite:///studies/other.db" and config.storage == "sqlite:///studies/m-onnxruntime.db"


@pytest.mark.parametrize(
    "model, name",
    [
        ("models/modèle vidéo (v2).onnx", "modele_video_v2-onnxruntime"),
        ("models/.hidden model.onnx", "hidden_model-onnxruntime"),
        ("models/日本語.onnx", "model-791be523-onnxruntime"),
        ("exports/Größe/model.onnx", "Groe-model-onnxruntime"),
        ("models/" + "x" * 300 + ".onnx", "x" * 188 + "-onnxruntime"),
    ],
)
def test_any_model_file_name_gives_a_valid_study_name(model: str, name: str) -> None:
    assert TuneConfig(model=Path(model)).study_name == name


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"backend": "tensorflow"}, "unknown backend"),
        ({"sampler": "cmaes"}, "unknown sampler"),
        ({"n_trials": 0}, "at least 1"),
        ({"study_name": "a/b"}, "study name"),
        ({"accuracy": "cosine>>1"}, "malformed"),
    ],
)
def test_invalid_configs(kwargs: dict, message: str) -> None:
    with pytest.raises(UserError, match=message):
        TuneConfig(model=Path("m.onnx"), **kwargs)


def test_toml_maps_onto_config(tmp_path: Path) -> None:
    path = tmp_path / "tune.toml"
    path.write_text(
        'model = "m.onnx"\naccuracy = "max_abs<=1e-3"\nshape = "x:1x16"\ntimeout = "2h"\ntrial-timeout = 30\n'
        "n_trials = 7\n[measure]\nbudget_s = 0.5\n"
        '[space]\nprovider = "CPUExecutionProvider"\nintra_op_num_threads = [1, 2]\n'
    )
    config = TuneConfig(**read_toml(path))
    assert config.model == tmp_path / "m.onnx"
    assert config.shapes == ["x:1x16"]
    assert config.timeout_s == 7200 and config.trial_timeout_s == 30 and config.n_trials == 7
    assert config.measure.budget_s == 0.5
    assert config.space == {"provider": "CPUExecutionProvider", "intra_op_num_threads": [1, 2]}


@pytest.mark.parametrize(
    "body, message",
    [
        ("bogus = 1", "unknown key 'bogus'"),
        ("[measure]\nfoo = 1", "unknown \\[measure\\] key"),
        ("x = = 1", "not valid TOML"),
    ],
)
def test_bad_toml(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "t.toml"
    path.write_text(body)
    with pytest.raises(UserError, match=message):
        read_toml(path)
