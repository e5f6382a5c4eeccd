"""The real llama-swap for tests: find it, configure it, start it on free ports, stop it.

The binary is ``../shared/llama-swap/llama-swap`` from the repository root (a project
checkout has it), or ``PRIOQUEUE_LLAMA_SWAP``. Where it is absent the tests skip, saying why,
unless ``PRIOQUEUE_REQUIRE_LLAMA_SWAP=1`` (``.ci/run`` sets it): then they fail.

Each model's ``cmd`` runs ``standin.py`` (a stand-in for llama-server) with ``${PORT}``; every
stand-in appends what it does to one events file (:class:`Events`), so a test sees which
processes llama-swap started and what each request did, in one clock (``time.monotonic``).
Processes are stopped by their ids only: llama-swap (SIGTERM, then SIGKILL), then any
stand-in it left behind (the ids from the events file).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]
STANDIN = Path(__file__).resolve().parent / "standin.py"


def binary() -> Path:
    """The llama-swap binary, or skip (fail under ``PRIOQUEUE_REQUIRE_LLAMA_SWAP=1``)."""
    given = os.environ.get("PRIOQUEUE_LLAMA_SWAP")
    path = Path(given) if given else ROOT.parent / "shared" / "llama-swap" / "llama-swap"
    if not (path.is_file() and os.access(path, os.X_OK)):
        reason = (
            f"the real llama-swap is not at {path} (a project checkout has it at "
            "../shared/llama-swap/llama-swap; PRIOQUEUE_LLAMA_SWAP names another)"
        )
        if os.environ.get("PRIOQUEUE_REQUIRE_LLAMA_SWAP") == "1":
            pytest.fail(f"PRIOQUEUE_REQUIRE_LLAMA_SWAP=1 but {reason}")
        pytest.skip(reason)
    return path


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive loopback ports free now."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = int(probe.getsockname()[1])
        if base + count > 65000:
            continue
        held: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports")


def model(
    name: str, events: Path, *, load: float = 0.0, work: float = 0.05, **options: Any
) -> dict[str, Any]:
    """A model entry whose ``cmd`` starts the stand-in (``crash_at_start``, ``crash_after``,
    ``ttl``, ``sendLoadingState`` and other llama-swap keys in ``options``)."""
    cmd = [sys.executable, str(STANDIN), "--port", "${PORT}", "--name", name]
    cmd += ["--load", str(load), "--work", str(work), "--log", str(events)]
    if options.pop("crash_at_start", False):
        cmd.append("--crash-at-start")
    crash_after = options.pop("crash_after", None)
    if crash_after is not None:
        cmd += ["--crash-after", str(crash_after)]
    return {"cmd": " ".join(cmd), "proxy": "http://127.0.0.1:${PORT}", **options}


class Events:
    """What the stand-ins wrote: process starts and requests (see ``standin.py``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def lines(self) -> list[list[str]]:
        return [line.split() for line in self.path.read_text().splitlines() if line.strip()]

    def starts(self, since: int = 0) -> list[str]:
        """The models whose process was started, in order (from line ``since``)."""
        return [f[1] for f in self.lines()[since:] if f[0] == "start"]

    def begun(self, since: int = 0) -> list[str]:
        """The tags of the requests the stand-ins began, in order."""
        return [f[2] for f in self.lines()[since:] if f[0] == "begin"]

    def most_at_once(self, since: int = 0) -> int:
        """The most requests any stand-ins ran at the same time."""
        edges = sorted(
            (float(f[3]), 1 if f[0] == "begin" else -1)
            for f in self.lines()[since:]
            if f[0] in ("begin", "end")
        )
        now = most = 0
        for _, step in edges:
            now += step
            most = max(most, now)
        return most

    def pids(self) -> list[int]:
        return [int(f[2]) for f in self.lines() if f[0] == "start"]


class LlamaSwap:
    """One llama-swap process on a free loopback port, with a generated configuration.

    Args:
        workdir: Where its configuration, log and events file go.
        models: Model name -> entry (see :func:`model`); the events file is shared.
        **top: Other top-level keys (``groups``, ``apiKeys``, ``sendLoadingState``...).
    """

    def __init__(
        self, workdir: Path, models: dict[str, dict[str, Any]], *, text: str = "", **top: Any
    ) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_ports(1)
        config = {
            "healthCheckTimeout": 15,
            "logLevel": "info",
            "startPort": free_ports(len(models) + 1),
            "models": models,
            **top,
        }
        self.config_path = workdir / "llama-swap.yaml"
        # JSON is YAML: no YAML library needed to write it. ``text``: a YAML file as is.
        self.config_path.write_text(text or json.dumps(config, indent=2))
        self.url = f"http://127.0.0.1:{self.port}"
        self.keys: list[str] = list(top.get("apiKeys", []))
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "llama-swap.log"
        self._log: Any = None

    def start(self, events: Events) -> LlamaSwap:
        self.events = events
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [str(binary()), "-config", str(self.config_path), "-listen", f"127.0.0.1:{self.port}"],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        headers = {"authorization": f"Bearer {self.keys[0]}"} if self.keys else {}
        deadline = time.monotonic() + 15
        while True:
            if self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"llama-swap exited at start:\n{self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/running", headers=headers, timeout=1).status_code == 200:
                    return self
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"llama-swap did not answer in 15 s:\n{self.tail()}")
            time.sleep(0.05)

    def tail(self) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])
        return ""

    def stop(self) -> None:
        """Stop llama-swap (it stops its models), then any stand-in still alive, by id."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None
        events = getattr(self, "events", None)
        if events is not None:
            _kill_left(events.pids(), str(events.path))


def _kill_left(pids: Iterable[int], mark: str) -> None:
    """Kill the stand-ins still alive: only processes whose command line names ``mark``."""
    for pid in pids:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # gone
        if mark.encode() in cmdline and str(STANDIN).encode() in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
