"""The simulator outputs that the docs and the README quote are current.

A quote is a ```` ```text ```` block after ``<!-- verdict-of: prioqueue simulate ... -->`` (the
first lines of the bare command's output) or ``<!-- sweep-of: prioqueue simulate ARGS -->`` (the
whole output of that command).

The sweeps are the commands that draw the docs' pictures, so ``nox -s docs`` runs this module
after drawing them and hands it their outputs (``PRIOQUEUE_SIM_OUTPUTS``: a JSON object from a
command's arguments to its output); a command it did not run runs here. ``nox -s tests`` leaves
the module to that session, so each sweep runs once per ``nox``; run alone (``pytest
tests/sim/test_sim_docs.py``), it runs every command itself.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest

from prioqueue.cli import main

ROOT = Path(__file__).resolve().parents[2]
_QUOTE = re.compile(
    r"<!--\s*(?P<kind>verdict-of|sweep-of):\s*(?P<command>[^>]*?)\s*-->\s*\n```text\n"
    r"(?P<body>.*?)^```",
    re.MULTILINE | re.DOTALL,
)
PAGES = [ROOT / "README.md", ROOT / "docs" / "simulator.md", ROOT / "docs" / "how-to" / "tune.md"]
QUOTES = [
    (page.relative_to(ROOT).as_posix(), match["kind"], match["command"], match["body"])
    for page in PAGES
    for match in _QUOTE.finditer(page.read_text(encoding="utf-8"))
]


def _command(quoted_command: str) -> tuple[str, ...]:
    """The command's words (a note in parentheses after it left out)."""
    return tuple(shlex.split(quoted_command.split("(", maxsplit=1)[0]))


# Each command runs once, however many pages quote it (a sweep takes tens of seconds).
COMMANDS = sorted({_command(command) for _, _, command, _ in QUOTES})


def test_the_docs_quote_the_verdict() -> None:
    assert any(kind == "verdict-of" for _, kind, _, _ in QUOTES)
    assert any(kind == "sweep-of" for _, kind, _, _ in QUOTES)
    assert len(COMMANDS) < len(QUOTES)  # some command is quoted twice: it still runs once


def _output(words: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> str:
    """What ``prioqueue simulate ARGS --plain --no-progress`` prints: the docs session's run of
    it when there was one, else a run here."""
    recorded = os.environ.get("PRIOQUEUE_SIM_OUTPUTS")
    if recorded:
        outputs: dict[str, str] = json.loads(Path(recorded).read_text(encoding="utf-8"))
        if " ".join(words[2:]) in outputs:
            return outputs[" ".join(words[2:])]
    assert main([*words[1:], "--plain", "--no-progress"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("words", COMMANDS, ids=[" ".join(c[2:]) or "bare" for c in COMMANDS])
def test_quoted_output_is_current(
    words: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert words[:2] == ("prioqueue", "simulate"), f"{words}: not a simulate command"
    out = _output(words, capsys)
    for page, kind, command, quoted in QUOTES:
        if _command(command) != words:
            continue
        if kind == "verdict-of":
            lines = quoted.splitlines()
            assert out.splitlines()[: len(lines)] == lines, f"{page} quotes an outdated verdict"
        else:
            assert out == quoted, f"{page} quotes an outdated output of {command}"
