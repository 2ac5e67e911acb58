"""optuna-dashboard shows the study's winner however late it was installed: a study decided
before it was there gets the winner's figure and notes from ``gpt-optuna dashboard`` (``status``
says so), and the verdict comes first among the study's user attrs."""

from __future__ import annotations

import json
import sys

import pytest
from test_report import wsgi_get
from test_verdict_words import study_confirmed

from gpt_optuna.cli import main
from gpt_optuna.core.errors import EXIT_USER_ERROR
from gpt_optuna.results.summary_text import headline
from gpt_optuna.results.winner import dashboard_written, record_winner
from gpt_optuna.study.summary import summarize_study

WHERE = ["--storage", "sqlite:///words.db", "--study-name", "words"]


def test_a_study_decided_before_optuna_dashboard_was_installed_gets_its_winner_from_the_dashboard_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    optuna_dashboard = pytest.importorskip("optuna_dashboard")
    monkeypatch.setitem(sys.modules, "optuna_dashboard", None)  # not installed when the winner was decided
    study = study_confirmed([2.0, 2.01, 1.99], storage="sqlite:///words.db")
    record_winner(study)
    assert not dashboard_written(study)
    capsys.readouterr()
    assert main(["dashboard", *WHERE]) == EXIT_USER_ERROR
    assert "optuna-dashboard is not installed here: pip install optuna-dashboard" in capsys.readouterr().err

    monkeypatch.setitem(sys.modules, "optuna_dashboard", optuna_dashboard)  # installed since
    assert main(["status", *WHERE]) == 0
    assert "optuna-dashboard does not show this study's winner yet: gpt-optuna dashboard --storage" in (
        capsys.readouterr().out
    )
    assert main(["dashboard", *WHERE]) == 0
    assert "optuna-dashboard shows trial 1 as the study's winner" in capsys.readouterr().out
    assert main(["status", *WHERE]) == 0
    assert "optuna-dashboard does not show" not in capsys.readouterr().out

    status, body = wsgi_get(optuna_dashboard.wsgi("sqlite:///words.db"), f"/api/studies/{study._study_id}?after=0")
    assert status.startswith("200"), body[:300]
    detail = json.loads(body)
    figures = {f["id"]: json.dumps(f["graph_object"]) for f in detail["plotly_graph_objects"]}
    assert "gpt-optuna's winner: trial 1" in figures["gpt-optuna-winner"]
    attrs = {a["key"]: a["value"] for a in detail["user_attrs"]}
    assert attrs["Verdict"] == headline(summarize_study(study))  # first in a study tune made: test_report
