"""A small job broker: workers pop image jobs for one GPU, each under a lease.

The broker owns a ``SizeOneDispatcher`` (one GPU, one job at a time) whose ``lease_for`` is a
``LeaseCalculator``: each grant carries a deadline sized from the image request in the job's
payload (``lease_seconds()`` under the default constants). Workers poll ``pop()``; a worker
that finishes calls ``submit_result()``. The broker's single timer is ``next_deadline()``:
when it passes, ``expire()`` takes the job back from the worker that vanished and puts it at
the head of its lane, so the next worker gets it first. After ``max_attempts`` grants a job is
reported as failed, never silently dropped. A late result from a worker that lost its lease is
refused.

Time is a ``ManualClock`` from ``prioqueue.testing``, so the whole story runs in milliseconds.
In a real broker the clock is ``time.monotonic`` and ``tick()`` runs from a timer armed at
``next_deadline()``.

Run it: ``python examples/job_broker.py``.
"""

from __future__ import annotations

from typing import Any

import attrs

from prioqueue import (
    Expired,
    InvalidState,
    LeaseCalculator,
    SizeOneDispatcher,
    UnknownJob,
    lease_seconds,
)
from prioqueue.testing import ManualClock


@attrs.frozen
class Assignment:
    """What a worker gets from ``pop()``: the job, its request and the lease deadline."""

    job_id: str
    request: dict[str, Any]
    attempt: int
    lease_seconds: float
    deadline: float


class Broker:
    """Hands jobs for one GPU to workers, one at a time, each under a lease."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.gpu = SizeOneDispatcher(lease_for=LeaseCalculator(), max_attempts=3)
        self.holder: dict[str, tuple[str, int]] = {}  # job id -> (worker, attempt)
        self.failed: list[str] = []

    def submit(self, job_id: str, *, member: str, priority: str, request: dict[str, Any]) -> None:
        """Queue an image job; the request is the payload the lease is sized from."""
        self.gpu.submit(job_id, member=member, priority=priority, payload=request, now=self.clock())

    def pop(self, worker: str) -> Assignment | None:
        """Give the GPU's next job to ``worker``, or None while another worker holds it."""
        self.tick()
        grant = self.gpu.dispatch(self.clock())
        if grant is None:
            return None
        assert grant.lease is not None  # the dispatcher has a lease_for
        self.holder[grant.job.id] = (worker, grant.attempt)
        return Assignment(
            job_id=grant.job.id,
            request=grant.job.payload,
            attempt=grant.attempt,
            lease_seconds=grant.lease.seconds,
            deadline=grant.lease.deadline,
        )

    def submit_result(self, worker: str, job_id: str) -> bool:
        """Accept a finished job from the worker that holds it; refuse anything else."""
        self.tick()
        if self.holder.get(job_id, ("", 0))[0] != worker:
            return False  # someone else holds it now, or it is gone
        try:
            self.gpu.complete(job_id, now=self.clock())
        except (UnknownJob, InvalidState):  # LeaseExpired is an InvalidState
            return False
        del self.holder[job_id]
        return True

    def tick(self) -> list[Expired]:
        """Reclaim the GPU from a worker past its lease (what the broker's timer calls)."""
        expired = self.gpu.expire(self.clock())
        for record in expired:
            worker, attempt = self.holder.pop(record.job.id)
            fate = "requeued at the head of its lane" if record.requeued else "FAILED for good"
            print(
                f"  t={self.clock():6.0f}  lease of {record.job.id} (attempt {attempt}, "
                f"{worker}) ran out: {fate}"
            )
            if not record.requeued:
                self.failed.append(record.job.id)
        return expired


def work(broker: Broker, worker: str, *, runtime: float, vanish: bool = False) -> str | None:
    """One worker cycle: pop a job, run it for ``runtime`` seconds, submit (unless it vanishes)."""
    job = broker.pop(worker)
    if job is None:
        print(f"  t={broker.clock():6.0f}  {worker} polls: the GPU is leased to another worker")
        return None
    print(
        f"  t={broker.clock():6.0f}  {worker} pops {job.job_id} (attempt {job.attempt}), "
        f"lease {job.lease_seconds:.0f} s, deadline t={job.deadline:.0f}"
    )
    if vanish:
        print(f"  t={broker.clock():6.0f}  {worker} vanishes while running {job.job_id}")
        return job.job_id
    broker.clock.advance(runtime)
    accepted = broker.submit_result(worker, job.job_id)
    print(f"  t={broker.clock():6.0f}  {worker} submits {job.job_id}: accepted={accepted}")
    return job.job_id


def main() -> None:
    """Run the story: two workers, one of which vanishes mid-job."""
    clock = ManualClock()
    broker = Broker(clock)
    small = {"width": 512, "height": 512, "steps": 20}  # the 150 s minimum
    large = {"width": 1024, "height": 1024, "steps": 50, "sampler": "k_euler"}  # 430 s
    loras = {"width": 512, "height": 512, "steps": 1, "loras": 5}  # 684 s
    assert [lease_seconds(**r) for r in (small, large, loras)] == [150, 430, 684]

    broker.submit("portrait", member="carol", priority="interactive", request=large)
    broker.submit("sticker", member="bob", priority="normal", request=small)
    broker.submit("styled", member="alice", priority="batch", request=loras)

    print("w1 runs the portrait, then vanishes with the sticker:")
    work(broker, "w1", runtime=95.0)
    lost = work(broker, "w1", runtime=0.0, vanish=True)

    print("w2 polls while w1's lease on the sticker still runs:")
    clock.advance(60.0)
    work(broker, "w2", runtime=10.0)

    deadline = broker.gpu.next_deadline()
    assert deadline is not None
    print(f"the broker's timer fires at the deadline, t={deadline:.0f}:")
    clock.jump_to(deadline)
    expired = broker.tick()
    assert [(e.job.id, e.requeued) for e in expired] == [(lost, True)]

    print("w2 gets the sticker back (attempt 2), then the styled job:")
    assert work(broker, "w2", runtime=12.0) == lost
    work(broker, "w2", runtime=300.0)

    print("w1 comes back and submits the sticker it lost:")
    refused = broker.submit_result("w1", "sticker")
    print(f"  t={clock():6.0f}  w1 submits sticker: accepted={refused}")
    assert not refused

    stats = broker.gpu.stats(now=clock())
    print(
        f"done: {stats.completed} completed, {stats.expired} lease(s) expired, "
        f"{stats.failed} failed, {stats.queued} queued"
    )
    assert (stats.completed, stats.expired, stats.failed, stats.queued) == (3, 1, 0, 0)


if __name__ == "__main__":
    main()
