"""The simulator outputs that the docs and the README quote are current.

A quote is a ```` ```text ```` block after ``<!-- verdict-of: prioqueue simulate ... -->`` (the
first lines of the bare command's output) or ``<!-- sweep-of: prioqueue simulate ARGS -->`` (the
whole output of that command).
"""

from __future__ import annotations

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


def test_the_docs_quote_the_verdict() -> None:
    assert any(kind == "verdict-of" for _, kind, _, _ in QUOTES)
    assert any(kind == "sweep-of" for _, kind, _, _ in QUOTES)


@pytest.mark.parametrize(
    ("page", "kind", "command", "quoted"), QUOTES, ids=[f"{q[0]}:{q[1]}" for q in QUOTES]
)
def test_quoted_output_is_current(
    page: str, kind: str, command: str, quoted: str, capsys: pytest.CaptureFixture[str]
) -> None:
    words = shlex.split(command.split("(", maxsplit=1)[0])
    assert words[:2] == ["prioqueue", "simulate"], f"{page}: not a simulate command"
    assert main([*words[1:], "--plain", "--no-progress"]) == 0
    out = capsys.readouterr().out
    if kind == "verdict-of":
        lines = quoted.splitlines()
        assert out.splitlines()[: len(lines)] == lines, f"{page} quotes an outdated verdict"
    else:
        assert out == quoted, f"{page} quotes an outdated output of {command}"
