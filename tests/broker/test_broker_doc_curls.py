"""Every ``curl`` of the broker docs runs as written against a real broker (issue 18, item 5).

The console blocks of ``docs/broker.md`` and ``docs/workers.md`` are read; each ``$ curl``
command aimed at the quick-start broker (``localhost:8091``), continuation lines included, is
run in page order by ``sh`` against a broker subprocess started from the page's own
``broker.toml`` block, with only the port swapped for a free one. Each must exit 0 and print
JSON that is not an error (or nothing, for a command whose answer the page does not show).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from .broker_helpers import BrokerProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("docs/broker.md", "docs/workers.md")
_CONSOLE = re.compile(r"^```console\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL)
FLEET = {"Authorization": "Bearer wk-fleet"}
_TOML = re.compile(r"^```toml\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL)


def curls(text: str) -> list[str]:
    """The ``$ curl`` commands to the quick-start broker, joined across continuations."""
    found = []
    for block in _CONSOLE.finditer(text):
        lines = block["body"].splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            if not line.startswith("$ curl"):
                continue
            command = line[2:]
            while command.rstrip().endswith("\\") or command.count("'") % 2:
                command = command + "\n" + lines[i]
                i += 1
            if "localhost:8091" in command:
                found.append(command)
    return found


def test_the_extractor_joins_continued_commands() -> None:
    text = "```console\n$ curl -s localhost:8091/x \\\n    -d '{\"a\":\n 1}'\nout\n$ ls\n```\n"
    assert curls(text) == ["curl -s localhost:8091/x \\\n    -d '{\"a\":\n 1}'"]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_every_quick_start_curl_runs_as_written(tmp_path: Path) -> None:
    text = (ROOT / "docs/broker.md").read_text(encoding="utf-8")
    config = _TOML.search(text)
    assert config is not None
    port = free_port()
    toml = config["body"].replace("127.0.0.1:8091", f"127.0.0.1:{port}")
    store = re.search(r'^store = "(?P<url>[^"]+)"', toml, re.MULTILINE)
    assert store is not None, "the quick-start config names no store"
    # The page's store is relative to the working directory: put it in tmp_path, or every run
    # after the first would find the last run's job-1 (and litter the checkout).
    toml = toml.replace(store["url"], f"sqlite:///{tmp_path / 'broker.db'}")
    (tmp_path / "broker.toml").write_text(toml, encoding="utf-8")
    proc = BrokerProcess(tmp_path / "broker.toml", port, tmp_path / "broker.log").start()
    try:
        for _ in range(400):  # until it serves (the page's worker key reads the status)
            assert proc.proc is not None
            assert proc.proc.poll() is None, (tmp_path / "broker.log").read_text()
            with contextlib.suppress(httpx.HTTPError):
                status = httpx.get(f"{proc.url}/v1/status", headers=FLEET, timeout=1.0)
                if status.status_code == 200:
                    break
            time.sleep(0.05)
        commands = [c for page in PAGES for c in curls((ROOT / page).read_text("utf-8"))]
        assert len(commands) >= 4
        for command in commands:
            run = command.replace("localhost:8091", f"127.0.0.1:{port}")
            done = subprocess.run(
                ["sh", "-c", run], capture_output=True, text=True, timeout=60, check=False
            )
            assert done.returncode == 0, (command, done.stderr)
            out = done.stdout.strip()
            if out:
                answer = json.loads(out)
                assert not (isinstance(answer, dict) and "error" in answer), (command, out)
    finally:
        proc.kill()
