"""Every script in examples/ runs to completion, and the outputs quoted in the docs are current.

Tools that need input files (``ARGUMENTS``) are only started: their ``--help`` must work.

``nox -s examples`` runs this module; each script runs in a fresh interpreter with a timeout.
A docs page quotes an example's output in a ```` ```text ```` block preceded by
``<!-- output-of: examples/NAME.py -->``; the quote must equal what the script prints.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
TIMEOUT = 120  # seconds per script; each is meant to take a few
ARGUMENTS = {"azure_trace.py": ["--help"]}

_QUOTE = re.compile(
    r"<!--\s*output-of:\s*(?P<script>\S+)\s*-->\s*\n```text\n(?P<body>.*?)^```",
    re.MULTILINE | re.DOTALL,
)


@functools.cache
def _run(script: Path) -> subprocess.CompletedProcess[str]:
    """Run a script once per test session (the quote checks reuse the run of the script)."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "NO_COLOR": "1", "COLUMNS": "100"}
    return subprocess.run(
        [sys.executable, str(script), *ARGUMENTS.get(script.name, [])],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


@pytest.mark.parametrize("script", EXAMPLES, ids=[s.name for s in EXAMPLES])
def test_example_runs(script: Path) -> None:
    result = _run(script)
    assert result.returncode == 0, f"{script.name} failed:\n{result.stdout}\n{result.stderr}"
    assert result.stdout.strip(), f"{script.name} printed nothing"


def _quotes() -> list[tuple[str, str, str]]:
    found = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for match in _QUOTE.finditer(page.read_text(encoding="utf-8")):
            found.append((page.relative_to(ROOT).as_posix(), match["script"], match["body"]))
    return found


QUOTES = _quotes()


@pytest.mark.parametrize(
    ("page", "script", "quoted"), QUOTES, ids=[f"{p}:{s}" for p, s, _ in QUOTES]
)
def test_quoted_output_is_current(page: str, script: str, quoted: str) -> None:
    result = _run(ROOT / script)
    assert result.returncode == 0, result.stderr
    assert result.stdout == quoted, f"{page} quotes an outdated output of {script}"


def _azure_trace(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``examples/azure_trace.py`` with ``args``."""
    return subprocess.run(
        [sys.executable, str(ROOT / "examples" / "azure_trace.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def test_azure_trace_names_a_missing_file_in_one_line(tmp_path: Path) -> None:
    result = _azure_trace(str(tmp_path / "nope.csv"), "-")
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "nope.csv: No such file or directory" in result.stderr


def test_azure_trace_refuses_a_param_without_a_value(tmp_path: Path) -> None:
    source = tmp_path / "trace.csv"
    source.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n", encoding="utf-8")
    result = _azure_trace(str(source), "-", "--param", "seed")
    assert result.returncode == 2
    assert "--param takes KEY=VALUE, got 'seed'" in result.stderr
    assert "Traceback" not in result.stderr


def test_example_usage_names_no_path_of_this_workplace() -> None:
    # The usage once named ../shared/traces, a folder only the developers' machines have.
    for script in EXAMPLES:
        assert "shared/traces" not in script.read_text(encoding="utf-8"), script.name
