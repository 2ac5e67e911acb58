from pathlib import Path

import numpy as np
import pytest
from conftest import save, token_model

from gpt_optuna import model as m
from gpt_optuna.errors import UserError


def test_load_reports_inputs_outputs_and_hash(mlp_path: Path) -> None:
    info = m.load_model_info(mlp_path)
    assert [s.name for s in info.inputs] == ["x"]  # initializers are not inputs
    assert info.inputs[0].shape == ("batch", 16)
    assert info.outputs[0].name == "probs"
    assert info.sha256 == m.file_sha256(mlp_path) and len(info.sha256) == 64
    assert info.opset == 17


def test_missing_and_corrupt_files_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not found"):
        m.load_model_info(tmp_path / "nope.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00\x01garbage" * 10)
    with pytest.raises(UserError, match="not a valid ONNX model|fails the ONNX checker"):
        m.load_model_info(junk)


def test_dynamic_dimension_without_shape_names_the_flag(mlp_path: Path) -> None:
    info = m.load_model_info(mlp_path)
    with pytest.raises(
        UserError, match=r"input 'x' has a dynamic dimension 'batch' \(axis 0\); give its shape with --shape x:1x16"
    ):
        m.resolve_shapes(info, {})
    assert m.resolve_shapes(info, m.parse_shapes(["x:4x16"])) == {"x": m.ShapeRange.fixed((4, 16))}
    ranged = m.resolve_shapes(info, m.parse_shapes(["x:1x16/4x16/8x16"]))
    assert ranged["x"] == m.ShapeRange((1, 16), (4, 16), (8, 16))
    assert m.synthetic_feeds(info, ranged)["x"].shape == (4, 16)


@pytest.mark.parametrize(
    "flag, message",
    [
        ("x:4x17", "size 17 on axis 1"),
        ("x:4", "rank 1"),
        ("y:4x16", "not a model input"),
        ("x=4x16", "malformed --shape"),
        ("x:1x16/4x16", "malformed --shape"),
        ("x:8x16/4x16/16x16", "MIN <= OPT <= MAX"),
        ("x:1x16/4x16/8x17", "size 17 on axis 1"),
    ],
)
def test_bad_shapes(mlp_path: Path, flag: str, message: str) -> None:
    info = m.load_model_info(mlp_path)
    with pytest.raises(UserError, match=message):
        m.resolve_shapes(info, m.parse_shapes([flag]))


def test_npz_is_checked_against_the_model(mlp_path: Path, tmp_path: Path) -> None:
    info = m.load_model_info(mlp_path)
    good = tmp_path / "good.npz"
    np.savez(good, x=np.ones((3, 16), np.float32))
    assert m.load_feeds(good, info, {})["x"].shape == (3, 16)
    cases = {
        "missing": ({"z": np.ones((3, 16), np.float32)}, "lacks model input 'x'"),
        "extra": ({"x": np.ones((3, 16), np.float32), "z": np.ones(1)}, "'z', which is not a model input"),
        "dtype": ({"x": np.ones((3, 16), np.float64)}, "input 'x' is float64"),
        "shape": ({"x": np.ones((3, 15), np.float32)}, "size 15 on axis 1"),
    }
    for name, (arrays, message) in cases.items():
        path = tmp_path / f"{name}.npz"
        np.savez(path, **arrays)
        with pytest.raises(UserError, match=message):
            m.load_feeds(path, info, {})
    with pytest.raises(UserError, match="but --shape says 5x16"):
        m.load_feeds(good, info, {"x": m.ShapeRange.fixed((5, 16))})
    (tmp_path / "bad.npz").write_text("not a zip")
    with pytest.raises(UserError, match="not a readable .npz"):
        m.load_feeds(tmp_path / "bad.npz", info, {})


def test_synthetic_feeds_are_deterministic_and_valid_for_index_inputs(tmp_path: Path) -> None:
    info = m.load_model_info(save(token_model(), tmp_path / "tok.onnx"))
    shapes = m.resolve_shapes(info, {})
    feeds = m.synthetic_feeds(info, shapes)
    assert feeds["ids"].dtype == np.int64 and set(np.unique(feeds["ids"])) <= {0, 1}
    np.testing.assert_array_equal(feeds["ids"], m.synthetic_feeds(info, shapes)["ids"])
    out = m.reference_outputs(info, feeds)
    assert out["out"].shape == (1, 5, 6)


def test_npz_round_trip_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b.npz"
    m.save_npz(path, {"x": np.arange(3)})
    assert not list(path.parent.glob("*.tmp"))
    np.testing.assert_array_equal(m.read_npz(path)["x"], np.arange(3))
    assert m.feeds_sha256({"x": np.arange(3)}) != m.feeds_sha256({"x": np.arange(4)})
