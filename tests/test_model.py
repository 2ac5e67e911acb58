from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import save, token_model
from onnx import TensorProto, helper

from gpt_optuna.core.errors import UserError
from gpt_optuna.graph import feeds as mf
from gpt_optuna.graph import model as m
from gpt_optuna.graph.model_cache import with_distinct_dims
from gpt_optuna.worker.reference import fp32_outputs


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


def test_dynamic_dimension_without_shape_asks_for_it_plainly(mlp_path: Path) -> None:
    info = m.load_model_info(mlp_path)
    with pytest.raises(
        UserError, match=r"input 'x' has dynamic dimensions 'batch' \(axis 0\).* --shape x:<batch>x16 with each <"
    ):
        m.resolve_shapes(info, {})
    assert m.resolve_shapes(info, m.parse_shapes(["x:4x16"])) == {"x": m.ShapeRange.fixed((4, 16))}
    ranged = m.resolve_shapes(info, m.parse_shapes(["x:1x16/4x16/8x16"]))
    assert ranged["x"] == m.ShapeRange((1, 16), (4, 16), (8, 16))
    assert mf.synthetic_feeds(info, ranged)["x"].shape == (4, 16)


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
    assert mf.load_feeds(good, info, {})["x"].shape == (3, 16)
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
            mf.load_feeds(path, info, {})
    with pytest.raises(UserError, match="but --shape says 5x16"):
        mf.load_feeds(good, info, {"x": m.ShapeRange.fixed((5, 16))})
    (tmp_path / "bad.npz").write_text("not a zip")
    with pytest.raises(UserError, match="bad.npz is not an .npz archive"):
        mf.load_feeds(tmp_path / "bad.npz", info, {})


def test_synthetic_feeds_are_deterministic_and_valid_for_index_inputs(tmp_path: Path) -> None:
    info = m.load_model_info(save(token_model(), tmp_path / "tok.onnx"))
    shapes = m.resolve_shapes(info, {})
    feeds = mf.synthetic_feeds(info, shapes)
    assert feeds["ids"].dtype == np.int64 and set(np.unique(feeds["ids"])) <= {0, 1}
    np.testing.assert_array_equal(feeds["ids"], mf.synthetic_feeds(info, shapes)["ids"])
    out = fp32_outputs(info, [feeds])[0]
    assert out["out"].shape == (1, 5, 6)


def test_npz_round_trip_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b.npz"
    mf.save_npz(path, {"x": np.arange(3)})
    assert not list(path.parent.glob("*.tmp"))
    np.testing.assert_array_equal(mf.read_npz(path)["x"], np.arange(3))
    assert mf.feeds_sha256({"x": np.arange(3)}) != mf.feeds_sha256({"x": np.arange(4)})


def paddle_style_model() -> onnx.ModelProto:
    """Input [-1, 3, ?, ?] as PaddlePaddle exports it (H and W share the name ``?``), and a second
    input that shares a named dimension with nothing."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 3, "?", "?"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [-1, 3, "?", "?"])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "paddle_style", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 7
    return model


def test_unnamed_and_repeated_dimensions_get_names_of_their_own(tmp_path: Path) -> None:
    path = save(paddle_style_model(), tmp_path / "cls.onnx")
    info = with_distinct_dims(m.load_model_info(path), tmp_path / "models")
    assert info.path.parent == tmp_path / "models"
    assert info.inputs[0].shape == ("x_dim0", 3, "x_dim2", "x_dim3")
    with pytest.raises(UserError) as asked:
        m.resolve_shapes(info, {})
    assert "--shape x:<x_dim0>x3x<x_dim2>x<x_dim3>" in str(asked.value) and "x1" not in str(asked.value)
    shapes = m.resolve_shapes(info, m.parse_shapes(["x:8x3x48x192"]))  # H and W may differ now
    assert shapes["x"].opt == (8, 3, 48, 192)
    again = with_distinct_dims(m.load_model_info(path), tmp_path / "models")
    assert again.path == info.path and again.sha256 == info.sha256
    info.path.write_bytes(info.path.read_bytes()[:-7])  # a damaged copy is made again, never used
    remade = with_distinct_dims(m.load_model_info(path), tmp_path / "models")
    assert remade.path == info.path and remade.sha256 == info.sha256
    named = save(token_model(), tmp_path / "tokens.onnx")  # static: nothing to rename, no copy
    assert with_distinct_dims(m.load_model_info(named), tmp_path / "models").path == named


def test_a_dimension_named_by_a_given_input_sizes_the_others(minimal_pair: Path) -> None:
    info = m.load_model_info(minimal_pair)
    shapes = m.resolve_shapes(info, m.parse_shapes(["ids:2x8/4x16/8x32"]))
    assert shapes["mask"] == m.ShapeRange((2, 8), (4, 16), (8, 32))
    with pytest.raises(UserError, match=r"--shape ids:<batch>x<sequence>"):
        m.resolve_shapes(info, {})


@pytest.fixture
def minimal_pair(tmp_path: Path) -> Path:
    """Two int64 inputs [batch, sequence] sharing both dimension names, as a torch encoder has."""
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"])
    mask = helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "sequence"])
    out = helper.make_tensor_value_info("out", TensorProto.INT64, ["batch", "sequence"])
    graph = helper.make_graph([helper.make_node("Mul", ["ids", "mask"], ["out"])], "pair", [ids, mask], [out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return save(model, tmp_path / "pair.onnx")
