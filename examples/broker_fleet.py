"""The real broker with a fleet of workers, on ``prioqueue.client``: journaled in SQLite.

It writes a ``broker.toml`` in a temporary directory and starts ``prioqueue broker`` as a
subprocess on a free loopback port. Then, as a deployment would:

* a studio submits a 12-shot film at ``batch`` priority as one batch (all or none);
* 3 GPU workers (``Worker.run``; one ``slow``, so its leases are 3x) long-poll for jobs,
  "render" them and return a result; heartbeats run while they render;
* alice submits 4 ``interactive`` images while the film renders and waits for them.

Halfway through, the broker is SIGKILLed and restarted on the same store: the clients retry
(backoff with jitter), nothing acknowledged is lost, no job is rendered twice, every job ends
done. Run it: ``python examples/broker_fleet.py`` (needs the ``broker`` and ``client`` extras).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from prioqueue.client import Broker, Job, Worker

SHOT = {"width": 1024, "height": 576, "steps": 30, "sampler": "k_euler"}
PICTURE = {"width": 512, "height": 512, "steps": 20, "sampler": "k_euler_a"}
CONFIG = """listen = "127.0.0.1:{port}"
store = "sqlite:{directory}/broker.db"
[keys."sk-studio"]
role = "submitter"
member = "studio"
tier = "pro"
[keys."sk-alice"]
role = "submitter"
member = "alice"
max_priority = 100
[keys."wk-fleet"]
role = "worker"
workers_prefix = "gpu-"
"""
MAIN = "import sys; from prioqueue.cli import main; sys.exit(main(sys.argv[1:]))"


def start_broker(config: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-c", MAIN, "broker", "--config", str(config)]
    return subprocess.Popen([*command, "--log-level", "warning", "--no-access-log"])


def main() -> None:
    rendered: collections.Counter[str] = collections.Counter()
    started: list[str] = []

    def render(job: Job) -> dict[str, str]:
        started.append(f"{job.id:>6} lease {job.lease_seconds:>5.0f} s  {job.payload}")
        time.sleep(0.05)
        job.check()  # taken back meanwhile? then no side effect
        rendered[job.id] += 1
        return {"image": f"{job.id}.png"}

    with tempfile.TemporaryDirectory() as tmp:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        config = Path(tmp) / "broker.toml"
        config.write_text(CONFIG.format(port=port, directory=tmp), encoding="utf-8")
        url = f"http://127.0.0.1:{port}"
        broker = start_broker(config)
        fleet = [
            Worker(url, "wk-fleet", name, slow=slow, wait=2, handle_signals=False)
            for name, slow in (("gpu-a", False), ("gpu-b", False), ("gpu-old", True))
        ]
        threads = [threading.Thread(target=w.run, args=(render,)) for w in fleet]
        try:
            with Broker(url, "sk-studio") as studio, Broker(url, "sk-alice") as alice:
                film = [{"priority": "batch", "group": "film-1", "image": SHOT,
                         "payload": {"shot": n}} for n in range(12)]  # fmt: skip
                shots = studio.submit_many(film, idempotency_key="film-1")
                for thread in threads:
                    thread.start()
                pictures = [
                    alice.submit({"prompt": n}, priority="interactive", image=PICTURE)
                    for n in range(4)
                ]
                time.sleep(0.2)
                os.kill(broker.pid, signal.SIGKILL)  # mid-run: the journal has what was acked
                broker.wait()
                broker = start_broker(config)
                results = [alice.wait(job, timeout=60) for job in pictures]
                results += [studio.wait(job, timeout=60) for job in shots]
                group = studio.group("film-1")
        finally:
            for w in fleet:
                w.stop()
            for thread in threads:
                thread.join()
            broker.kill()
            broker.wait()
    print("jobs in the order the workers started them (with their lease):")
    for line in started:
        print(f"  {line}")
    print(f"{len(results)} of {len(shots) + len(pictures)} jobs done after a SIGKILL and restart")
    print(f"rendered more than once: {[j for j, n in rendered.items() if n > 1] or 'none'}")
    print(f"group film-1: {json.dumps({k: group[k] for k in ('done', 'failed', 'queued')})}")
    if any(n != 1 for n in rendered.values()) or len(rendered) != 16:
        raise SystemExit(f"a job was not rendered exactly once: {dict(rendered)}")


if __name__ == "__main__":
    main()
