"""``gpt-optuna doctor``: what this machine offers the tuner (engines, their versions, execution
providers that really start, GPUs, the knobs each engine offers), and a self-test that builds and
times one tiny model per engine, each in a worker process of its own (a library that crashes is
reported, not fatal)."""

from __future__ import annotations

import json
import platform
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpt_optuna.backends import BACKENDS, describe
from gpt_optuna.core.errors import UserError

SELF_TEST_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class EngineCheck:
    """One engine here: ``missing`` says why it cannot run (not installed, or its self-test failed);
    otherwise its versions, the knobs it offers for the tiny model and the self-test's figures."""

    name: str
    missing: str | None = None
    versions: dict[str, str] = field(default_factory=dict)
    gpus: list[str] = field(default_factory=list)
    providers: list[str] = field(default_factory=list)
    knobs: dict[str, list[Any]] = field(default_factory=dict)
    build_s: float | None = None
    latency_ms: float | None = None
    not_run: str | None = None


def _check(name: str) -> EngineCheck:
    from gpt_optuna.protocol.jobs import SelfTestJob
    from gpt_optuna.protocol.process import JobFailure, Worker

    missing = describe(name).missing_library()
    if missing is not None:
        return EngineCheck(name, missing=str(missing))
    with tempfile.TemporaryDirectory(prefix="gpt-optuna-doctor-") as folder:
        try:
            with Worker(Path(folder) / "worker.log") as worker:
                found = worker.run(SelfTestJob(name), SELF_TEST_TIMEOUT_S)
        except JobFailure as failure:
            return EngineCheck(name, missing=f"its self-test failed: {failure}")
        except UserError as refused:  # installed, but fails to import
            return EngineCheck(name, missing=str(refused))
    return EngineCheck(name, **found)


def doctor(as_json: bool) -> tuple[str, int]:
    """What ``gpt-optuna doctor`` finds (as lines, or as JSON), and its exit code: 0 where at least
    one engine runs the tiny model."""
    from gpt_optuna import __version__

    checks = [_check(name) for name in BACKENDS]
    facts = {"gpt_optuna": __version__, "python": sys.version.split()[0], "platform": platform.platform()}
    text = (
        json.dumps({**facts, "engines": [asdict(c) for c in checks]}) if as_json else "\n".join(_lines(facts, checks))
    )
    return text, 0 if any(c.missing is None and c.latency_ms is not None for c in checks) else 1


def _lines(facts: dict[str, str], checks: list[EngineCheck]) -> list[str]:
    lines = [f"gpt-optuna {facts['gpt_optuna']}, Python {facts['python']}, {facts['platform']}"]
    gpus = next((c.gpus for c in checks if c.gpus), [])
    lines.append(f"GPUs: {', '.join(f'{i}: {n}' for i, n in enumerate(gpus))}" if gpus else "GPUs: none seen")
    for check in checks:
        if check.missing is not None:
            lines.append(f"{check.name}: not usable here: {check.missing}")
            continue
        versions = ", ".join(f"{k} {v}" for k, v in check.versions.items())
        ran = f"{check.latency_ms:.4g} ms per run" if check.latency_ms is not None else f"not run: {check.not_run}"
        lines.append(f"{check.name} ({versions}): the tiny model built in {check.build_s:.3g} s, {ran}")
        if check.providers:
            lines.append(f"  execution providers that start: {', '.join(check.providers)}")
        lines.append(f"  {len(check.knobs)} knobs for the tiny model:")
        lines += [f"    {name}: {', '.join(map(_shown, values))}" for name, values in check.knobs.items()]
    return lines


def _shown(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
