"""What a careless user does, through the real command in child processes: a study folder moved,
a read-only study, a full device for the log, a broken engine, numbers out of range, odd inputs and
an early Ctrl-C; each ends in advice the user can follow, or works."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from test_faults import gpt_optuna, mounted_tmpfs

QUICK = ("--n-trials", "3", "--quiet", "--confirm-top", "0")


@pytest.mark.slow
def test_compare_and_profile_on_a_read_only_study_write_their_logs_elsewhere(cnn_path: Path, tmp_path: Path) -> None:
    with mounted_tmpfs(tmp_path / "ro", "64m") as disk:
        assert gpt_optuna("tune", str(cnn_path), *QUICK, cwd=disk).returncode == 0
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        try:
            compared = gpt_optuna("compare", "0", "1", "--processes", "1", "--rounds", "3", "--json", cwd=disk)
            profiled = gpt_optuna("profile", "0", "--runs", "3", "--json", cwd=disk)
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
    for result in compared, profiled:
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 0 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert lines[0].startswith("warning: cannot write in the study folder") and "Read-only" in lines[0], lines
    assert json.loads(compared.stdout)["speedup"] is not None
    elsewhere = Path(profiled.stderr.split("writing to ")[-1].strip())
    assert (elsewhere / "profile.log").is_file() and (elsewhere / "profile-0.json").is_file()
