"""Long-poll for the broker: a pop or a job read that waits for a change, not a timer.

Theory of operation (the invariants are in docs/design/long-poll.md):

* :class:`Changes` (``_changes``) wakes only the waiters a change concerns: a job waiter
  when its job finishes, a pop waiter when a job it could take became takeable (one waiter
  per job, handed on) or its own worker's job ended. The engine notes what each operation
  changed as it applies it, not at commit, so a waiting worker's grant joins the submit's
  group commit; the grant is still answered only once it is durable. A waiter is filed
  *before* it looks at the state, so a change between its look and its wait still wakes it.
* :func:`long_pop` tries the engine's ``try_pop``, which is journaled only when it grants a
  job, joins or updates a worker, or refreshes a worker's liveness (at most once per
  ``worker_timeout / 2``); a pop that finds nothing writes nothing. While it waits, the only
  timer is that liveness deadline, and the first waiter to reach it journals one
  ``refresh`` for every waiting worker, so a waiting fleet writes one event per
  ``worker_timeout / 2`` whatever its size. A grant happens inside the journaled operation, so a
  crash between grant and answer is covered by the worker's next heartbeat.
* :func:`wait_job` reads its job's state (committed state only) when it starts and when
  the job finishes, and renders its answer once.
* A pop whose client has gone takes nothing; a grant made as it left is given back at once
  (a journaled ``release``).
* A replica that stops serving wakes its waiters: they answer 503 with the leader's
  address (:class:`~prioqueue.broker.service.Standby`); a stopping broker answers waiting
  pops 503 at once, and waiting job reads with the job as it stands, so a SIGTERM never
  waits for long polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from prioqueue.broker import _workers
from prioqueue.broker._changes import Changes, PopWaiter
from prioqueue.broker.engine import BrokerEngine
from prioqueue.broker.records import FINISHED, JobRecord, Rejected
from prioqueue.broker.service import Broker, Stopping
from prioqueue.clock import loop_time

__all__ = ["MAX_WAIT", "Changes", "long_pop", "wait_job"]

MAX_WAIT = 60.0
"""The longest ``?wait=`` in seconds."""


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _sleep_on(token: asyncio.Future[None], timeout: float) -> None:
    """Sleep until ``token`` resolves or ``timeout`` seconds pass.

    Awaited directly: a wake-up runs the waiter on the next loop turn, in time to join the
    waker's group commit.
    """
    if timeout > 0 and not token.done():
        handle = asyncio.get_running_loop().call_later(timeout, _resolve, token)
        try:
            await token
        finally:
            handle.cancel()


Popped = tuple["JobRecord | None", Mapping[str, int], tuple[JobRecord, ...]]
"""A pop's answer: the granted record (or None), the idle reasons, the siblings granted with it."""


async def long_pop(
    broker: Broker,
    worker: str,
    spec: Mapping[str, Any],
    wait: float,
    gone: Callable[[], Awaitable[object]] | None = None,
    *,
    amount: int = 1,
) -> Popped:
    """Pop for ``worker``, waiting up to ``wait`` seconds for a job it may take.

    Args:
        broker: The broker.
        worker: The worker's name.
        spec: Its settings (``models``, ``resident``, ``slots``, ``slow``).
        wait: Seconds to wait (0: answer at once).
        gone: Returns when the client has gone (its connection closed: the ASGI
            ``http.disconnect``); watched while the pop sleeps. A pop whose client has gone
            wakes, takes nothing and hands its wake-ups on; a grant made as it left is given
            back at once (a journaled ``release``), its siblings too.
        amount: Most jobs to grant: the first, then up to ``amount - 1`` queued jobs of its
            group that fit the worker (``FleetDispatcher.pop_many(siblings=True)``).

    Returns:
        ``(record, {}, siblings)`` for a grant, or ``(None, idle reasons, ())`` when the time
        ran out (``(None, {}, ())`` when the client has gone).

    Raises:
        Standby: The replica does not serve (or stopped serving while waiting), or it is
            stopping (``Stopping``).
        Rejected: The engine refused the settings.

    Complexity: one ``try_pop`` per wake-up that concerns this worker (a job it could take
    became takeable, its own job ended); none for other changes.
    """
    loop = asyncio.get_running_loop()
    end = loop_time(loop) + wait
    args = {"worker": worker, **spec, **({"amount": amount} if amount != 1 else {})}
    changes = broker.changes
    changes.waiting[worker] = changes.waiting.get(worker, 0) + 1
    waiter = PopWaiter(worker, spec.get("models"), spec.get("resident"))
    changes.file(waiter)  # before the first try: a job queued from now on wakes it
    held: list[str | None] = []
    watch = _Watch(changes, waiter, gone)
    try:
        record, idle, siblings = await _long_pop(broker, waiter, args, (loop, end), held, watch)
        if record is not None and watch.task is None and gone is not None:
            # Granted without sleeping: the client may have left during the try (a journaled
            # join or grant can take a while). A gone client's receive answers at once.
            watch.start()
            await asyncio.sleep(0)
        if record is not None and watch.gone:
            for granted in (record, *siblings):
                await _give_back(broker, granted)
            return None, {}, ()
        return record, idle, siblings
    finally:
        watch.stop()
        changes.unfile(waiter)
        # A grant (perhaps of another job) or a departure: what it was woken for goes on.
        changes.hand_on([*held, *waiter.tokens])
        waiter.tokens.clear()
        left = changes.waiting[worker] - 1
        if left:
            changes.waiting[worker] = left
        else:
            del changes.waiting[worker]


class _Watch:
    """Watches a sleeping pop's client: when it goes, the pop wakes and takes nothing."""

    __slots__ = ("changes", "task", "until_gone", "waiter")

    def __init__(
        self,
        changes: Changes,
        waiter: PopWaiter,
        until_gone: Callable[[], Awaitable[object]] | None,
    ) -> None:
        self.changes, self.waiter, self.until_gone = changes, waiter, until_gone
        self.task: asyncio.Future[object] | None = None

    @property
    def gone(self) -> bool:
        """Whether the client has gone (known once the pop has slept). O(1)."""
        return self.task is not None and self.task.done() and not self.task.cancelled()

    def start(self) -> None:
        """Watch from now on (before the first sleep; a pop answered at once needs none)."""
        if self.task is None and self.until_gone is not None:
            self.task = asyncio.ensure_future(self.until_gone())
            self.task.add_done_callback(self._left)

    def _left(self, task: asyncio.Future[object]) -> None:
        if not task.cancelled():
            task.exception()  # retrieved: a failed receive means gone too
            self.changes.nudge(self.waiter)

    def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()


async def _give_back(broker: Broker, record: JobRecord) -> None:
    """The client left while its grant was made: the job goes back now, journaled."""
    assert record.worker is not None
    args = {"job_id": record.id, "worker": record.worker, "attempt": record.attempt}
    with contextlib.suppress(Rejected):  # already taken back (a tick, a leave): nothing to do
        await broker.run("release", args)


def _liveness_due(broker: Broker, worker: str) -> bool:
    engine = broker.engine
    if engine is None:
        return False
    due = engine.liveness_due(worker)
    return due is not None and broker.now() >= due


async def _refresh(broker: Broker, worker: str) -> None:
    """Journal the liveness of every waiting worker in one event (one refresh at a time)."""
    await broker.changes.refresh(
        worker, lambda workers: broker.run("refresh", {"workers": workers})
    )


def _settle(
    broker: Broker, engine: BrokerEngine, waiter: PopWaiter, held: list[str | None]
) -> None:
    """The waiter's pop found nothing: decide what becomes of the wake-ups it held.

    A worker whose slots are full could take nothing whatever the job: the wake-ups go on to
    other waiters. Otherwise the job is not takeable by any waiter it was offered to (it was
    taken, or its member is at its cap, or it is delayed: news that the engine notes when it
    changes), so the wake-up is dropped, except for the warm hold, which lapses with time:
    then the job is offered again when the hold must have lapsed.
    """
    changes = broker.changes
    if _workers.slots_full(engine, waiter.worker):
        changes.unfile(waiter, worker_too=False)  # not back to itself: to another waiter
        changes.hand_on(held)
        changes.file(waiter, full=True)  # its worker's news wakes it
    else:
        changes.drop(len(held))
        hold = engine.config.warm_hold_seconds
        if hold > 0:
            loop = asyncio.get_running_loop()
            for model in held:
                loop.call_later(hold, changes.offer, model)
    held.clear()


async def _long_pop(
    broker: Broker,
    waiter: PopWaiter,
    args: Mapping[str, Any],
    until: tuple[asyncio.AbstractEventLoop, float],
    held: list[str | None],
    watch: _Watch,
) -> Popped:
    changes = broker.changes
    worker = waiter.worker
    loop, end = until
    woken = False  # the first try joins or refreshes the worker itself if it must
    while True:
        waiter.take_tokens(held)
        engine = broker.engine
        if engine is not None:  # filed while it tries: news during the try is not lost
            changes.file(waiter, full=_workers.slots_full(engine, worker))
        if watch.gone:
            return None, {}, ()  # nobody to answer: take nothing (its wake-ups go on)
        if woken and _liveness_due(broker, worker):
            await _refresh(broker, worker)  # one event for the fleet, not a pop each
        woken = True
        result = await broker.run("try_pop", args)
        if result is not None and result.record is not None:
            return result.record, {}, result.siblings
        while not (waiter.tokens or waiter.nudged):  # else: news came during the try
            engine = broker.engine
            if engine is None:
                break  # stepped down: try_pop raises Standby with the leader
            if held:
                _settle(broker, engine, waiter, held)
            left = end - loop_time(loop)
            if left <= 0:
                return None, await _idle(broker, worker, result), ()
            if changes.draining:
                raise Stopping()
            due = engine.liveness_due(worker)
            if _liveness_due(broker, worker):
                await _refresh(broker, worker)
                continue
            timeout = left if due is None else min(left, due - broker.now() + 0.001)
            changes.file(waiter, full=_workers.slots_full(engine, worker))
            watch.start()
            future = waiter.sleep(loop)
            try:
                await _sleep_on(future, timeout)
            finally:
                waiter.woke()
            result = None  # its idle reasons are stale now


async def _idle(broker: Broker, worker: str, result: Any) -> Mapping[str, int]:
    if result is not None:
        idle: Mapping[str, int] = result.idle
        return idle

    def read(engine: BrokerEngine) -> Mapping[str, int]:
        try:
            # At the engine's time: a read must not move the fleet's clock past the engine's
            # (later reads, explain() for one, pass the engine's time).
            reasons = engine.fleet.idle_reasons(worker, now=engine.now)
        except Exception:  # the worker left meanwhile: nothing to say
            return {}
        return {str(k): int(v) for k, v in reasons.items() if v}

    return await broker.query(read)


_T = TypeVar("_T")


async def wait_job(
    broker: Broker,
    job_id: str,
    member: str | None,
    wait: float,
    render: Callable[[BrokerEngine, JobRecord], _T],
) -> _T:
    """Read a job, waiting up to ``wait`` seconds for it to finish.

    Each read runs inside ``broker.query`` (no barrier: writers never wait for it, and the
    answer is released once what it saw is committed).

    Args:
        broker: The broker.
        job_id: The job.
        member: Whose job it must be (None: anyone's).
        wait: Seconds to wait (0: answer at once).
        render: Turns the engine and the job's record into the answer (run in the query).

    Returns:
        What ``render`` made of the job, finished or as it stands when the time ran out or
        the broker began to stop.

    Raises:
        Standby: The replica does not serve (or stopped serving while waiting).
        Rejected: 404 no such job of this member.
    """
    loop = asyncio.get_running_loop()
    end = loop_time(loop) + wait
    changes = broker.changes

    def read(final: bool, engine: BrokerEngine) -> tuple[bool, _T | None]:
        record = engine.owned(job_id, member)
        if final or record.state in FINISHED:
            return True, render(engine, record)
        return False, None  # not rendered: a waiter's answer is built once

    while True:
        future = changes.watch_job(job_id)  # before the read: its end wakes this waiter
        try:
            final = changes.draining or end - loop_time(loop) <= 0
            done, answer = await broker.query(functools.partial(read, final))
            if done:
                return answer  # type: ignore[return-value]  # rendered when done
            await _sleep_on(future, end - loop_time(loop))
        finally:
            changes.unwatch_job(job_id, future)
