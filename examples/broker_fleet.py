"""The real broker with a fleet of workers: ``prioqueue broker`` over HTTP, journaled in SQLite.

This script writes a ``broker.toml`` in a temporary directory, starts ``prioqueue broker`` as
a subprocess on a free loopback port (state in an SQLite file), and drives it the way a
deployment would:

* a studio submits a 12-shot film at ``batch`` priority, each shot with its image lease inputs;
* alice submits 4 ``interactive`` images while the film renders;
* 3 GPU workers pull jobs (``POST /v1/workers/{id}/pop``), "render" them and report
  ``complete`` with a result; one worker is marked ``slow`` and gets 3x leases.

Halfway through, the broker is SIGKILLed and restarted on the same store: the clients retry,
nothing acknowledged is lost, and the remaining jobs finish. It prints the order in which the
jobs started, each job's lease, and the state of every job at the end.

Run it: ``python examples/broker_fleet.py`` (needs the ``broker`` extra).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

SHOT = {"width": 1024, "height": 576, "steps": 30, "sampler": "k_euler"}
PICTURE = {"width": 512, "height": 512, "steps": 20, "sampler": "k_euler_a"}
KEYS: dict[str, dict[str, Any]] = {
    "sk-studio": {"role": "submitter", "member": "studio", "tier": "pro", "max_priority": 0},
    "sk-alice": {"role": "submitter", "member": "alice", "tier": "free", "max_priority": 100},
    "wk-fleet": {"role": "worker", "workers_prefix": "gpu-"},
}
MAIN = "import sys; from prioqueue.cli import main; sys.exit(main(sys.argv[1:]))"


def call(
    url: str,
    method: str,
    path: str,
    key: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """One request; retries while the broker is down (restarting). Returns (status, JSON)."""
    data = None if body is None else json.dumps(body).encode()
    all_headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    all_headers.update(headers or {})
    for _ in range(400):
        request = urllib.request.Request(url + path, data=data, method=method, headers=all_headers)
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            if exc.code == 503:
                time.sleep(0.05)
                continue
            return exc.code, json.loads(exc.read() or b"null")
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.05)
    raise RuntimeError(f"{method} {path}: the broker did not answer")


class Broker:
    """``prioqueue broker`` as a subprocess."""

    def __init__(self, directory: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = directory / "broker.toml"
        lines = [
            f'listen = "127.0.0.1:{self.port}"',
            f'store = "sqlite:///{directory / "broker.db"}"',
        ]
        for key, entry in KEYS.items():
            lines.append(f'[keys."{key}"]')
            lines.extend(f"{name} = {json.dumps(value)}" for name, value in entry.items())
        self.config.write_text("\n".join(lines) + "\n", encoding="utf-8")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        command = [sys.executable, "-c", MAIN, "broker", "--config", str(self.config)]
        self.proc = subprocess.Popen(
            [*command, "--log-level", "warning", "--no-access-log"], stderr=subprocess.DEVNULL
        )
        status, _ = call(self.url, "GET", "/v1/status", "wk-fleet")
        assert status == 200

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def render(url: str, name: str, job_id: str, attempt: int, seconds: float) -> None:
    time.sleep(seconds)
    body = {"worker": name, "attempt": attempt, "result": {"image": f"{job_id}.png"}}
    call(url, "POST", f"/v1/jobs/{job_id}/complete", "wk-fleet", body)


def worker(url: str, name: str, slow: bool, started: list[str], stop: threading.Event) -> None:
    """Pull, render, complete; until told to stop.

    A pop whose answer was lost (the broker died after journaling it) still holds a job:
    the heartbeat says which, and the worker renders it too.
    """
    seconds = 0.15 if slow else 0.05
    while not stop.is_set():
        status, held = call(url, "POST", f"/v1/workers/{name}/heartbeat", "wk-fleet", {})
        for job in held["jobs"] if status == 200 else []:  # 404 before its first pop
            started.append(f"{job['id']:>6} on {name:<8} (found by its heartbeat)")
            render(url, name, job["id"], job["attempt"], seconds)
        status, grant = call(url, "POST", f"/v1/workers/{name}/pop", "wk-fleet", {"slow": slow})
        if status == 204:
            time.sleep(0.02)
            continue
        started.append(f"{grant['id']:>6} on {name:<8} lease {grant['lease_seconds']:>5.0f} s")
        render(url, name, grant["id"], grant["attempt"], seconds)


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        broker = Broker(Path(tmp))
        broker.start()
        ids: dict[str, str] = {}
        try:
            for shot in range(12):
                body = {
                    "priority": "batch",
                    "group": "film-1",
                    "image": SHOT,
                    "payload": {"shot": shot},
                }
                _, job = call(broker.url, "POST", "/v1/jobs", "sk-studio", body,
                              {"Idempotency-Key": f"film-1-shot-{shot}"})  # fmt: skip
                ids[job["id"]] = "sk-studio"
            started: list[str] = []
            stop = threading.Event()
            fleet = [
                threading.Thread(target=worker, args=(broker.url, name, slow, started, stop))
                for name, slow in (("gpu-a", False), ("gpu-b", False), ("gpu-old", True))
            ]
            for thread in fleet:
                thread.start()
            time.sleep(0.2)
            for n in range(4):
                body = {"priority": "interactive", "image": PICTURE, "payload": {"prompt": n}}
                _, job = call(broker.url, "POST", "/v1/jobs", "sk-alice", body)
                ids[job["id"]] = "sk-alice"
            time.sleep(0.1)
            broker.kill()  # SIGKILL mid-run: the journal has every acknowledged operation
            broker.start()
            deadline = time.monotonic() + 60
            states: dict[str, str] = {}
            while time.monotonic() < deadline:
                states = {
                    j: call(broker.url, "GET", f"/v1/jobs/{j}", k)[1]["state"]
                    for j, k in ids.items()
                }
                if all(s == "done" for s in states.values()):
                    break
                time.sleep(0.1)
            stop.set()
            for thread in fleet:
                thread.join()
            film = call(broker.url, "GET", "/v1/groups/film-1", "sk-studio")[1]
        finally:
            broker.kill()
    print("grants, in the order the workers got them:")
    for line in started:
        print(f"  {line}")
    done = sum(1 for s in states.values() if s == "done")
    print(f"{done} of {len(ids)} acknowledged jobs done after a SIGKILL and a restart")
    print(
        f"group film-1: {film['done']} done, {film['failed']} failed, "
        f"{film['gpu_seconds']:.1f} GPU-s, mean runtime {film['mean_runtime']:.2f} s"
    )
    if done != len(ids):
        raise SystemExit(f"unfinished jobs: {states}")


if __name__ == "__main__":
    main()
