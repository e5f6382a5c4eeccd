"""Every script in examples/ runs to completion, and the outputs quoted in the docs are current.

Tools that need input files (``ARGUMENTS``) are only started: their ``--help`` must work.

``nox -s examples`` runs this module; each script runs in a fresh interpreter with a timeout.
The scripts the selected tests need start together when the first of them runs, as many at a
time as there are cores (the longest first): most of their time is simulation on one core, or
waiting on a broker, so the module takes about as long as its longest script, not their sum.
A docs page quotes an example's output in a ```` ```text ```` block preceded by
``<!-- output-of: examples/NAME.py -->``; the quote must equal what the script prints.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
TIMEOUT = 120  # seconds per script; each is meant to take a few
ARGUMENTS = {"azure_trace.py": ["--help"]}
#: The scripts that take longest (tens of seconds on a busy 2-core machine) start first.
LONGEST_FIRST = ("warm_hold.py", "broker_fleet.py", "film_depth.py", "run_gateway.py")

_QUOTE = re.compile(
    r"<!--\s*output-of:\s*(?P<script>\S+)\s*-->\s*\n```text\n(?P<body>.*?)^```",
    re.MULTILINE | re.DOTALL,
)

Runs = dict[Path, "Future[subprocess.CompletedProcess[str]]"]


def _run_one(script: Path) -> subprocess.CompletedProcess[str]:
    """Run one script in a fresh interpreter."""
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


def _wanted(items: list[pytest.Item]) -> list[Path]:
    """The scripts the selected tests of this module run, the longest first."""
    wanted: set[Path] = set()
    for item in items:
        callspec = getattr(item, "callspec", None)
        if item.path == Path(__file__) and callspec is not None and "script" in callspec.params:
            wanted.add(ROOT / callspec.params["script"])  # a Path, or "examples/NAME.py"
    rank = {name: k for k, name in enumerate(LONGEST_FIRST)}
    return sorted(wanted, key=lambda s: (rank.get(s.name, len(rank)), s.name))


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest) -> Iterator[Runs]:
    """Each script the selected tests need, started once (the quote checks reuse its run)."""
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        yield {script: pool.submit(_run_one, script) for script in _wanted(request.session.items)}


@pytest.mark.parametrize("script", EXAMPLES, ids=[s.name for s in EXAMPLES])
def test_example_runs(script: Path, runs: Runs) -> None:
    result = runs[script].result()
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
def test_quoted_output_is_current(page: str, script: str, quoted: str, runs: Runs) -> None:
    result = runs[ROOT / script].result()
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
