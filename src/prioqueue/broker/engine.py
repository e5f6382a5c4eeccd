"""The broker's state machine: every state change is one deterministic, journaled operation.

One owner with a method per journaled operation, so one concern, past the 500-line gauge on
purpose: splitting it would scatter the operations the journal names (issue 29).

Theory of operation
-------------------
:class:`BrokerEngine` composes the fleet dispatcher and the owners of what the dispatcher does
not keep: the :class:`~prioqueue.broker.jobbook.JobBook` (each job's record: owner, payload,
state, current grant, result; the idempotency keys, the retention clock of finished jobs) and
the :class:`~prioqueue.broker.workerbook.WorkerBook` (each worker's settings and last word);
it inherits nothing (issue 29, item 3). It does no I/O and reads no clock: every operation
takes ``now``. The HTTP layer turns a request into an operation ``(op, args, now)`` with JSON
arguments and calls :meth:`BrokerEngine.apply`; the same call on a restored engine gives the
same state and the same answer, so a journal of operations plus an occasional snapshot
recovers the broker exactly (the LMAX design).

The rules this file keeps:

1. An operation either raises :class:`Rejected` *before* changing anything (a client error:
   nothing to journal), or it is journaled, whatever happens next. A bug that raises half way
   raises the same way on replay, so the replayed state still equals the live one.
2. Time-driven changes (expired leases, silent workers, finished jobs whose retention ran out
   and the groups of their last kept jobs) happen only in the ``tick`` operation, which the
   driver journals whenever :meth:`due` says so, before the client's operation. Reads never
   change state.
3. A job is in exactly one state: queued, running, done, failed, cancelled or expired. A
   running job has exactly one ``(worker, attempt)``; ``complete`` and ``fail`` must name both
   (else 409 and nothing changes), and a lease that ran out makes the job queued again (or
   failed after ``max_attempts``) at the next tick. ``fail`` with ``retry`` makes it queued
   again after its backoff while attempts remain; a queued job whose ``ttl`` ran out is
   ``expired`` at the next tick (docs/design/lifecycle.md). A delayed job (``not_before``,
   or a retry waiting out its backoff) is ``queued``; the fleet's timers make ``due`` true at
   its release, so the tick that releases it is journaled like any other.
4. The same ``(member, Idempotency-Key)`` names one job for as long as its record is kept.

Complexity: ``submit``, ``pop``, ``complete``, ``fail``, ``cancel`` and ``heartbeat`` cost the
dispatcher's amortised O(log n + M) plus O(size of the JSON arguments); ``tick`` is
O((e + r) log n) for e expired leases and r records past their retention.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from prioqueue._journaled import journaled, journaled_ops
from prioqueue._readonly import ReadOnly
from prioqueue.broker import _groups, _snapshot, _submit, _workers
from prioqueue.broker._fleet import make_fleet, restore_fleet
from prioqueue.broker._state import Changed, Leases
from prioqueue.broker.config import BrokerConfig
from prioqueue.broker.jobbook import JobBook
from prioqueue.broker.records import (
    AHEAD_LIMIT,
    FINISHED,
    SNAPSHOT_FORMAT,
    JobRecord,
    JobStatus,
    PopResult,
    PopSpec,
    Rejected,
    pop_spec,
    redacted,
)
from prioqueue.broker.workerbook import WorkerBook
from prioqueue.errors import InvalidState, UnknownJob

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "AHEAD_LIMIT",
    "FINISHED",
    "SNAPSHOT_FORMAT",
    "BrokerEngine",
    "JobRecord",
    "PopResult",
    "Rejected",
]


_Op = TypeVar("_Op", bound=Callable[..., Any])


def _in_order(method: _Op) -> _Op:
    """An operation's discipline: time never goes backwards, and advances only on success.

    Under ``@journaled`` (the declaration, which the store reads) on every operation but
    ``try_pop``, which keeps time itself (a skipped pop must leave even ``now`` unchanged).
    """

    @functools.wraps(method)
    def run(self: BrokerEngine, now: float, **kwargs: Any) -> Any:
        if not now >= self._now:  # also refuses NaN
            raise Rejected(409, f"time went backwards: {now!r} after {self._now!r}")
        self._version += 1  # before: an operation that raises half way changed state too
        notify = self._on_change
        if notify is None:
            result = method(self, now, **kwargs)
            self._now = now
            return result
        changed = self._changed
        changed.clear()  # a refusal (or a bug) half way leaves no stale notes
        parked = self._parked()
        result = method(self, now, **kwargs)
        self._now = now
        if self._parked() < parked:
            changed.note_released()
        notify(changed)
        changed.clear()
        return result

    return run  # type: ignore[return-value]


class BrokerEngine:
    """The broker's jobs, workers and leases; see the module docstring for the rules.

    It composes its owners (issue 29, item 3): the fleet dispatcher, the :class:`JobBook`
    (``jobs``), the :class:`~prioqueue.broker.workerbook.WorkerBook` (``workers``), the lease
    policy, its clock (``now``, ``version``) and the notes for waiters. Each method declared
    ``@journaled`` is one operation of the journal, carried out by the module of its role
    (``_submit``, ``_workers``, ``_groups``), which changes the owners through their methods.

    Args:
        config: The broker configuration (dispatcher options, leases, retention).
    """

    config = ReadOnly[BrokerConfig]("_config", "The broker configuration.")
    leases = ReadOnly[Leases]("_leases", "Each grant's lease and the image inputs a submit states.")
    fleet = ReadOnly[Any]("_fleet", "The fleet dispatcher: the queue, grants, workers' runtime.")
    jobs = ReadOnly[JobBook](
        "_jobs", "The job records, keys, counts, queued bytes and retention (a read-only map)."
    )
    workers = ReadOnly[WorkerBook](
        "_workers", "The workers' settings and last words (a read-only mapping)."
    )
    now = ReadOnly[float]("_now", "The time of the last operation (``-inf`` before the first).")
    version = ReadOnly[int](
        "_version", "Counts the operations run (refused ones included); keys the read caches."
    )
    on_change = ReadOnly["Callable[[Changed], None] | None"](
        "_on_change",
        "Called after each applied operation with what it changed (the driver wakes the long "
        "polls it concerns; :meth:`watch` sets it); not state. Notes are taken only while set.",
    )
    changed = ReadOnly[Changed](
        "_changed", "The notes of the operation running now (see :class:`Changed`); not state."
    )

    def __init__(self, config: BrokerConfig) -> None:
        self._config = config
        self._leases = Leases(config)
        self._fleet: Any = make_fleet(config, self._leases.lease_for)
        self._jobs = JobBook(config.result_ttl_seconds)
        self._workers = WorkerBook()
        self._now = -math.inf
        self._version = 0
        self._status: tuple[int, dict[str, Any]] | None = None
        self._on_change: Callable[[Changed], None] | None = None
        self._changed = Changed()

    # ------------------------------------------------------------------ driving

    def apply(self, op: str, args: Mapping[str, Any], now: float) -> Any:
        """Run one operation (the journal's unit).

        Args:
            op: The operation's name: a method declared ``@journaled`` (``submit``,
                ``cancel``, ``pop``, ``tick``...; ``journaled_ops(BrokerEngine)``).
            args: Its JSON arguments.
            now: The time it happens at (never earlier than the previous operation's).

        Returns:
            The operation's result.

        Raises:
            Rejected: The operation was refused and changed nothing.
            ValueError: ``op`` is unknown or ``now`` went backwards.
        """
        ops = journaled_ops(type(self))
        if op not in ops:
            raise ValueError(f"unknown broker operation {op!r}; known: {', '.join(ops)}")
        return getattr(self, op)(now=now, **args)

    # ------------------------------------------------------------------ submitters

    @journaled
    @_in_order
    def submit(self, now: float, **args: Any) -> tuple[JobRecord, bool]:
        """Queue a job; with an idempotency key already used by this member, return its job.

        Keywords: the fields of :data:`prioqueue.jobfields.JOB_FIELDS` with the ``engine``
        layer (``member``, ``tier``, ``priority`` required; as ``FleetDispatcher.submit``'s
        where they share a name). ``ttl``, ``not_before``, ``max_attempts`` and ``backoff``
        are the job lifecycle (docs/design/lifecycle.md): ``not_before`` is a time on the
        broker's clock (Unix seconds).

        Returns:
            ``(record, created)``.

        Raises:
            Rejected: 422 the key was used with a different request, or a bad ``backoff``;
                429 the queue (or the level's ``max_queued``) is full, or a queued-bytes
                budget would be passed; 413 the payload alone is over one; 503 the forecast
                wait is over the level's ``max_wait``.
        """
        return _submit.submit(self, now, args)

    @journaled
    @_in_order
    def submit_many(
        self, now: float, *, jobs: list[dict[str, Any]], idempotency_key: str | None = None
    ) -> list[tuple[JobRecord, bool]]:
        """Submit every job of a batch, or none: one journaled operation.

        Each item holds :meth:`submit`'s keyword arguments. One admission check serves
        :meth:`submit` and this batch (``_submit.admit``): the batch is refused whole, before
        anything changes, with the answer the first job a one-by-one submit would refuse
        gets. A refusal that still happened half way would be a bug: it escapes as
        ``RuntimeError`` and the driver stops (crash-only), so a batch is never half applied.

        Args:
            now: The time.
            jobs: The jobs.
            idempotency_key: Names the whole batch (one key space with :meth:`submit`'s
                keys): the same key with the same jobs replays their records, with other
                jobs (another count included) is a 422. Its jobs carry no key of their own.

        Returns:
            ``(record, created)`` per job, in order.

        Raises:
            Rejected: 422 an empty batch, a reused key, a bad ``backoff``; 413 a job's bytes
                alone are over a budget; 429 the batch does not fit (a count, a level's
                ``max_queued``, queued bytes); 503 a level's forecast wait over ``max_wait``.
                The message names the job (``jobs[i]``).

        Complexity: O(b (log n + M + levels)) for b jobs.
        """
        return _submit.submit_many(self, now, jobs, idempotency_key)

    @journaled
    @_in_order
    def cancel(self, now: float, *, job_id: str, member: str | None) -> JobRecord:
        """Cancel a queued or running job of ``member``; a finished job stays as it is.

        Raises:
            Rejected: 404 unknown or another member's; 409 already finished.
        """
        record = self.owned(job_id, member)
        if record.state in FINISHED:
            raise Rejected(409, f"job {job_id!r} is already {record.state}", field="id")
        self._fleet.cancel(job_id, now=now)
        self.finish(record, "cancelled", None, now)
        return attrs.evolve(record)

    @journaled
    @_in_order
    def cancel_group(
        self, now: float, *, group: str, member: str, running: str = "keep"
    ) -> list[str]:
        """Cancel ``member``'s ``group`` through the core's ``cancel_group`` (see ``_groups``).

        Args:
            now: The time.
            group: The group.
            member: Whose group it is.
            running: ``"keep"`` (let running jobs finish) or ``"cancel"``.

        Returns:
            The ids of the jobs cancelled, in submission order.

        Raises:
            Rejected: 404 the member has no such group; 422 a bad ``running``.
        """
        return _groups.cancel_group(self, now, label=group, member=member, running=running)

    # ------------------------------------------------------------------ workers

    @journaled
    @_in_order
    def pop(
        self, now: float, *, worker: str, amount: int = 1, **spec: Unpack[PopSpec]
    ) -> PopResult:
        """Grant the worker its next job, or say why there is none.

        Keywords beside ``worker`` (:class:`~prioqueue.broker.records.PopSpec`): ``models``
        (None), ``resident`` (None), ``slots`` (1), ``slow`` (False). ``amount > 1`` also
        grants up to ``amount - 1`` queued jobs of the first job's group that fit the worker
        (``PopResult.siblings``; ``FleetDispatcher.pop_many(siblings=True)``).
        """
        return _workers.pop(self, now, worker, pop_spec(spec), amount)

    @journaled
    @_in_order
    def complete(
        self, now: float, *, job_id: str, worker: str, attempt: int, result: Any = None
    ) -> JobRecord:
        """The holder finished the job: it is done and its result kept.

        Raises:
            Rejected: 404 unknown; 409 not this worker's current grant; 413 result too large.
        """
        return _workers.complete(self, now, job_id, worker, attempt, result)

    @journaled
    @_in_order
    def fail(
        self,
        now: float,
        *,
        job_id: str,
        worker: str,
        attempt: int,
        result: Any = None,
        retry: bool = False,
    ) -> JobRecord:
        """The holder gave up on the job: failed for good, or (``retry``) queued again.

        With ``retry`` and attempts left (the job's ``max_attempts``, else the
        configuration's), the job is queued again after its backoff (delayed until then) and
        the worker's report is kept as its ``result`` until an attempt finishes it.

        Raises:
            Rejected: 404 unknown; 409 not this worker's current grant; 413 result too large.
        """
        return _workers.fail(self, now, job_id, worker, attempt, result, retry)

    @journaled
    @_in_order
    def heartbeat(
        self, now: float, *, worker: str, resident: str | None = None
    ) -> list[dict[str, Any]]:
        """A worker is alive: returns the jobs it holds (id, attempt, deadline).

        A worker that lost a pop's answer (a broker restart) learns here what it holds.

        Raises:
            Rejected: 404 the worker never popped.
        """
        return _workers.heartbeat(self, now, worker, resident)

    # ------------------------------------------------------------------ clients (long-poll)

    @journaled(skip_when_empty=True)
    def try_pop(
        self, now: float, *, worker: str, amount: int = 1, **spec: Unpack[PopSpec]
    ) -> PopResult | None:
        """:meth:`pop`, except that a pop that would change nothing returns None.

        A known worker whose settings are unchanged, that has not timed out and whose last
        journaled word is under ``worker_timeout / 2`` old is *fresh*: its pop is previewed
        (``FleetDispatcher.would_pop``, a read), and when the preview grants nothing the
        state is untouched (its liveness is not refreshed): the driver answers such a call
        without journaling it (``skip_when_empty``), so waiting and empty pops write nothing.
        A fresh pop the preview says grants is made and journaled as this operation. Any
        other case is :meth:`pop` (journaled): a join, a change of settings, a refresh of
        liveness at most once per ``worker_timeout / 2``, or a lifecycle timer due at
        ``now`` (the pop fires it).

        Returns:
            The :class:`PopResult` of a journaled pop, or None (nothing changed).

        Raises:
            Rejected: 409 time went backwards.

        Complexity: :meth:`pop`'s; O(1) when the worker's slots are full or nothing is queued.
        """
        if not now >= self._now:
            raise Rejected(409, f"time went backwards: {now!r} after {self._now!r}")
        settings = pop_spec(spec)
        _workers.checked_amount(amount)
        fresh = _workers.fresh_worker(self, worker, settings, now)
        grants = None if fresh is None else _workers.would_grant(self, now, worker, fresh)
        if grants is None:  # a join, a refresh, or a timer due: the journaled pop
            return self.pop(now, worker=worker, amount=amount, **spec)
        if not grants:  # the fleet's preview: nothing changed, not even the clock
            return None
        return _workers.quiet_pop(self, now, worker, amount)

    def liveness_due(self, worker: str) -> float | None:
        """When a waiting ``worker``'s liveness must next be journaled (None: never). O(1)."""
        return _workers.liveness_due(self, worker)

    @journaled
    @_in_order
    def release(self, now: float, *, job_id: str, worker: str, attempt: int) -> JobRecord:
        """Give back a job whose grant never reached its worker (the client had gone).

        The job goes back to the head of its lane, its charge refunded, whatever its attempt
        count (not its fault); the worker keeps its other jobs.

        Raises:
            Rejected: 404 unknown; 409 not this worker's current grant.
        """
        return _workers.release(self, now, job_id, worker, attempt)

    @journaled
    @_in_order
    def refresh(self, now: float, *, workers: list[str]) -> int:
        """Waiting workers are alive: one journaled event for every long poll of the fleet.

        Names of workers that are not known (they left meanwhile) are skipped.

        Returns:
            How many workers were marked alive.

        Complexity: O(len(workers)).
        """
        return _workers.refresh(self, now, workers)

    @journaled
    @_in_order
    def leave(self, now: float, *, worker: str) -> list[str]:
        """A worker leaves: the jobs it holds go back to the heads of their lanes.

        Leaving is not the jobs' fault: they are requeued whatever their attempt count.

        Returns:
            The ids of the jobs requeued, in submission order.

        Raises:
            Rejected: 404 the worker never popped (or already left).

        Complexity: O(slots log n).
        """
        return _workers.leave(self, now, worker)

    # ------------------------------------------------------------------ time

    @journaled
    @_in_order
    def tick(self, now: float) -> list[str]:
        """Take back expired leases; forget old records and silent workers.

        Records past their retention are dropped, and so are workers silent for
        ``forget_workers_seconds`` (one that still holds a job is kept, and looked at again
        that much later).

        Returns:
            The ids of the jobs whose lease ran out.
        """
        return _workers.tick(self, now)

    @journaled
    def rebase_time(self, now: float, *, by: float) -> None:
        """Move every stored time ``by`` seconds back: a saved forward clock step undone.

        Durations left (leases, waits, retention) are kept; ``now`` is the rebased clock's
        (docs/durability.md, "Time"). O(jobs + workers), once.

        Raises:
            Rejected: 422 ``by`` is not a positive number; 409 ``now`` is before the last
                operation's time minus ``by``.
        """
        _snapshot.rebase(self, now, by)

    # ------------------------------------------------------------------ shared steps

    def check_image(self, image: Mapping[str, Any]) -> dict[str, Any]:
        """Validate a submit's lease inputs (:meth:`Leases.check_image <_state.Leases>`).

        Raises:
            Rejected: 422 naming the field that is wrong, or a lease too long.
        """
        return self._leases.check_image(image)

    def owned(self, job_id: str, member: str | None) -> JobRecord:
        """The record of ``job_id`` if ``member`` may see it (None: anyone). O(1).

        Raises:
            Rejected: 404 when it is unknown or belongs to another member.
        """
        record = self._jobs.get(job_id)
        if record is None or (member is not None and record.member != member):
            raise Rejected(404, f"no job {job_id!r}", field="id")
        return record

    def note_queued(self, record: JobRecord) -> None:
        """``record`` is queued now: note its model unless it is delayed. O(1)."""
        if self._on_change is not None and self._fleet.not_before(record.id) is None:
            self._changed.queued.append(record.model)

    def requeued(self, record: JobRecord) -> None:
        """A running job went back to the queue (a retry, a worker left, a lease ran out). O(1)."""
        if self._on_change is not None and record.worker is not None:
            self._changed.freed.append((record.worker, record.member))
        self.note_queued(self._jobs.requeue(record.id))

    def finish(self, record: JobRecord, state: JobStatus, result: Any, now: float) -> None:
        """``record`` ended in ``state`` (:meth:`JobBook.finish`), the change noted.

        O(log retention).
        """
        if self._on_change is not None:
            self._changed.finished.append(record.id)
            if record.state == "running" and record.worker is not None:
                self._changed.freed.append((record.worker, record.member))
        self._jobs.finish(record.id, state, result, now)

    def watch(self, on_change: Callable[[Changed], None] | None) -> None:
        """Call ``on_change`` after each applied operation (None: stop). O(1)."""
        self._on_change = on_change

    def advance_to(self, now: float) -> None:
        """The engine's time is ``now`` (a pop that keeps time itself). O(1)."""
        self._now = now

    def _parked(self) -> int:
        """Delayed jobs in the fleet (waiting for ``not_before`` or a backoff). O(levels)."""
        parked: int = self._fleet.delayed_count()
        return parked

    # ------------------------------------------------------------------ time

    def due(self, now: float) -> bool:
        """Whether a ``tick`` at ``now`` would change anything (a lease or retention ran out).

        Complexity: O(1).
        """
        due = self.next_due()
        return due is not None and due <= now

    def next_due(self) -> float | None:
        """The earliest time at which :meth:`due` becomes true, or None. O(1)."""
        times = [self._fleet.next_deadline(), self._jobs.retention_due()]
        oldest = self._workers.oldest_seen()
        if oldest is not None:
            times.append(oldest[1] + self._config.forget_workers_seconds)
        known = [t for t in times if t is not None]
        return min(known) if known else None

    # ------------------------------------------------------------------ reads

    def position(
        self, record: JobRecord, sees: Callable[[str], bool] | None = None
    ) -> tuple[int | None, str | None]:
        """A queued or running job's 1-based position (0: running) and explanation.

        The forecast behind it stops after :data:`AHEAD_LIMIT` jobs ahead, so a read costs
        O(L log L + AHEAD_LIMIT log L) for L lanes however long the queue; further back, the
        position is None and the explanation says how many are ahead at least.

        Args:
            record: The job.
            sees: Whether the reader may see a member's jobs (None: it sees every member).
                The jobs ahead and the overtakes of members it may not see keep their
                priority and score but lose their id and member (the gateway's redaction).
        """
        if record.state in FINISHED:
            return None, None
        try:
            explanation = self._fleet.explain(
                record.id, now=self._now, ahead_limit=AHEAD_LIMIT, overtakes_limit=20
            )
        except (UnknownJob, InvalidState):  # pragma: no cover - records mirror the fleet
            return None, None
        if sees is not None:
            explanation = redacted(explanation, sees)
        if explanation.not_before is not None:  # delayed: no place in line yet
            return None, str(explanation)
        if not explanation.ahead_complete:
            return None, f"more than {AHEAD_LIMIT} jobs ahead\n{explanation}"
        return explanation.position, str(explanation)

    def not_before(self, record: JobRecord) -> float | None:
        """Until when a queued job is delayed (``not_before``, a retry's backoff), or None. O(1)."""
        if record.state != "queued":
            return None
        try:
            value: float | None = self._fleet.not_before(record.id)
        except UnknownJob:  # pragma: no cover - records mirror the fleet
            return None
        return value

    def status(self) -> dict[str, Any]:
        """Counts by state, workers and totals (for ``GET /v1/status``), a fresh dict.

        Complexity: O(1) when no operation ran since the last call (the counts are cached
        by :attr:`version`), else O(jobs kept).
        """
        cached = self._status
        if cached is None or cached[0] != self._version:
            states = dict.fromkeys(
                ("queued", "running", "done", "failed", "cancelled", "expired"), 0
            )
            for record in self._jobs.values():
                states[record.state] = states.get(record.state, 0) + 1
            cached = self._status = (self._version, states)
        return {
            "jobs": dict(cached[1]),
            "workers": len(self._workers),
            "totals": dict(self._jobs.counts),
        }

    def check(self) -> None:
        """Assert the owners' rules and that the records mirror the fleet (for the tests).

        Complexity: O(jobs + workers).

        Raises:
            AssertionError: A rule does not hold.
        """
        self._jobs.check()
        self._workers.check()
        for record in self._jobs.values():
            assert (record.id in self._fleet) == (record.state not in FINISHED), record.id

    # ------------------------------------------------------------------ persistence

    def snapshot(self, *, now: float | None = None) -> dict[str, Any]:
        """The whole state as JSON data; :meth:`restore` rebuilds it exactly. O(n).

        Args:
            now: Used only before the first operation (the state is as of the last one).

        Returns:
            Plain JSON data.
        """
        return _snapshot.dump(self, now)

    @classmethod
    def restore(cls, state: Mapping[str, Any], config: BrokerConfig) -> BrokerEngine:
        """Rebuild an engine from :meth:`snapshot` data.

        Args:
            state: The snapshot.
            config: The configuration (the same dispatcher options as when it was taken).

        Returns:
            The engine.

        Raises:
            ValueError: ``state`` is not a broker snapshot of this version.
        """
        if state.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(
                f"not a broker snapshot of this version: format {state.get('format')!r}, "
                f"expected {SNAPSHOT_FORMAT!r}"
            )
        engine = cls(config)
        _snapshot.load(engine, state)
        return engine

    def load_parts(self, now: float, fleet: Mapping[str, Any]) -> None:
        """Take a snapshot's time and fleet (``_snapshot.load`` fills the books). O(fleet).

        Raises:
            ValueError: ``fleet`` is not a fleet snapshot.
        """
        self._now = now
        self._fleet = restore_fleet(fleet, self._config, self._leases.lease_for)

    def shift_times(self, now: float, by: float) -> None:
        """Every time held moves ``by`` seconds earlier; then the time is ``now`` (a rebase).

        The fleet is rebuilt from its snapshot with the same shift; the books shift theirs.
        Every waiter is told (``released``): each wait moved. O(jobs + workers).
        """
        self._version += 1
        at = self._now if math.isfinite(self._now) else 0.0
        self._fleet = restore_fleet(
            self._fleet.snapshot(now=at), self._config, self._leases.lease_for, now=at - by
        )
        self._jobs.shift(by)
        self._workers.shift(by)
        self._status = None
        self._now = now
        if self._on_change is not None:
            changed = self._changed
            changed.clear()
            changed.note_released()
            self._on_change(changed)
            changed.clear()
