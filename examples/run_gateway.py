"""Start the gateway in front of a fake llama-swap and send it a few prioritised requests.

What it does, in order:

1. starts ``FakeLlamaSwap`` (``prioqueue.gateway.fake_upstream``: a real HTTP server speaking
   enough of the OpenAI API and of llama-swap's) on a free loopback port, in this process;
2. starts the gateway exactly as you would, as a separate process:
   ``prioqueue gateway --config examples/gateway.toml --upstream URL --listen 127.0.0.1:PORT``;
3. occupies the GPU with one long batch request (the fake holds it until released), queues
   batch, normal and interactive requests behind it with the API keys of the configuration,
   and prints ``GET /prioqueue/status`` while they wait;
4. releases the GPU and prints the order the upstream served them in, the priority each ran at
   (after its key's ceiling) and its queue wait, then ``GET /prioqueue/jobs/{id}`` for one of
   them and a few lines of ``GET /metrics``;
5. stops the gateway with SIGTERM (it exits 0 after a graceful shutdown).

Needs the gateway extra and nothing else (its HTTP client is the gateway's own, aiohttp):
from a clone, ``pip install '.[gateway,prometheus]'`` (``[prometheus]`` only for
``/metrics``). Run it: ``python examples/run_gateway.py [--config FILE]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import attrs

from prioqueue import HEADER
from prioqueue.gateway import GatewayConfig, load_config
from prioqueue.gateway.fake_upstream import FakeLlamaSwap, ServerThread

DEFAULT_CONFIG = Path(__file__).with_name("gateway.toml")
ENDPOINT = "/v1/chat/completions"


def free_port() -> int:
    """Return a loopback port that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def gateway_process(config: Path, upstream: str) -> Iterator[str]:
    """Run ``prioqueue gateway`` in a child process; yield its base URL; stop it with SIGTERM."""
    listen = f"127.0.0.1:{free_port()}"
    command = [
        sys.executable, "-m", "prioqueue.cli", "gateway", "--config", str(config),
        "--upstream", upstream, "--listen", listen, "--log-level", "warning", "--no-access-log",
    ]  # fmt: skip
    print(f"$ prioqueue gateway --config {config.name} --upstream {upstream} --listen {listen}")
    sys.stdout.flush()  # before the child writes to the same terminal
    process = subprocess.Popen(command)
    url = f"http://{listen}"
    host, _, port = listen.rpartition(":")
    try:
        deadline = time.monotonic() + 30.0
        while True:  # wait until it accepts connections
            if process.poll() is not None:
                raise RuntimeError(f"the gateway exited with status {process.returncode}")
            try:
                socket.create_connection((host, int(port)), timeout=1.0).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("the gateway did not start in 30 s") from None
                time.sleep(0.05)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=30.0)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        print(f"\ngateway stopped with exit status {code}")
        if code != 0:
            raise RuntimeError(f"the gateway exited with status {code}")


def callers(config: GatewayConfig) -> list[tuple[str, str, str | None]]:
    """Pick (label, priority asked for, API key) for each request, from the configuration."""
    keys = sorted(config.keys.items(), key=lambda item: -item[1].max_priority)
    if not keys and not config.allow_anonymous:
        raise SystemExit("the configuration has no API keys and refuses anonymous callers")

    def key(index: int) -> str | None:
        return keys[index % len(keys)][0] if keys else None

    # The most trusted key asks for interactive; the others for normal and batch. The last
    # key also *asks* for interactive, to show its ceiling capping the header.
    return [
        ("film-shot-2", "batch", key(len(keys) - 1)),
        ("tool-call", "normal", key(1)),
        ("portrait", "interactive", key(0)),
        ("greedy", "interactive", key(len(keys) - 1)),
    ]


@attrs.frozen
class Answer:
    """What the example keeps of a response."""

    status: int
    headers: dict[str, str]
    text: str

    def json(self) -> Any:
        return json.loads(self.text)


async def get(client: aiohttp.ClientSession, path: str) -> Answer:
    async with client.get(path) as response:
        headers = {k.lower(): v for k, v in response.headers.items()}
        return Answer(response.status, headers, await response.text())


async def send(
    client: aiohttp.ClientSession,
    label: str,
    priority: str,
    key: str | None,
    hold: str | None = None,
) -> Answer:
    """POST a chat completion; the fake upstream records ``tag`` and waits at ``hold``."""
    headers = {HEADER: priority}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    fake: dict[str, Any] = {"tag": label, "seconds": 0.05}
    if hold is not None:
        fake["hold"] = hold
    body = {"model": "model-a", "messages": [{"role": "user", "content": label}], "fake": fake}
    async with client.post(ENDPOINT, json=body, headers=headers) as response:
        headers = {k.lower(): v for k, v in response.headers.items()}
        return Answer(response.status, headers, await response.text())


async def wait_until(client: aiohttp.ClientSession, what: str, test: Any) -> dict[str, Any]:
    """Poll ``/prioqueue/status`` until ``test(status)`` is true."""
    for _ in range(600):
        status: dict[str, Any] = (await get(client, "/prioqueue/status")).json()
        if test(status):
            return status
        await asyncio.sleep(0.01)
    raise RuntimeError(f"timed out waiting for {what}")


async def drive(url: str, config: GatewayConfig, fake: FakeLlamaSwap) -> None:
    """Send the requests and print what happened."""
    plan = callers(config)
    first_key = plan[0][2]
    # The status endpoints need an identity too, one that sees every member's jobs: an
    # observer (or admin) key when the configuration has one.
    observers = [key for key, entry in config.keys.items() if entry.observer]
    reader_key = observers[0] if observers else plan[2][2]
    reader = {} if reader_key is None else {"Authorization": f"Bearer {reader_key}"}
    timeout = aiohttp.ClientTimeout(total=30.0)
    async with aiohttp.ClientSession(url, timeout=timeout, headers=reader) as client:
        long_job = asyncio.create_task(send(client, "film-shot-1", "batch", first_key, "gpu"))
        await wait_until(client, "the first job to run", lambda s: s["running"] is not None)
        print("\nfilm-shot-1 holds the GPU; queueing four more requests behind it")
        tasks = []
        for label, priority, key in plan:
            tasks.append(asyncio.create_task(send(client, label, priority, key)))
            await asyncio.sleep(0.02)  # distinct arrival times, in this order
        status = await wait_until(client, "four queued jobs", lambda s: s["queued"] == len(plan))
        print("GET /prioqueue/status while they wait:")
        for level, info in status["levels"].items():
            for job in info["jobs"]:
                print(
                    f"  level {level:>4}  position {job['position']}  member "
                    f"{job['member']:<10} score {job['score']:8.3f}"
                )

        fake.release("gpu")
        responses = [await long_job, *[await task for task in tasks]]
        for response in responses:
            assert response.status == 200, response.text

        print("\nserved by the upstream in this order:")
        by_tag = {label: (priority, response) for (label, priority, _), response in
                  zip([("film-shot-1", "batch", first_key), *plan], responses)}  # fmt: skip
        for tag in fake.order():
            asked, response = by_tag[str(tag)]
            ran_at = response.headers["x-prioqueue-priority"]
            waited = float(response.headers["x-prioqueue-queue-wait"])
            print(f"  {tag:<12} asked {asked:<12} ran at {ran_at:>4}  queued {waited:.2f} s")
        assert fake.max_active == 1, "the gateway let two requests through at once"
        levels = [int(by_tag[str(tag)][1].headers["x-prioqueue-priority"]) for tag in fake.order()]
        assert levels[1] == max(levels), "the best request after the long job should go first"

        job_id = responses[3].headers["x-prioqueue-job"]
        explained = (await get(client, f"/prioqueue/jobs/{job_id}")).json()
        print(f"\nGET /prioqueue/jobs/{job_id[:8]}... (the portrait), some of its fields:")
        for field in ("member", "tier", "priority", "outcome", "score"):
            print(f"  {field}: {json.dumps(explained.get(field))}")

        metrics = await get(client, "/metrics")
        if metrics.status == 200:
            print("\nGET /metrics (dispatches per level):")
            for line in metrics.text.splitlines():
                if line.startswith("prioqueue_dispatched_total"):
                    print("  " + line)


def main() -> None:
    """Start the fake upstream and the gateway, drive them, stop them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="gateway TOML")
    args = parser.parse_args()
    fake = FakeLlamaSwap()
    with ServerThread(fake) as upstream:
        config = load_config(args.config, upstream=upstream.url)
        with gateway_process(args.config, upstream.url) as url:
            asyncio.run(drive(url, config, fake))


if __name__ == "__main__":
    main()
