"""README.md and docs/: links and anchors resolve, every page is reachable, the README stays short."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
TEST_COMMAND = "pip install -e '.[test]' && python -m pytest -q"

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"`+[^`\n]*`+")


def prose_lines(path: Path) -> list[str]:
    """The file's lines outside fenced code blocks."""
    lines, fence = [], None
    for line in path.read_text(encoding="utf-8").splitlines():
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)[0] * 3
        elif fence is not None and line.lstrip().startswith(fence):
            fence = None
        elif fence is None:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link text kept, lowercase, punctuation but - and _ dropped, spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file; repeated headings get -1, -2, ..."""
    found: set[str] = set()
    for line in prose_lines(path):
        if match := HEADING.match(line):
            base = anchor = slug(match.group(1))
            n = 0
            while anchor in found:
                n += 1
                anchor = f"{base}-{n}"
            found.add(anchor)
    return found


def links(path: Path) -> list[str]:
    """Relative link targets of a Markdown file, code left out."""
    targets = []
    for line in prose_lines(path):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                targets.append(target)
    return targets


def broken(path: Path) -> list[str]:
    """The links of one file whose file or anchor does not exist."""
    problems = []
    for target in links(path):
        name, _, anchor = target.partition("#")
        resolved = (path.parent / unquote(name)).resolve() if name else path
        if not resolved.exists():
            problems.append(f"{target}: no file {resolved}")
        elif anchor and resolved.suffix == ".md" and unquote(anchor) not in anchors(resolved):
            problems.append(f"{target}: no heading #{anchor} in {resolved.name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_anchors_resolve(page: Path) -> None:
    assert not broken(page)


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Graph fusion (ONNX Runtime)\n## Notes\n## Notes\n", encoding="utf-8")
    page = tmp_path / "a.md"
    page.write_text(
        "# Top\n[ok](b.md#graph-fusion-onnx-runtime) [ok](b.md#notes-1) [ok](#top) [web](https://x.org/#y)\n"
        "[gone](c.md) [bad](b.md#notes-2) [bad](#nowhere)\n```\n[code](d.md)\n```\n",
        encoding="utf-8",
    )
    assert [problem.split(":")[0] for problem in broken(page)] == ["c.md", "b.md#notes-2", "#nowhere"]


def test_every_page_is_reachable_from_the_readme() -> None:
    reached, todo = {README}, [README]
    while todo:
        page = todo.pop()
        for target in links(page):
            name = target.partition("#")[0]
            linked = (page.parent / unquote(name)).resolve()
            if name.endswith(".md") and linked.exists() and linked not in reached:
                reached.add(linked)
                todo.append(linked)
    assert not [str(p.relative_to(ROOT)) for p in PAGES if p not in reached]


def test_readme_is_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) < 250


def test_readme_keeps_the_test_command() -> None:
    assert TEST_COMMAND in [line.strip() for line in README.read_text(encoding="utf-8").splitlines()]


SHARED_FLAGS = {"--help", "--verbose", "--quiet", "--log-file"}
"""Every command's flags, which the page states once below its synopsis."""


def synopsis() -> dict[str, str]:
    """docs/cli.md's synopsis of each command: its line and the lines continuing it."""
    text = (ROOT / "docs" / "cli.md").read_text()
    found: dict[str, str] = {}
    command = None
    for line in text[text.index("## Commands") : text.index("`--storage` takes")].splitlines():
        start = re.match(r" {4}gpt-optuna (\S+)", line)
        if start:
            command = start.group(1)
            found[command] = line
        elif command is not None and line.startswith(" " * 6):
            found[command] += line
    return found


def test_the_cli_pages_synopsis_names_every_command_and_flag_and_no_other() -> None:
    import argparse

    from gpt_optuna.cli.commands import COMMANDS, build_parser

    parsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    written = synopsis()
    assert sorted(written) == sorted(c.name for c in COMMANDS)
    for command in COMMANDS:
        flags = {s for a in parsers[command.name]._actions for s in a.option_strings if s.startswith("--")}
        assert set(re.findall(r"--[a-z0-9-]+", written[command.name])) == flags - SHARED_FLAGS, command.name
    page = (ROOT / "docs" / "cli.md").read_text()
    assert all(flag in page for flag in ("`-v`", "`-q`", "`--log-file FILE`"))
