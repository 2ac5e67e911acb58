"""The package's layering, as docs/architecture.md states it: one folder per layer, imports only
from the same layer or one above it in the page's table, no import cycles, and the page's list of
modules is the tree."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpt_optuna"
PAGE = ROOT / "docs" / "architecture.md"
OUTSIDE_LAYERS = {"gpt_optuna", "gpt_optuna.backends"}
"""The public API and the engine registry: package entry points that gather from several layers."""


def section(name: str) -> str:
    """The page's text between ``<!-- name -->`` and ``<!-- /name -->``."""
    text = PAGE.read_text()
    return text[text.index(f"<!-- {name} -->") : text.index(f"<!-- /{name} -->")]


def layer_order() -> list[str]:
    """The layers in the page's table, first (lowest) to last."""
    return re.findall(r"^\| (\w+) \| \[`gpt_optuna/(\w+)/`\]", section("layers"), re.M)


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def imports(path: Path) -> set[str]:
    """The gpt_optuna modules ``path`` imports anywhere (in functions and TYPE_CHECKING blocks too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpt_optuna"):
            for alias in node.names:  # ``from gpt_optuna.graph import model`` imports the module
                as_module = f"{node.module}.{alias.name}"
                found.add(as_module if as_module in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gpt_optuna"))
    return found


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def layer_of(module: str) -> str | None:
    """The module's layer (its folder); None outside the layers."""
    parts = module.split(".")
    outside = module in OUTSIDE_LAYERS or parts[1] in ("testing", "data")
    return None if outside or len(parts) < 3 else parts[1]


def test_the_page_names_each_folder_as_a_layer_once() -> None:
    order = [folder for folder, _ in layer_order()]
    assert order == [folder for _, folder in layer_order()]
    assert len(order) == len(set(order)) >= 8
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert folders - {"testing", "data"} == set(order)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer_of(m) is not None))
def test_a_module_imports_only_from_its_layer_and_the_layers_above_it(module: str) -> None:
    order = [folder for folder, _ in layer_order()]
    rank = order.index(layer_of(module))
    for target in imports(MODULES[module]):
        where = layer_of(target)
        if where is not None:
            assert order.index(where) <= rank, f"{module} ({order[rank]}) imports {target} ({where}): below it"


def test_no_module_outside_testing_imports_it() -> None:
    for module, path in MODULES.items():
        if not module.startswith("gpt_optuna.testing"):
            assert not any(t.startswith("gpt_optuna.testing") for t in imports(path)), module


def test_no_import_cycles() -> None:
    graph = {m: {t for t in imports(p) if t in MODULES and t != m} for m, p in MODULES.items()}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = path[path.index(module) :] + [module]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_the_page_lists_every_module_and_no_other() -> None:
    listed = set(re.findall(r"^(gpt_optuna/\S+\.py)\s", section("modules"), re.M))
    in_layers = {str(p.relative_to(ROOT)) for m, p in MODULES.items() if layer_of(m) and p.name != "__init__.py"}
    assert sorted(listed - in_layers) == [] and sorted(in_layers - listed) == []


def test_the_layering_check_catches_an_upward_import(tmp_path: Path) -> None:
    upward = tmp_path / "upward.py"
    upward.write_text("def f():\n    from gpt_optuna.usecases.tune import tune\n")
    assert "gpt_optuna.usecases.tune" in imports(upward)


TRIAL_RECORD = "gpt_optuna.study.trial_record"
TRIAL_ATTRS = ("user_attrs", "system_attrs")


def trial_attr_reads(path: Path) -> list[int]:
    """The lines where ``path`` reads a trial's attrs: ``X.user_attrs`` or ``X.system_attrs`` of
    anything but a study (a name or attribute ``study``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in TRIAL_ATTRS:
            owner = node.value
            name = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
            if name != "study":
                found.append(node.lineno)
    return found


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != TRIAL_RECORD))
def test_a_trials_attrs_are_read_only_through_its_record(module: str) -> None:
    assert trial_attr_reads(MODULES[module]) == [], f"{module} reads a trial's attrs: use {TRIAL_RECORD}"


def test_the_trial_record_check_catches_a_read(tmp_path: Path) -> None:
    reader = tmp_path / "reader.py"
    reader.write_text("def f(study, t):\n    return study.user_attrs, t.user_attrs['latency'], t.system_attrs\n")
    assert trial_attr_reads(reader) == [2, 2]


WORKER = "gpt_optuna.worker"
TUNER_LAYERS = ("results", "search", "remeasure", "usecases", "api", "cli")
"""The layers only the tuner runs (the page's table says where each runs)."""


def test_the_page_says_where_each_layer_runs() -> None:
    runs_in = dict(re.findall(r"^\| (\w+) \| \[`gpt_optuna/\w+/`\]\([^)]*\) \| ([^|]+?) \|", section("layers"), re.M))
    assert {layer for layer, where in runs_in.items() if where == "tuner"} == set(TUNER_LAYERS)
    assert runs_in["worker"] == "worker only"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer_of(m) in (*TUNER_LAYERS, "protocol")))
def test_the_tuner_reaches_the_worker_only_through_the_job_protocol(module: str) -> None:
    reached = sorted(t for t in imports(MODULES[module]) if t == WORKER or t.startswith(WORKER + "."))
    assert reached == [], f"{module} imports the worker's {reached}: send a job (gpt_optuna.protocol.jobs)"
    tree = ast.parse(MODULES[module].read_text())
    named = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign) and _assigns(node, "RUNS")}
    strings = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    loaded = [n.value for n in strings if n.value.startswith(WORKER + ".") and id(n) not in named]
    assert loaded == [], f"{module} names the worker's code outside a job's RUNS: {loaded}"


def _assigns(node: ast.Assign, name: str) -> bool:
    return any(isinstance(target, ast.Name) and target.id == name for target in node.targets)


def test_every_job_names_a_function_of_the_worker() -> None:
    import importlib

    from gpt_optuna.protocol import jobs

    named = [cls for cls in vars(jobs).values() if isinstance(cls, type) and issubclass(cls, jobs.Job) and cls.RUNS]
    assert len(named) >= 8
    for job in named:
        module, _, function = job.RUNS.partition(":")
        assert module.startswith(WORKER + ".") and callable(getattr(importlib.import_module(module), function)), job


def test_the_boundary_check_catches_a_worker_import(tmp_path: Path) -> None:
    tuner = tmp_path / "tuner.py"
    tuner.write_text("def f():\n    from gpt_optuna.worker.evaluate import evaluate\n")
    assert "gpt_optuna.worker.evaluate" in imports(tuner)


OPTUNA_INTERNALS = "gpt_optuna.study.optuna_internals"
PUBLIC_UNDERSCORED = {"torch._dynamo"}
"""Underscored names other libraries document as their API (``torch._dynamo.reset``, its config)."""


def private_reaches(path: Path) -> list[str]:
    """Where ``path`` names another object's private part: ``X._name`` for X not ``self`` or ``cls``,
    and an import from a private module of Optuna."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "optuna":
            named = [f"{node.module}.{alias.name}" for alias in node.names]
            found += [name for name in named if any(part.startswith("_") for part in name.split("."))]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("optuna.") and "._" in a.name]
    return [name for name in found if name not in PUBLIC_UNDERSCORED]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != OPTUNA_INTERNALS))
def test_only_the_adapter_names_optunas_private_parts(module: str) -> None:
    reached = private_reaches(MODULES[module])
    assert reached == [], f"{module} names private parts {reached}: go through {OPTUNA_INTERNALS}"


def test_the_private_parts_check_catches_each_kind_of_reach(tmp_path: Path) -> None:
    reader = tmp_path / "reader.py"
    reader.write_text(
        "import optuna.storages._rdb.models\n"
        "from optuna.study._frozen import FrozenStudy\n"
        "def f(study, self):\n    return study._storage, self._own, optuna.storages._CachedStorage, torch._dynamo\n"
    )
    assert private_reaches(reader) == [
        "optuna.storages._rdb.models",
        "optuna.study._frozen.FrozenStudy",
        "study._storage",
        "optuna.storages._CachedStorage",
    ]


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer_of(m) in ("worker", "backends")))
def test_the_engines_and_the_worker_import_nothing_of_the_study(module: str) -> None:
    reached = sorted(t for t in imports(MODULES[module]) if layer_of(t) == "study")
    assert reached == [], f"{module} imports {reached}: take what crosses from the job (gpt_optuna.protocol)"


WORKER_ENGINE_NAMES = {"Backend", "EngineChoice", "load_backend", "load_engine"}
"""What makes or types the engine a worker runs (:mod:`gpt_optuna.backends`)."""


def worker_engine_names(path: Path) -> list[str]:
    """The names of :data:`WORKER_ENGINE_NAMES` that ``path`` imports or uses."""
    tree = ast.parse(path.read_text())
    named = [n.id for n in ast.walk(tree) if isinstance(n, ast.Name)]
    named += [a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names]
    named += [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)]
    return sorted(set(named) & WORKER_ENGINE_NAMES)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if layer_of(m) in ("study", "protocol", *TUNER_LAYERS)))
def test_the_tuner_reads_an_engine_through_its_description_alone(module: str) -> None:
    reached = worker_engine_names(MODULES[module])
    assert reached == [], f"{module} names {reached}: read the engine's description (gpt_optuna.backends.describe)"
    assert not any(t.endswith(".backend") and layer_of(t) == "backends" for t in imports(MODULES[module])), module


def test_the_description_check_catches_a_worker_engine(tmp_path: Path) -> None:
    tuner = tmp_path / "tuner.py"
    tuner.write_text("from gpt_optuna.backends import load_backend\ndef f(b: 'x'):\n    return backends.EngineChoice\n")
    assert worker_engine_names(tuner) == ["EngineChoice", "load_backend"]


def test_each_registered_engine_runs_what_it_describes() -> None:
    from gpt_optuna.backends import ENGINES, describe, load_backend

    for name, registered in ENGINES.items():
        assert describe(name) is registered.description and registered.description.name == name
        assert isinstance(load_backend(name), type(registered.description)), name


def test_describing_the_engines_imports_none_of_them() -> None:
    """In a fresh process: the command line, the API and export loaded, every registered engine
    described with its deployment, and no engine module a worker runs or engine library imported."""
    script = (
        "import sys\n"
        "import gpt_optuna.api, gpt_optuna.cli.commands, gpt_optuna.results.export\n"
        "from gpt_optuna.backends import DEPLOYMENTS, ENGINES, describe\n"
        "for name in [*ENGINES, 'auto']:\n"
        "    describe(name).speed_values\n"
        "print(' '.join(sorted(sys.modules)), len(DEPLOYMENTS))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    *modules, deployments = done.stdout.split()
    assert int(deployments) >= 3
    engines = [m for m in modules if m.startswith("gpt_optuna.backends.") and m.rsplit(".", 1)[1] == "backend"]
    assert engines == [], f"describing the engines imported {engines}"
    libraries = {"torch", "onnxruntime", "tensorrt", "tensorrt_rtx", "cupy"} & set(modules)
    assert not libraries, f"describing the engines imported {sorted(libraries)}"


STUDY_RECORD = "gpt_optuna.study.record"


def study_attr_names() -> list[str]:
    """The names of the study's user attrs (``*_ATTR`` in :mod:`gpt_optuna.study.record`)."""
    tree = ast.parse(MODULES[STUDY_RECORD].read_text())
    return [
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name) and target.id.endswith("_ATTR")
    ]


def modules_naming(name: str) -> list[str]:
    """The modules but the study record that name ``name`` (import it or use it)."""
    return sorted(
        module
        for module, path in MODULES.items()
        if module != STUDY_RECORD
        and any(
            isinstance(n, ast.Name) and n.id == name or isinstance(n, ast.alias) and n.name == name
            for n in ast.walk(ast.parse(path.read_text()))
        )
    )


@pytest.mark.parametrize("name", study_attr_names())
def test_each_study_record_has_one_reader_and_writer_module(name: str) -> None:
    """A study attr is written and read in one module: the study record, or one other beside it."""
    naming = modules_naming(name)
    assert len(naming) <= 1, f"{name} is read or written in {naming}: keep its reader and writer in one module"


def test_the_record_check_finds_the_modules_that_name_an_attr() -> None:
    assert len(study_attr_names()) >= 10
    assert modules_naming("CONFIRMED_ATTR") == ["gpt_optuna.study.confirmation"]


TRIAL_WRITERS = {TRIAL_RECORD, "gpt_optuna.study.storage", "gpt_optuna.study.recovery"}
"""The trial record, and the storage that writes what it composes in one transaction, or by a dead
owner's trial's storage id (recovery)."""


def trial_attr_writes(path: Path) -> list[int]:
    """The lines where ``path`` writes a trial's attrs: ``X.set_user_attr``/``X.set_system_attr`` of
    anything but a study, and a storage's ``set_trial_user_attr``/``set_trial_system_attr``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner, name = node.func.value, node.func.attr
            on_study = isinstance(owner, ast.Name) and owner.id == "study"
            if (
                name in ("set_user_attr", "set_system_attr")
                and not on_study
                or name in ("set_trial_user_attr", "set_trial_system_attr")
            ):
                found.append(node.lineno)
    return found


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m not in TRIAL_WRITERS))
def test_a_trials_attrs_are_written_only_through_its_record(module: str) -> None:
    assert trial_attr_writes(MODULES[module]) == [], f"{module} writes a trial's attrs: use {TRIAL_RECORD}"


def test_the_trial_write_check_catches_a_write(tmp_path: Path) -> None:
    writer = tmp_path / "writer.py"
    writer.write_text(
        "def f(study, t, s):\n    study.set_user_attr('a', 1)\n    t.set_user_attr('b', 2)\n"
        "    s.set_trial_system_attr(1, 'c', 3)\n"
    )
    assert trial_attr_writes(writer) == [3, 4]


CONFIG_HOLDERS = {
    "gpt_optuna.usecases.tune",
    "gpt_optuna.usecases.preparation",
    "gpt_optuna.api.tuning",
    "gpt_optuna.cli.commands",
}
"""The modules that take tune's whole configuration: the run itself, its preparation, the API that
runs it and the command line that makes it; every other step takes the typed parts it needs
(``TuneConfig.data``, ``.kind``, ``.finalists``, a name, a deadline)."""
MAX_CONFIG_TAKERS = 12
"""Functions and fields that take the whole ``TuneConfig`` (24 functions and 2 fields took it before the
use cases were given typed parts)."""


def config_takers(path: Path) -> list[str]:
    """The functions and dataclass fields of ``path`` annotated with ``TuneConfig``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            if any(a.annotation is not None and "TuneConfig" in ast.unparse(a.annotation) for a in arguments):
                found.append(node.name)
        elif isinstance(node, ast.ClassDef):
            found += [
                f"{node.name}.{ast.unparse(b.target)}"
                for b in node.body
                if isinstance(b, ast.AnnAssign) and "TuneConfig" in ast.unparse(b.annotation)
            ]
    return found


def test_the_whole_configuration_stays_in_the_tune_use_case() -> None:
    takers = {module: config_takers(path) for module, path in MODULES.items()}
    holders = {module for module, found in takers.items() if found}
    assert holders <= CONFIG_HOLDERS, f"{sorted(holders - CONFIG_HOLDERS)} take the whole TuneConfig"
    count = sum(len(found) for found in takers.values())
    assert count <= MAX_CONFIG_TAKERS, f"{count} functions and fields take the whole TuneConfig: {takers}"


def test_the_configuration_check_finds_functions_and_fields(tmp_path: Path) -> None:
    source = tmp_path / "steps.py"
    source.write_text(
        "class Run:\n    config: TuneConfig\n    n: int\n"
        "def step(config: TuneConfig, x: int) -> None: ...\ndef other(data: DataSource) -> None: ...\n"
    )
    assert config_takers(source) == ["Run.config", "step"]
