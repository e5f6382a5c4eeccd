"""Requests the gateway closed early but the upstream may still run: they keep the GPU busy.

Theory of operation
-------------------
Closing a request's upstream connection (its client left, it read too slowly, the upstream sent
nothing in time) stops llama-server behind llama-swap, but image servers (A1111, ComfyUI) and
many others finish the job anyway. Freeing the slot at once would run the next job beside it.

So a gated request that was sent upstream and ended before its response did *lingers*
(unless its upstream is configured ``aborts = true``): :class:`Lingering` keeps its turn (the
job stays held, the slot stays taken) in a background task that polls the upstream's idle
report every ``health_seconds`` and releases the turn when

* a report fetched after the request ended says the upstream runs no more jobs than the
  gateway's other requests there (:func:`busy_count`; the oldest lingering request is
  released first when several linger on one upstream),
* the report cannot say (an unknown shape, a 4xx: the upstream has no such endpoint),
* or ``busy_timeout`` seconds have passed (logged).

A report that fails with a connection error or a 5xx keeps it waiting (the upstream may be
restarting or flapping). The lease stays the hard bound on the queue: a lingering job whose
lease runs out is expired by the dispatcher like any other. A request cut by its lease on
the single upstream lingers without a turn (the dispatcher already gave the GPU to the next
job): the next request waits in :meth:`Lingering.settled` before it is forwarded. (Over
several upstreams the fleet gate counts such a job itself.) Shutting down releases every
lingering turn.

Costs: nothing for a request that ends normally; one GET per ``health_seconds`` per lingering
request otherwise.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from prioqueue.clock import loop_time

if TYPE_CHECKING:
    from prioqueue.gateway._host import Host as Gateway
    from prioqueue.gateway._host import Upstream
    from prioqueue.turn import Turn

ExcInfo = tuple[type[BaseException] | None, BaseException | None, TracebackType | None]

__all__ = ["Lingering", "busy_count", "idle_url"]

log = logging.getLogger("prioqueue.gateway")

_BUSY_STATES = frozenset({"starting", "stopping", "loading"})


def busy_count(report: Any) -> int | None:
    """Return how many jobs an upstream's activity report says it runs, or None if it cannot say.

    Understood (O(entries)):

    * llama-swap's ``/running``, ``{"running": [{"model", "state", ...}]}``: the sum of the
      entries' ``inflight`` counts when given (the fake upstream gives them), else the entries
      that are ``starting`` or ``stopping`` (a load in progress); None when neither is there
      (plain llama-swap does not report requests in flight).
    * A1111's ``/sdapi/v1/progress``, ``{"state": {"job_count": N, ...}}``: 1 while
      ``job_count`` > 0 (or a ``job`` is named), else 0.
    * ComfyUI's ``/queue``, ``{"queue_running": [...], "queue_pending": [...]}``: their
      lengths together; its ``/prompt``, ``{"exec_info": {"queue_remaining": N}}``: N.
    """
    if not isinstance(report, dict):
        return None
    running = report.get("running")
    if isinstance(running, list):
        entries = [e for e in running if isinstance(e, dict)]
        counts = [int(e["inflight"]) for e in entries if _count(e.get("inflight"))]
        if counts:
            return sum(counts)
        loading = sum(1 for e in entries if e.get("state") in _BUSY_STATES)
        return loading or None
    state = report.get("state")
    if isinstance(state, dict) and ("job_count" in state or "job" in state):
        jobs: Any = state.get("job_count")
        return 1 if (_count(jobs) and jobs > 0) or state.get("job") else 0
    if "queue_running" in report or "queue_pending" in report:
        queued = [report.get("queue_running"), report.get("queue_pending")]
        return sum(len(q) for q in queued if isinstance(q, list))
    info = report.get("exec_info")
    if isinstance(info, dict) and _count(info.get("queue_remaining")):
        return int(info["queue_remaining"])
    return None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def idle_url(base: str, idle_path: str) -> str:
    """The URL of an idle report: ``idle_path`` itself when it is a URL, else under ``base``."""
    if idle_path.startswith(("http://", "https://")):
        return idle_path
    return base + idle_path


class _Unreachable(Exception):
    """The report could not be fetched (connection error, 5xx): keep waiting."""


async def fetch_busy(
    gateway: Gateway, url: str, headers: dict[str, str] | None = None
) -> int | None:
    """GET an idle report (``headers``: the upstream's key); read it with :func:`busy_count`.

    Raises:
        _Unreachable: A connection error, a time-out or a 5xx (the upstream cannot answer now).
    """
    client = gateway.client
    if client is None:
        return None
    import aiohttp

    total = gateway.config.limits.connect_timeout + gateway.config.health_seconds
    try:
        async with client.get(
            url,
            allow_redirects=False,
            timeout=aiohttp.ClientTimeout(total=total),
            headers=headers or {},
        ) as response:
            if response.status >= 500:
                raise _Unreachable(f"{url} answered {response.status}")
            if response.status >= 400:
                return None
            body = await response.read()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise _Unreachable(str(exc) or type(exc).__name__) from None
    try:
        return busy_count(json.loads(body))
    except ValueError:
        return None


class Lingering:
    """The gateway's lingering requests (see the module notes).

    Args:
        gateway: The gateway (its client, configuration and gate).
    """

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.tasks: set[asyncio.Task[None]] = set()
        self.by_upstream: dict[str, list[object]] = {}
        self._settled: dict[str, asyncio.Event] = {}

    def count(self, upstream: str) -> int:
        """Requests lingering on an upstream (``""``: the single upstream). O(1)."""
        return len(self.by_upstream.get(upstream, ()))

    async def settled(self, upstream: str) -> None:
        """Wait until nothing lingers on an upstream (returns at once when nothing does)."""
        while self.count(upstream):
            event = self._settled.setdefault(upstream, asyncio.Event())
            await event.wait()

    def keep(self, turn: Turn | None, upstream: Upstream | None, exc_info: ExcInfo) -> bool:
        """Keep a turn closed early until its upstream is idle; False when it aborts.

        With ``turn`` None (a request cut by its lease) nothing is held: the upstream only
        counts as busy for the next request on it (:meth:`settled`).
        """
        gateway = self.gateway
        config = gateway.config
        if upstream is None:
            aborts, timeout, path = config.aborts, config.busy_timeout, config.idle_path
            base, name = config.upstream, ""
            headers = config.poll_headers()
        else:
            own = upstream.config
            aborts, timeout, path = own.aborts, own.busy_timeout, own.idle_path
            base, name = upstream.origin + upstream.path, upstream.name
            headers = config.poll_headers(own)
        if aborts:
            return False
        self.hold(
            None if turn is None else turn.__aexit__,
            exc_info,
            upstream=name,
            url=idle_url(base, path or config.resident_path),
            timeout=timeout,
            ours=lambda: 0 if turn is None else gateway.gate.holding(name),
            job_id="(cut by its lease)" if turn is None else turn.job_id,
            headers=headers,
        )
        return True

    def hold(
        self,
        exit: Callable[..., Any] | None,
        exc_info: tuple[type[BaseException] | None, BaseException | None, TracebackType | None],
        *,
        upstream: str,
        url: str,
        timeout: float,
        ours: Callable[[], int],
        job_id: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Keep a turn until its upstream is idle, then call ``exit(*exc_info)``.

        Args:
            exit: The turn's ``__aexit__``, or None for a request that holds no turn any more
                (cut by its lease): it only delays :meth:`settled`.
            exc_info: What ended the request (passed to ``exit``).
            upstream: The upstream's name (``""`` for the single upstream).
            url: Its idle report.
            timeout: ``busy_timeout`` (seconds).
            ours: How many of the gateway's requests the upstream holds now (this one too).
            job_id: For the log.
            headers: Sent with each poll of the report (the upstream's key).
        """
        token = object()
        self.by_upstream.setdefault(upstream, []).append(token)
        task = asyncio.get_running_loop().create_task(
            self._run(exit, exc_info, upstream, (url, headers or {}), timeout, ours, job_id, token)
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _run(
        self,
        exit: Callable[..., Any] | None,
        exc_info: tuple[Any, Any, Any],
        upstream: str,
        report: tuple[str, dict[str, str]],
        timeout: float,
        ours: Callable[[], int],
        job_id: str,
        token: object,
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop_time(loop) + timeout
        interval = self.gateway.config.health_seconds
        why = "timeout"
        try:
            while loop_time(loop) < deadline:
                await asyncio.sleep(min(interval, max(0.0, deadline - loop_time(loop))))
                mine = self.by_upstream.get(upstream, [])
                before = self._others(ours(), mine)
                try:
                    busy = await fetch_busy(self.gateway, *report)
                except _Unreachable:
                    continue
                mine = self.by_upstream.get(upstream, [])
                others = max(before, self._others(ours(), mine))
                if busy is None:
                    why = "cannot say"
                    break
                if busy <= others + mine.index(token):
                    why = "idle"
                    break
            if why == "timeout":
                log.warning(
                    "job %s: upstream %s still reports work %g s after the request was closed; "
                    "counting it idle (busy_timeout)",
                    job_id,
                    upstream or self.gateway.config.upstream,
                    timeout,
                )
        finally:
            entries = self.by_upstream.get(upstream, [])
            if token in entries:
                entries.remove(token)
            if not entries:
                self.by_upstream.pop(upstream, None)
                event = self._settled.pop(upstream, None)
                if event is not None:
                    event.set()
            if exit is not None:
                await exit(*exc_info)

    @staticmethod
    def _others(held: int, lingering: list[object]) -> int:
        return max(0, held - len(lingering))

    async def aclose(self) -> None:
        """Release every lingering turn now (shutdown)."""
        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception as exc:  # a release that failed must not stop the shutdown
                log.warning("releasing a lingering request failed: %s", exc)
