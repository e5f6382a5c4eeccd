"""A newcomer's first hour: install hints, the command's start, ``python -m``, the example."""

from __future__ import annotations

import ast
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from prioqueue.cli import main
from prioqueue.gateway.fake_upstream import bind_loopback

ROOT = Path(__file__).resolve().parents[2]


def test_gateway_without_its_extra_prints_the_install_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # import uvicorn now fails
    assert main(["gateway", "--listen", "127.0.0.1:0"]) == 1
    error = capsys.readouterr().err
    assert "pip install '.[gateway,prometheus]'" in error
    assert "uvicorn" in error
    assert "Traceback" not in error
    assert main(["gateway", "--check"]) == 1  # --check checks the extras too


def test_check_says_when_metrics_are_off(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    assert main(["gateway", "--check"]) == 0
    out = capsys.readouterr().out
    assert "configuration OK" in out
    assert "/metrics is off without the 'prometheus' extra" in out


def test_a_port_in_use_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    taken = bind_loopback()
    try:
        port = taken.getsockname()[1]
        assert main(["gateway", "--listen", f"127.0.0.1:{port}"]) == 1
    finally:
        taken.close()
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0
    assert f"cannot listen on 127.0.0.1:{port}: the address is already in use" in error


def test_listening_is_printed_once_the_port_accepts_connections() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "prioqueue", "gateway", "--listen", f"127.0.0.1:{port}",
         "--upstream", "http://127.0.0.1:9", "--log-level", "warning"],
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stderr is not None
        line = process.stderr.readline().decode()
        assert "listening on http://127.0.0.1:" in line
        # No retry: the moment "listening" is printed, connecting must succeed.
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        process.terminate()
        assert process.wait(timeout=60) == 0
        assert process.stderr is not None
        process.stderr.close()


def _python_m(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m ARGS`` with this interpreter, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_python_dash_m_prioqueue_works() -> None:
    result = _python_m("prioqueue", "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("prioqueue-lanes ")


def test_fake_upstream_documents_itself() -> None:
    result = _python_m("prioqueue.gateway.fake_upstream", "--help")
    assert result.returncode == 0
    assert "A fake llama-swap" in result.stdout
    assert "'fake' object" in result.stdout


def test_run_gateway_example_needs_only_the_gateway_extra() -> None:
    allowed = set(sys.stdlib_module_names) | {"prioqueue", "aiohttp", "uvicorn", "yarl", "attrs"}
    tree = ast.parse((ROOT / "examples" / "run_gateway.py").read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    assert imported <= allowed, imported - allowed


def test_docs_install_lines_work_from_a_clone() -> None:
    page = (ROOT / "docs" / "gateway.md").read_text(encoding="utf-8")
    assert "pip install '.[gateway,prometheus]'" in page
    for line in page.splitlines():
        if "pip install" in line and "prioqueue-lanes[" in line:
            assert "release" in line, line  # the index name only with its caveat


def test_the_gateway_check_passes_from_a_clone() -> None:
    # Behaviour only (no wall-clock bound: a busy machine must not fail it).
    assert main(["gateway", "--check"]) == 0
