"""A job broker for a fleet of GPU workers that pull image jobs concurrently, each under a lease.

The broker owns one ``FleetDispatcher``: one queue, one set of fair-share lanes and one lease
policy for the whole fleet. Each worker is an asyncio task that joins with the models it serves
and its slots (``slots=2``: run one job and prefetch the next, as the AI Horde ADR assumes),
pulls with ``pop()``, heartbeats while it runs a job, and submits the result. Every grant
carries its own lease from a ``LeaseCalculator``, started at the pop; an extra-slow worker
(``slow=True``) gets three times the lease. One worker vanishes mid-job: the broker's timer
(``next_deadline()``, then ``expire()``) notices its silence after ``worker_timeout`` seconds,
long before its lease would run out, and puts its jobs back at the head of their lanes for the
others. Its late result is refused.

Time is simulated: a tiny discrete-event clock (``SimulatedTime``) runs the asyncio tasks in
the order of their wake-up times on a ``ManualClock``, so the story takes milliseconds and
prints the same lines every run. In a real broker the clock is ``time.monotonic``, workers
talk over HTTP, and the timer is ``loop.call_at(next_deadline())``.

Run it: ``python examples/job_broker.py``.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Coroutine
from typing import Any

import attrs

from prioqueue import Expired, FleetDispatcher, InvalidState, LeaseCalculator, UnknownJob
from prioqueue.testing import ManualClock

HEARTBEAT = 30.0  # seconds between a busy worker's heartbeats
POLL = 20.0  # seconds an idle worker waits before it polls again
TIMEOUT = 90.0  # the broker's worker_timeout


class SimulatedTime:
    """Run asyncio tasks on a ``ManualClock``: ``await sleep(s)`` wakes in simulated time.

    The driver lets every task run until each one sleeps or ends, then moves the clock to the
    earliest wake-up (ties in the order the sleeps were asked for) and wakes that task.
    """

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._asked = 0

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of simulated time."""
        wake = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.clock() + seconds, self._asked, wake))
        self._asked += 1
        await wake

    async def run(self, *coroutines: Coroutine[Any, Any, None], until: float) -> None:
        """Run the coroutines as tasks until they all end or the clock reaches ``until``."""
        tasks = [asyncio.create_task(coroutine) for coroutine in coroutines]
        while True:
            await asyncio.sleep(0)
            alive = [task for task in tasks if not task.done()]
            if not alive:
                break
            if len(self._sleepers) < len(alive):
                continue  # someone is still running: let it reach its next sleep
            wake, _, future = heapq.heappop(self._sleepers)
            if wake > until:
                break
            self.clock.jump_to(wake)
            future.set_result(None)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]


@attrs.frozen
class Assignment:
    """What a worker gets from ``pop()``: the job, its request and its own lease."""

    job_id: str
    request: dict[str, Any]
    attempt: int
    lease_seconds: float
    deadline: float


class Broker:
    """Hands image jobs to a fleet of pulling workers, each job under its own lease."""

    def __init__(self, time: SimulatedTime) -> None:
        self.time = time
        self.fleet = FleetDispatcher(
            lease_for=LeaseCalculator(), worker_timeout=TIMEOUT, max_attempts=3
        )
        self.failed: list[str] = []

    def now(self) -> float:
        return self.time.clock()

    def log(self, text: str) -> None:
        print(f"  t={self.now():5.0f}  {text}")

    def join(self, worker: str, **spec: Any) -> None:
        info = self.fleet.join(worker, now=self.now(), **spec)
        models = "every model" if info.models is None else ", ".join(sorted(info.models))
        slow = ", extra slow" if info.slow else ""
        self.log(f"{worker} joins: {models}; {info.slots} slot(s){slow}")

    def submit(
        self, job_id: str, *, member: str, priority: str, model: str, **request: Any
    ) -> None:
        self.fleet.submit(
            job_id, member=member, priority=priority, model=model, payload=request, now=self.now()
        )

    def pop(self, worker: str) -> Assignment | None:
        grant = self.fleet.pop(worker, now=self.now())
        if grant is None:
            return None
        assert grant.lease is not None  # the fleet has a lease_for
        warm = "cold load" if grant.swap else "warm"
        self.log(
            f"{worker} pops {grant.job.id} (attempt {grant.attempt}, {warm}), "
            f"lease {grant.lease.seconds:.0f} s"
        )
        return Assignment(
            grant.job.id, grant.job.payload, grant.attempt, grant.lease.seconds,
            grant.lease.deadline,
        )  # fmt: skip

    def heartbeat(self, worker: str) -> None:
        self.fleet.heartbeat(worker, now=self.now())

    def submit_result(self, worker: str, job_id: str) -> bool:
        """Accept a result from the worker that holds the job; refuse anything else."""
        try:
            self.fleet.complete(job_id, now=self.now(), worker=worker)
        except (UnknownJob, InvalidState):  # not its job any more (LeaseExpired included)
            self.log(f"{worker} submits {job_id}: refused, it no longer holds it")
            return False
        self.log(f"{worker} submits {job_id}")
        return True

    def tick(self) -> list[Expired]:
        """Take back the jobs of silent workers and expired leases (the broker's timer)."""
        expired = self.fleet.expire(self.now())
        for record in expired:
            why = "went silent" if record.cause == "worker_timeout" else "let its lease run out"
            fate = "requeued at its lane's head" if record.requeued else "FAILED for good"
            self.log(f"{record.worker} {why}: {record.job.id} {fate}")
            if not record.requeued:
                self.failed.append(record.job.id)
        return expired

    async def timer(self) -> None:
        """The broker's one timer: sleep until ``next_deadline()``, then ``expire()``."""
        while True:
            deadline = self.fleet.next_deadline()
            await self.time.sleep(POLL if deadline is None else max(0.0, deadline - self.now()))
            self.tick()


async def worker(
    broker: Broker, name: str, *, speed: float = 1.0, vanish_after: int | None = None
) -> None:
    """Pull, run (heartbeating), submit; poll when there is nothing to do.

    The worker keeps up to its slots: it pops until they are full, runs the oldest job it
    holds, and prefetches the next. ``vanish_after=k``: it disappears without a word while
    running its k-th job (its process died), and comes back later to submit that result.
    """
    slots = broker.fleet.worker(name).slots
    held: list[Assignment] = []
    done = 0
    while True:
        while len(held) < slots and (job := broker.pop(name)) is not None:
            held.append(job)
        if not held:
            await broker.time.sleep(POLL)
            continue
        job = held.pop(0)
        runtime = job.request["steps"] * 2.0 * speed  # 2 s a step on a normal-speed GPU
        if vanish_after is not None and done + 1 == vanish_after:
            broker.log(f"{name} vanishes while running {job.job_id}")
            await broker.time.sleep(runtime)  # it finishes, but nobody hears from it...
            await broker.time.sleep(TIMEOUT)  # ...until long after its timeout
            broker.submit_result(name, job.job_id)
            return
        left = runtime
        while left > HEARTBEAT:
            await broker.time.sleep(HEARTBEAT)
            left -= HEARTBEAT
            broker.heartbeat(name)
        await broker.time.sleep(left)
        broker.submit_result(name, job.job_id)
        done += 1


async def story() -> Broker:
    clock = ManualClock()
    broker = Broker(SimulatedTime(clock))
    print("the fleet:")
    broker.join("gpu-a", models=["sdxl", "flux"], resident="sdxl", slots=2)
    broker.join("gpu-b", models=["sdxl"], resident="sdxl")
    broker.join("gpu-old", models=["sdxl", "flux"], resident="flux", slow=True)
    portrait = {"width": 1024, "height": 1024, "steps": 30}
    sticker = {"width": 512, "height": 512, "steps": 20}
    for k in range(3):
        broker.submit(f"film-{k}", member="ann", priority="batch", model="flux", **portrait)
    broker.submit("sticker", member="bob", priority="interactive", model="sdxl", **sticker)
    broker.submit("emoji", member="eve", priority="interactive", model="sdxl", **sticker)
    broker.submit("avatar", member="cat", priority="normal", model="sdxl", **portrait)
    broker.submit("poster", member="dan", priority="normal", model="flux", **portrait)
    broker.submit("banner", member="fay", priority="normal", model="sdxl", **portrait)
    print("they pull concurrently; gpu-old vanishes with its first job:")
    await broker.time.run(
        worker(broker, "gpu-a"),
        worker(broker, "gpu-b"),
        worker(broker, "gpu-old", speed=3.0, vanish_after=1),
        broker.timer(),
        until=600.0,
    )
    return broker


def main() -> None:
    broker = asyncio.run(story())
    stats = broker.fleet.stats(now=broker.now())
    print(
        f"done: {stats.completed} completed, {stats.expired} taken back, {stats.failed} failed, "
        f"{stats.queued} queued, {stats.swaps} cold load(s)"
    )
    assert (stats.completed, stats.queued, stats.failed) == (8, 0, 0)
    assert stats.expired >= 1


if __name__ == "__main__":
    main()
