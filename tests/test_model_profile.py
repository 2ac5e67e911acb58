"""A model's profile (compute operators, parameters) and how alike two models are, on ONNX files
built here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import matmul_model, save
from onnx import TensorProto, helper, numpy_helper

from gpt_optuna.graph.model_profile import GROUPED_CONV, ModelProfile, profile_of, similarity
from gpt_optuna.testing.small_cnn import small_cnn


def conv_net(channels: int, depthwise: bool = False, reshaped: bool = False) -> onnx.ModelProto:
    """Conv -> Relu -> Conv (grouped where ``depthwise``), ``channels`` wide; a Reshape and an
    Identity around it where ``reshaped`` (the same work, exported another way)."""
    rng = np.random.default_rng(0)
    first = numpy_helper.from_array(rng.standard_normal((channels, 3, 3, 3)).astype(np.float32), "w1")
    group = channels if depthwise else 1
    second = numpy_helper.from_array(rng.standard_normal((channels, channels // group, 3, 3)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["y" if not reshaped else "c2"], pads=[1, 1, 1, 1], group=group),
    ]
    initializers = [first, second]
    if reshaped:
        initializers.append(numpy_helper.from_array(np.array([1, channels, 8, 8], np.int64), "shape"))
        nodes += [helper.make_node("Reshape", ["c2", "shape"], ["s"]), helper.make_node("Identity", ["s"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, 8, 8])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_profile_counts_compute_operators_and_parameters(tmp_path: Path) -> None:
    profile = profile_of(save(conv_net(4), tmp_path / "conv.onnx"))
    assert profile == ModelProfile({"Conv": 2, "Relu": 1}, 4 * 3 * 9 + 4 * 4 * 9)
    # the same work exported with a reshape and an identity: the same operators (the shape is 4 parameters)
    reshaped = profile_of(save(conv_net(4, reshaped=True), tmp_path / "reshaped.onnx"))
    assert reshaped.ops == profile.ops and reshaped.parameters == profile.parameters + 4
    depthwise = profile_of(save(conv_net(4, depthwise=True), tmp_path / "depthwise.onnx"))
    assert depthwise.ops == {"Conv": 1, GROUPED_CONV: 1, "Relu": 1}
    assert ModelProfile.from_record(profile.to_record()) == profile and ModelProfile.from_record(None) is None


def test_operators_inside_subgraphs_count() -> None:
    branch = helper.make_graph(
        [helper.make_node("Sigmoid", ["x"], ["y"])], "branch", [], [helper.make_tensor_value_info("y", 1, [2])]
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)],
        "g",
        [helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_tensor_value_info("x", 1, [2])],
        [helper.make_tensor_value_info("y", 1, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = Path("if.onnx")
    onnx.save(model, path)
    assert profile_of(path).ops == {"If": 1, "Sigmoid": 2}


def test_similarity_ranks_a_model_of_the_same_kind_above_one_of_another(tmp_path: Path) -> None:
    cnn = profile_of(save(small_cnn(), tmp_path / "cnn.onnx"))
    wider_cnn = profile_of(save(conv_net(16), tmp_path / "wide.onnx"))
    narrow_cnn = profile_of(save(conv_net(4), tmp_path / "narrow.onnx"))
    mlp = profile_of(save(matmul_model(), tmp_path / "mlp.onnx"))
    assert similarity(cnn, cnn) == pytest.approx(1.0)
    assert similarity(narrow_cnn, wider_cnn) == similarity(wider_cnn, narrow_cnn)
    assert similarity(narrow_cnn, wider_cnn) > similarity(narrow_cnn, mlp)
    assert similarity(cnn, mlp) < 0.5
    assert 0.0 <= similarity(cnn, mlp) <= 1.0


def test_size_counts_by_its_fourth_root() -> None:
    small, large = ModelProfile({"Conv": 5, "Relu": 5}, 1_000), ModelProfile({"Conv": 5, "Relu": 5}, 16_000)
    assert similarity(small, large) == pytest.approx(0.5)  # the same mix, 16x the parameters
    unlike = ModelProfile({"MatMul": 1}, 1_000)
    assert similarity(small, unlike) == 0.0  # no operator in common
    assert similarity(ModelProfile({}, 0), ModelProfile({}, 0)) == 1.0
