"""Long-poll for the broker: a pop or a job read that waits for a change, not a timer.

Theory of operation (the invariants are in docs/design/long-poll.md):

* :class:`Changes` is one future, fired (and replaced) by the engine as soon as it applied an
  operation (submit, complete, fail, cancel, a tick that took a lease back, a worker
  leaving), and on a change of role (stepping down, stopping). Firing at apply time, not at
  commit, lets a waiting worker's grant join the submit's group commit; the grant is still
  answered only once it is durable (after the submit, which precedes it in the journal).
  A waiter takes the current future *before* it looks at the state, so a change between
  its look and its wait still wakes it: no change is missed and no timer loop runs.
* :func:`long_pop` tries the engine's ``try_pop``, which is journaled only when it grants a
  job, joins or updates a worker, or refreshes a worker's liveness (at most once per
  ``worker_timeout / 2``); a pop that finds nothing writes nothing. While it waits, the only
  timer is that liveness deadline, and the first waiter to reach it journals one
  ``refresh`` for every waiting worker, so a waiting fleet writes one event per
  ``worker_timeout / 2`` whatever its size. A grant happens inside the journaled operation, so a
  crash between grant and answer is covered by the worker's next heartbeat.
* :func:`wait_job` re-reads the job (committed state only) at each change until it is
  finished or the time runs out.
* A replica that stops serving wakes its waiters: they answer 503 with the leader's
  address (:class:`~prioqueue.broker.service.Standby`); a stopping broker answers waiting
  pops 503 at once, and waiting job reads with the job as it stands, so a SIGTERM never
  waits for long polls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from prioqueue.broker._changes import Changes
from prioqueue.broker._records import FINISHED, JobRecord
from prioqueue.broker.engine import BrokerEngine
from prioqueue.broker.service import Broker, Stopping

__all__ = ["MAX_WAIT", "Changes", "long_pop", "wait_job"]

MAX_WAIT = 60.0
"""The longest ``?wait=`` in seconds."""


async def _sleep_on(token: asyncio.Future[None], timeout: float) -> None:
    if timeout > 0 and not token.done():
        await asyncio.wait([token], timeout=timeout)


Popped = tuple["JobRecord | None", Mapping[str, int], tuple[JobRecord, ...]]
"""A pop's answer: the granted record (or None), the idle reasons, the siblings granted with it."""


async def long_pop(
    broker: Broker, worker: str, spec: Mapping[str, Any], wait: float, amount: int = 1
) -> Popped:
    """Pop for ``worker``, waiting up to ``wait`` seconds for a job it may take.

    Args:
        broker: The broker.
        worker: The worker's name.
        spec: Its settings (``models``, ``resident``, ``slots``, ``slow``).
        wait: Seconds to wait (0: answer at once).
        amount: Most jobs to grant: the first, then up to ``amount - 1`` queued jobs of its
            group that fit the worker (``FleetDispatcher.pop_many(siblings=True)``).

    Returns:
        ``(record, {}, siblings)`` for a grant, or ``(None, idle reasons, ())`` when the time
        ran out.

    Raises:
        Standby: The replica does not serve (or stopped serving while waiting), or it is
            stopping (``Stopping``).
        Rejected: The engine refused the settings.

    Complexity: one ``try_pop`` per change while it waits (O(1) when nothing is queued).
    """
    loop = asyncio.get_running_loop()
    end = loop.time() + wait
    args = {"worker": worker, **spec, **({"amount": amount} if amount != 1 else {})}
    changes = broker.changes
    changes.waiting[worker] = changes.waiting.get(worker, 0) + 1
    try:
        return await _long_pop(broker, worker, args, loop, end)
    finally:
        left = changes.waiting[worker] - 1
        if left:
            changes.waiting[worker] = left
        else:
            del changes.waiting[worker]


async def _refresh(broker: Broker, worker: str) -> None:
    """Journal the liveness of every waiting worker in one event (one refresh at a time)."""
    changes = broker.changes
    if changes.refreshing is not None:
        await asyncio.wait([changes.refreshing])
        return
    done = changes.refreshing = asyncio.get_running_loop().create_future()
    try:
        await broker.run("refresh", {"workers": sorted({*changes.waiting, worker})})
    finally:
        changes.refreshing = None
        done.set_result(None)


async def _long_pop(
    broker: Broker,
    worker: str,
    args: Mapping[str, Any],
    loop: asyncio.AbstractEventLoop,
    end: float,
) -> Popped:
    changes = broker.changes
    while True:
        token = changes.token()
        result = await broker.run("try_pop", args)
        if result is not None and result.record is not None:
            return result.record, {}, result.siblings
        while True:
            left = end - loop.time()
            if left <= 0:
                return None, await _idle(broker, worker, result), ()
            if changes.draining:
                raise Stopping()
            engine = broker.engine
            if engine is None:
                break  # stepped down: try_pop raises Standby with the leader
            due = engine.liveness_due(worker)
            now = broker.now()
            if due is not None and now >= due:
                await _refresh(broker, worker)
                continue
            timeout = left if due is None else min(left, due - now + 0.001)
            await _sleep_on(token, timeout)
            result = None  # its idle reasons are stale now
            token = changes.token()
            engine = broker.engine
            if engine is None or changes.draining or len(engine.fleet) > 0:
                break  # something may be eligible: try again


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
    end = loop.time() + wait
    changes = broker.changes

    def read(engine: BrokerEngine) -> tuple[bool, _T]:
        record = engine.owned(job_id, member)
        return record.state in FINISHED, render(engine, record)

    while True:
        token = changes.token()
        finished, answer = await broker.query(read)
        left = end - loop.time()
        if finished or left <= 0 or changes.draining:
            return answer
        await _sleep_on(token, left)
