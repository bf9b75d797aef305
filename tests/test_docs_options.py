"""The documentation names only options that exist.

Every ``--llmperf-...`` flag and every ``llmperf_...`` ini key written in the README, docs/, the
example workflows (.github/), the example suites, scripts/ and benchmarks/ must be in the plugin's
option table (``pytest_llmperf/cli/options.py``) or, for a flag, in an ``llmperf`` CLI parser. A
renamed or removed option then fails here instead of in a user's CI job.

An ini key counts where it is written as one: alone in backticks in Markdown (`` `llmperf_keep` ``)
or as ``llmperf_keep = ...`` at the start of a line (ini files, YAML); other ``llmperf_...`` words
(the simulator's ``"llmperf_server_time"`` chunk field) are not options.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from pytest_llmperf.cli import compare_command, history_command
from pytest_llmperf.cli import main as cli_main
from pytest_llmperf.cli.options import OPTIONS

ROOT = Path(__file__).resolve().parent.parent

# Added in parallel on other branches (adaptive launches, session CV); the docs may name them
# before the options land here. Remove from this list once cli/options.py has them.
PENDING = {"--llmperf-launches", "--llmperf-session-cv", "llmperf_launches", "llmperf_session_cv"}

FLAG = re.compile(r"--llmperf-[a-z0-9]+(?:-[a-z0-9]+)*(?:-\*)?")
INI_KEY = re.compile(r"`(llmperf_[a-z0-9_]+)`|^\s*(llmperf_[a-z0-9_]+)\s*[=:]", re.MULTILINE)


def _documents() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for folder, patterns in ((".github", ("*.yml", "*.yaml", "*.md")),
                             ("example_suites", ("*.md", "*.ini", "*.toml", "*.py", "*.yml", "*.yaml")),
                             ("scripts", ("*.sh", "*.py", "*.md")),
                             ("benchmarks", ("*.py", "*.md", "*.sh"))):
        for pattern in patterns:
            found.extend(sorted((ROOT / folder).rglob(pattern)))
    return [p for p in found if p.is_file()]


def _cli_flags() -> set[str]:
    flags: set[str] = set()
    parsers = [cli_main.build_parser(), compare_command.build_parser(), history_command.build_parser()]
    while parsers:
        parser = parsers.pop()
        for action in parser._actions:
            flags.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
    return flags


def _known() -> tuple[set[str], set[str]]:
    flags = {spec.cli for spec in OPTIONS} | _cli_flags()
    keys = {spec.ini for spec in OPTIONS}
    return flags, keys


def _mentions() -> dict[str, list[str]]:
    """Each option-like name in the documents, with where it is written (``file:line``)."""
    where: dict[str, list[str]] = {}
    for path in _documents():
        text = path.read_text(encoding="utf-8", errors="replace")
        rel = path.relative_to(ROOT)
        for match in FLAG.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            where.setdefault(match.group(0), []).append(f"{rel}:{line}")
        for match in INI_KEY.finditer(text):
            name = match.group(1) or match.group(2)
            line = text.count("\n", 0, match.start(1) if match.group(1) else match.start(2)) + 1
            where.setdefault(name, []).append(f"{rel}:{line}")
    return where


def test_the_scan_sees_the_documents():
    # Guards the test itself: if the documents moved or the patterns broke, everything would "pass".
    mentions = _mentions()
    assert "--llmperf-baseline" in mentions and "--llmperf-store" in mentions
    assert "llmperf_sim_preset" in mentions and "llmperf_report_dir" in mentions
    assert any(loc.startswith(".github/") for locs in mentions.values() for loc in locs)
    assert "llmperf_server_time" not in mentions  # a JSON field in docs/simulator.md, not an ini key


def test_every_documented_option_exists():
    flags, keys = _known()
    unknown = []
    for name, locations in sorted(_mentions().items()):
        if name in PENDING:
            continue
        if name.endswith("-*"):  # "--llmperf-ab-*": a family, which must have members
            ok = any(flag.startswith(name[:-1]) for flag in flags)
        else:
            ok = name in (flags if name.startswith("--") else keys)
        if not ok:
            unknown.append(f"{name} ({', '.join(locations[:5])})")
    assert not unknown, "documented but not an option of the plugin or the CLI:\n  " + "\n  ".join(unknown)


@pytest.mark.parametrize("text, expected", [
    ("run with `--llmperf-pool 3` and `llmperf_pool`", {"--llmperf-pool", "llmperf_pool"}),
    ("llmperf_keep = 5\nsee \"llmperf_server_time\"", {"llmperf_keep"}),
    ("any `--llmperf-ab-*` flag", {"--llmperf-ab-*"}),
])
def test_patterns_find_flags_and_ini_keys(text, expected):
    found = {m.group(0) for m in FLAG.finditer(text)}
    found |= {m.group(1) or m.group(2) for m in INI_KEY.finditer(text)}
    assert found == expected
