"""The dashboard's endpoint: ``GET /v1/dashboard`` with 10,000 queued jobs and 100 workers.

Run: ``python benchmarks/bench_dashboard.py``. The broker app runs in this process (memory
store, httpx over ASGI, so no socket time is counted); its engine is filled directly with
10,000 queued jobs of 40 members on 3 levels (20 films of 100 frames among them) and 100
workers, each running one job and prefetching another (slots = 2).

Figures, each the median of many calls, printed beside baselines measured in the same run:

* ``GET /v1/dashboard`` as an observer (everything) and as a plain submitter; goal (issue 19):
  under 20 ms each. The groups' finish forecast (a dry run of up to 1,000 grants) is reused
  for 10 s, so most polls do not compute it: "new forecast" is the poll that does.
* The same endpoint on a broker with 100 queued jobs (same members, workers and films): the
  ratio shows whether the cost grows with the queue (it should not: the dashboard's work is
  O(levels + lanes + workers + groups) plus fixed bounds).
* ``GET /v1/status`` on the 10,000-job broker (the existing status endpoint, O(jobs)) and
  ``GET /ui/app.css`` (a static file: the HTTP stack's floor).
* The gateway's ``/prioqueue/dashboard`` does the same reads (:mod:`prioqueue.ui.model`) on
  its own dispatcher: they are timed here on a bare ``FleetDispatcher`` in the same state (no
  HTTP), with the forecast recomputed on every call, beside one ``stats()`` call.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from _harness import section

from prioqueue.broker import MemoryJournal, create_app, parse_config
from prioqueue.fleet import FleetDispatcher
from prioqueue.ui import model as _model

MEMBERS = 40
WORKERS = 100
FILMS = 20
FRAMES = 100
MODELS = ("sdxl", "flux", "wan", "sd15")
KEYS: dict[str, dict[str, Any]] = {
    "sk-ops": {"role": "submitter", "member": "ops", "observer": True},
    "sk-m1": {"role": "submitter", "member": "m1"},
    "wk": {"role": "worker", "workers_prefix": "gpu-"},
}
OPS = {"Authorization": "Bearer sk-ops"}
M1 = {"Authorization": "Bearer sk-m1"}


class _Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def _fill(engine: Any, queued: int, clock: _Clock) -> None:
    """Submit ``queued`` jobs plus two per worker, then let every worker take two."""
    total = queued + 2 * WORKERS
    film_jobs = FILMS * FRAMES if queued >= FILMS * FRAMES else 0
    for n in range(total):
        clock.t += 0.001
        member = f"m{n % MEMBERS}"
        group = f"film-{n % FILMS}" if n < film_jobs else None
        engine.apply(
            "submit",
            {
                "member": member, "tier": "free", "priority": (0, 0, 5, 10)[(n // MEMBERS) % 4],
                "model": MODELS[n % len(MODELS)], "estimate": 30.0, "group": group,
                "image": None, "payload": None, "idempotency_key": None,
            },
            clock.t,
        )  # fmt: skip
    for w in range(WORKERS):
        for _ in range(2):
            clock.t += 0.001
            args = {"worker": f"gpu-{w:03d}", "models": None, "resident": None, "slots": 2}
            engine.apply("pop", {**args, "slow": False}, clock.t)


async def _median(call: Callable[[], Awaitable[httpx.Response]], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        response = await call()
        times.append(time.perf_counter() - t0)
        assert response.status_code == 200, response.text
    return statistics.median(times)


async def _broker(queued: int) -> tuple[Any, Any, httpx.AsyncClient, Any]:
    clock = _Clock()
    config = parse_config({"store": "memory://", "keys": KEYS})
    app = create_app(config, MemoryJournal(clock))
    lifespan = app.router.lifespan_context(app)
    await lifespan.__aenter__()
    _fill(await app.state.broker.read(), queued, clock)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://b")
    return app, lifespan, client, clock


async def main() -> None:
    section("GET /v1/dashboard (broker in process, httpx over ASGI; median of 50 calls)")
    big = await _broker(10_000)
    small = await _broker(100)
    try:
        _, _, client, _ = big
        _, _, little, _ = small
        queued = (await client.get("/v1/dashboard", headers=OPS)).json()
        print(
            f"state: {queued['queued']} queued, {queued['running']} running, "
            f"{len(queued['workers'])} workers, {len(queued['lanes'])} lanes, "
            f"{len(queued['groups'])} groups listed"
        )
        for _ in range(5):  # warm up (imports, caches)
            await client.get("/v1/dashboard", headers=OPS)
            await little.get("/v1/dashboard", headers=OPS)
        app = big[0]

        async def uncached() -> httpx.Response:
            app.state.dashboard_forecast = None  # the poll that recomputes the forecast
            return await client.get("/v1/dashboard", headers=OPS)

        figures = {"dashboard, observer, 10k, new forecast": await _median(uncached, 30)}
        rows = [
            ("dashboard, observer, 10k queued", client, "/v1/dashboard", OPS),
            ("dashboard, submitter, 10k queued", client, "/v1/dashboard", M1),
            ("dashboard, observer, 100 queued", little, "/v1/dashboard", OPS),
            ("status (O(jobs)), 10k queued", client, "/v1/status", OPS),
            ("static app.css", client, "/ui/app.css", OPS),
        ]
        for name, c, path, headers in rows:

            def call(
                c: httpx.AsyncClient = c, path: str = path, h: dict[str, str] = headers
            ) -> Any:
                return c.get(path, headers=h)

            figures[name] = await _median(call, 50)
        base = figures["dashboard, observer, 100 queued"]
        for name, seconds in figures.items():
            goal = "  (goal < 20 ms)" if name.startswith("dashboard") and "10k" in name else ""
            label = name.replace("dashboard, ", "")
            print(
                f"{label:<36} {seconds * 1e3:8.2f} ms   vs dashboard at 100 queued "
                f"{base * 1e3:6.2f} ms   ratio {seconds / base:5.2f}x{goal}"
            )
        observer = figures["dashboard, observer, 10k queued"]
        print(
            f"dashboard vs status at 10k queued: ratio "
            f"{observer / figures['status (O(jobs)), 10k queued']:.2f}x; "
            f"vs a static file: {observer / figures['static app.css']:.1f}x"
        )
    finally:
        for _, lifespan, c, _ in (big, small):
            await c.aclose()
            await lifespan.__aexit__(None, None, None)


def bare_fleet() -> None:
    """The shared reads on a bare dispatcher (the gateway's path, without HTTP)."""
    import json

    section("The dashboard's reads on a bare FleetDispatcher (gateway path; median of 30)")
    d = FleetDispatcher(lease_for=lambda job: 900.0)
    t = 1000.0
    for n in range(10_000 + 2 * WORKERS):
        t += 0.001
        d.submit(
            f"j{n}", member=f"m{n % MEMBERS}", priority=(0, 0, 5, 10)[(n // MEMBERS) % 4],
            model=MODELS[n % len(MODELS)], estimate=30.0,
            group=f"{len('m0')}:m{n % MEMBERS}/film-{n % FILMS}" if n < FILMS * FRAMES else None,
            now=t,
        )  # fmt: skip
    for w in range(WORKERS):
        d.join(f"gpu-{w:03d}", slots=2, now=t)
        d.pop(f"gpu-{w:03d}", now=t)
        d.pop(f"gpu-{w:03d}", now=t)
    recent = _model.Recent()

    def everything() -> None:
        stats = d.stats(now=t)
        history = _model.history(d, t)
        data = {
            "levels": recent.levels(stats, t),
            "lanes": _model.lanes(d, t, lambda m: True, history),
            "workers": _model.workers(d, t, lambda m: True, history),
            "groups": _model.groups(d, t, t, lambda m: True),
        }
        json.dumps(data)

    def stats_only() -> None:
        d.stats(now=t)

    def median(fn: Callable[[], None]) -> float:
        times = []
        for _ in range(30):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    everything()
    reads, base = median(everything), median(stats_only)
    print(
        f"{'all reads + JSON, forecast each time':<36} {reads * 1e3:8.2f} ms   vs stats() "
        f"{base * 1e3:6.2f} ms   ratio {reads / base:5.1f}x  (goal < 20 ms)"
    )


if __name__ == "__main__":
    asyncio.run(main())
    bare_fleet()
