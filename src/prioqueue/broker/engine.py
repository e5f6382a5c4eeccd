"""The broker's state machine: every state change is one deterministic, journaled operation.

Theory of operation
-------------------
:class:`BrokerEngine` holds the fleet dispatcher plus what the dispatcher does not keep: each
job's record (owner, payload, state, current grant, result), the idempotency keys and the
retention clock of finished jobs. It does no I/O and reads no clock: every operation takes
``now``. The HTTP layer turns a request into an operation ``(op, args, now)`` with JSON
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
import hashlib
import heapq
import json
import math
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, TypeVar

import attrs

from prioqueue._errors import (
    ConfigError,
    DuplicateJob,
    InvalidState,
    Overloaded,
    QueueFull,
    UnknownJob,
)
from prioqueue.broker import _budget, _groups
from prioqueue.broker._fleet import group_key, make_fleet, restore_fleet
from prioqueue.broker.config import BrokerConfig
from prioqueue.lease import ImageRequest
from prioqueue.lifecycle import Backoff
from prioqueue.records import Job

__all__ = ["SNAPSHOT_FORMAT", "BrokerEngine", "JobRecord", "PopResult", "Rejected"]

SNAPSHOT_FORMAT: Final = "prioqueue.broker/1"
AHEAD_LIMIT: Final = 100
"""How far ahead ``GET /v1/jobs/{id}`` forecasts a job's position (the gateway's bound too).

A forecast step costs about 15 us with a few hundred lanes: 1,000 steps made a read cost
20 ms (issue 21); 100 keep it near 2 ms at 5,000 queued."""
JobStatus = Literal["queued", "running", "done", "failed", "cancelled", "expired"]
FINISHED: Final = frozenset(("done", "failed", "cancelled", "expired"))
MAX_IMAGE_LEASE: Final = 1e9
"""The longest lease (seconds, on a slow worker) a job's ``image`` inputs may give: past it
the inputs are absurd, and past a float's range every pop would fail on the job."""


class Rejected(Exception):
    """An operation the engine refused before changing anything.

    Attributes:
        status: The HTTP status that says why (404, 409, 413, 422, 429, 503).
        field: The request field at fault, when one is.
        retry_after: Seconds to wait before retrying (429 and 503 only).
    """

    def __init__(
        self, status: int, message: str, *, field: str | None = None, retry_after: float = 0.0
    ) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.retry_after = retry_after


@attrs.define
class JobRecord:
    """What the broker knows of one job beyond the dispatcher's view."""

    id: str
    member: str
    priority: int
    model: str | None
    estimate: float | None
    group: str | None
    image: dict[str, Any] | None
    payload: Any
    submitted_at: float
    state: JobStatus = "queued"
    attempt: int = 0
    worker: str | None = None
    deadline: float | None = None
    granted_at: float | None = None
    lease_seconds: float | None = None
    result: Any = None
    finished_at: float | None = None
    idempotency_key: str | None = None
    expires_at: float | None = None
    """When the job expires if still queued (its ttl), or None."""
    max_attempts: int | None = None
    """The job's own grant budget (None: the configuration's ``max_attempts``)."""


@attrs.frozen
class PopResult:
    """What a worker's pop gets: a job, or why there is none."""

    record: JobRecord | None
    idle: Mapping[str, int]


def fingerprint(args: Mapping[str, Any]) -> str:
    """A stable digest of a submit's arguments, to tell a retry from a different request."""
    body = json.dumps(args, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def submit_digest(args: Mapping[str, Any]) -> str:
    """The fingerprint of a submit's arguments (``submit``'s keywords) for its idempotency key."""
    fields = {
        "p": args["priority"], "m": args.get("model"), "e": args.get("estimate"),
        "g": args.get("group"), "i": args.get("image"), "b": args.get("payload"),
    }  # fmt: skip
    lifecycle = {
        "t": args.get("ttl"), "n": args.get("not_before"), "a": args.get("max_attempts"),
        "k": args.get("backoff"),
    }  # fmt: skip
    fields.update({k: v for k, v in lifecycle.items() if v is not None})
    return fingerprint(fields)


_Op = TypeVar("_Op", bound=Callable[..., Any])


def _operation(method: _Op) -> _Op:
    """Check that time does not go backwards; advance the engine's time only on success."""

    @functools.wraps(method)
    def run(self: BrokerEngine, now: float, **kwargs: Any) -> Any:
        if not now >= self.now:  # also refuses NaN
            raise Rejected(409, f"time went backwards: {now!r} after {self.now!r}")
        self.version += 1  # before: an operation that raises half way changed state too
        result = method(self, now, **kwargs)
        self.now = now
        if self.on_change is not None:
            self.on_change()
        return result

    return run  # type: ignore[return-value]


class BrokerEngine:
    """The broker's jobs, workers and leases; see the module docstring for the rules.

    Args:
        config: The broker configuration (dispatcher options, leases, retention).
    """

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.fleet: Any = make_fleet(config, self._lease_for)
        self.jobs: dict[str, JobRecord] = {}
        self.idempotency: dict[tuple[str, str], tuple[str, str]] = {}
        self.counter = 0
        self.now = -math.inf
        self.counts = {
            "submitted": 0, "done": 0, "failed": 0, "cancelled": 0, "expired": 0,
            "ttl_expired": 0, "retried": 0,
        }  # fmt: skip
        self.workers: dict[str, dict[str, Any]] = {}
        self.group_kept: dict[str, int] = {}
        """Kept records per dispatcher group (``group_key``); derived, not snapshotted."""
        self.job_bytes: dict[str, int] = {}
        self.member_bytes: dict[str, int] = {}
        self.total_bytes = 0
        """Payload bytes of unfinished jobs (see ``_budget``); derived, not snapshotted."""
        self.seen: dict[str, float] = {}
        """Worker -> when a pop, heartbeat, complete or fail last named it, oldest first."""
        self._retention: list[tuple[float, str]] = []
        self.version = 0
        """Counts the operations run (refused ones included); keys the read caches."""
        self._status: tuple[int, dict[str, Any]] | None = None
        self.on_change: Callable[[], None] | None = None
        """Called after each applied operation (the driver wakes long polls); not state."""
        self._ops: dict[str, Callable[..., Any]] = {
            "submit": self.submit,
            "cancel": self.cancel,
            "pop": self.pop,
            "complete": self.complete,
            "fail": self.fail,
            "heartbeat": self.heartbeat,
            "tick": self.tick,
            "cancel_group": self.cancel_group,
            "try_pop": self.try_pop,
            "leave": self.leave,
            "submit_many": self.submit_many,
            "refresh": self.refresh,
        }

    # ------------------------------------------------------------------ leases

    def _lease_for(self, job: Job, worker: Any) -> float:
        """The fleet's ``lease_for(job, worker)``: the image lease, x3 on a slow worker."""
        image = job.payload.get("image") if isinstance(job.payload, dict) else None
        slow = bool(getattr(worker, "slow", False))
        if image is None:
            base = self.config.default_lease_seconds
            return base * float(self.config.lease.extra_slow_multiplier) if slow else base
        request = ImageRequest.from_mapping({**image, "extra_slow_worker": slow})
        return float(self.config.lease.for_request(request))

    def check_image(self, image: Mapping[str, Any]) -> dict[str, Any]:
        """Validate lease inputs at submit time, so a pop never fails on them.

        Args:
            image: The ``image`` object of a submit.

        Returns:
            A plain dict of the inputs.

        Raises:
            Rejected: 422 naming the field that is wrong, or when the inputs give a lease
                over :data:`MAX_IMAGE_LEASE` seconds on a slow worker.
        """
        if "extra_slow_worker" in image:
            raise Rejected(
                422, "image.extra_slow_worker is set by the worker's 'slow' flag, not the job",
                field="image.extra_slow_worker",
            )  # fmt: skip
        try:
            request = ImageRequest.from_mapping(image)
            self.config.lease.for_request(request)
            slow = ImageRequest.from_mapping({**image, "extra_slow_worker": True})
            longest = self.config.lease.for_request(slow)  # an int: never overflows here
        except (TypeError, ValueError) as exc:
            raise Rejected(422, f"image: {exc}", field="image") from None
        if longest > MAX_IMAGE_LEASE:
            raise Rejected(
                422,
                f"image: these inputs give a lease over {MAX_IMAGE_LEASE:.0e} seconds on a slow "
                "worker; check width, height and steps",
                field="image",
            )
        return dict(image)

    # ------------------------------------------------------------------ driving

    def apply(self, op: str, args: Mapping[str, Any], now: float) -> Any:
        """Run one operation (the journal's unit).

        Args:
            op: The operation's name (``submit``, ``cancel``, ``cancel_group``, ``pop``,
                ``complete``, ``fail``, ``heartbeat`` or ``tick``).
            args: Its JSON arguments.
            now: The time it happens at (never earlier than the previous operation's).

        Returns:
            The operation's result.

        Raises:
            Rejected: The operation was refused and changed nothing.
            ValueError: ``op`` is unknown or ``now`` went backwards.
        """
        method = self._ops.get(op)
        if method is None:
            raise ValueError(f"unknown broker operation {op!r}; known: {', '.join(self._ops)}")
        return method(now=now, **args)

    def due(self, now: float) -> bool:
        """Whether a ``tick`` at ``now`` would change anything (a lease or retention ran out).

        Complexity: O(1).
        """
        deadline = self.fleet.next_deadline()
        if deadline is not None and deadline <= now:
            return True
        forget = self._forget_due()
        if forget is not None and forget <= now:
            return True
        return bool(self._retention) and self._retention[0][0] <= now

    def _forget_due(self) -> float | None:
        """When the least recently seen worker may be forgotten, or None. O(1)."""
        for seen in self.seen.values():
            return seen + self.config.forget_workers_seconds
        return None

    def _touch(self, worker: str, now: float) -> None:
        """The worker spoke: it becomes the most recently seen. O(1)."""
        self.seen.pop(worker, None)
        self.seen[worker] = now

    def next_due(self) -> float | None:
        """The earliest time at which :meth:`due` becomes true, or None. O(1)."""
        times = [self.fleet.next_deadline(), self._forget_due()]
        if self._retention:
            times.append(self._retention[0][0])
        known = [t for t in times if t is not None]
        return min(known) if known else None

    # ------------------------------------------------------------------ operations

    @_operation
    def submit(
        self,
        now: float,
        *,
        member: str,
        tier: str,
        priority: int,
        model: str | None = None,
        estimate: float | None = None,
        group: str | None = None,
        image: dict[str, Any] | None = None,
        payload: Any = None,
        idempotency_key: str | None = None,
        ttl: float | None = None,
        not_before: float | None = None,
        max_attempts: int | None = None,
        backoff: dict[str, Any] | None = None,
    ) -> tuple[JobRecord, bool]:
        """Queue a job; with an idempotency key already used by this member, return its job.

        ``ttl``, ``not_before``, ``max_attempts`` and ``backoff`` are the job lifecycle
        (docs/design/lifecycle.md): ``not_before`` is a time on the broker's clock (Unix
        seconds).

        Returns:
            ``(record, created)``.

        Raises:
            Rejected: 422 the key was used with a different request, or a bad ``backoff``;
                429 the queue (or the level's ``max_queued``) is full, or a queued-bytes
                budget would be passed; 413 the payload alone is over one; 503 the forecast
                wait is over the level's ``max_wait``.
        """
        _check_types(
            "submit",
            member=(member, str), tier=(tier, str), priority=(priority, int),
            model=(model, (str, type(None))), estimate=(estimate, (int, float, type(None))),
            group=(group, (str, type(None))), image=(image, (dict, type(None))),
            idempotency_key=(idempotency_key, (str, type(None))),
        )  # fmt: skip
        digest = ""
        if idempotency_key is not None:
            digest = submit_digest(
                {"priority": priority, "model": model, "estimate": estimate, "group": group,
                 "image": image, "payload": payload, "ttl": ttl, "not_before": not_before,
                 "max_attempts": max_attempts, "backoff": backoff}
            )  # fmt: skip
            known = self.idempotency.get((member, idempotency_key))
            if known is not None:
                job_id, previous = known
                if previous != digest:
                    raise Rejected(
                        422,
                        "Idempotency-Key was already used with a different request body",
                        field="Idempotency-Key",
                    )
                return attrs.evolve(self.jobs[job_id]), False
        size = _budget.size_of(payload, image)
        _budget.admit(self, member, size)
        job_id = f"job-{self.counter + 1}"
        try:
            retry = None if backoff is None else Backoff.from_mapping(backoff)
        except ConfigError as exc:
            raise Rejected(422, str(exc), field="backoff") from None
        try:
            ticket = self.fleet.submit(
                job_id,
                member=member,
                priority=priority,
                tier=tier,
                model=model,
                estimate=estimate,
                payload={"image": image},
                group=None if group is None else group_key(member, group),
                ceiling=priority,  # resolved under the key's ceiling: kept below the minimum
                now=now,
                ttl=ttl,
                not_before=not_before,
                max_attempts=max_attempts,
                backoff=retry,
            )
        except Overloaded as exc:
            raise Rejected(503, str(exc), field="max_wait", retry_after=exc.retry_after) from None
        except QueueFull as exc:
            field = "max_queued" if exc.scope == "level" else None
            raise Rejected(429, str(exc), field=field, retry_after=exc.retry_after) from None
        except DuplicateJob as exc:  # pragma: no cover - ids are never reused
            raise AssertionError(str(exc)) from None
        self.counter += 1
        self.counts["submitted"] += 1
        record = JobRecord(
            id=job_id, member=member, priority=priority, model=model, estimate=estimate,
            group=group, image=image, payload=payload, submitted_at=now,
            idempotency_key=idempotency_key, expires_at=ticket.job.deadline,
            max_attempts=max_attempts,
        )  # fmt: skip
        self.jobs[job_id] = record
        _groups.kept(self, record)
        _budget.held(self, record, size)
        if idempotency_key is not None:
            self.idempotency[(member, idempotency_key)] = (job_id, digest)
        return attrs.evolve(record), True

    def owned(self, job_id: str, member: str | None) -> JobRecord:
        """The record of ``job_id`` if ``member`` may see it (None: anyone).

        Raises:
            Rejected: 404 when it is unknown or belongs to another member.
        """
        record = self.jobs.get(job_id)
        if record is None or (member is not None and record.member != member):
            raise Rejected(404, f"no job {job_id!r}", field="id")
        return record

    @_operation
    def cancel(self, now: float, *, job_id: str, member: str | None) -> JobRecord:
        """Cancel a queued or running job of ``member``; a finished job stays as it is.

        Raises:
            Rejected: 404 unknown or another member's; 409 already finished.
        """
        record = self.owned(job_id, member)
        if record.state in FINISHED:
            raise Rejected(409, f"job {job_id!r} is already {record.state}", field="id")
        self.fleet.cancel(job_id, now=now)
        self._finish(record, "cancelled", None, now)
        return attrs.evolve(record)

    @_operation
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

    def _join(self, now: float, worker: str, spec: dict[str, Any]) -> None:
        if self.workers.get(worker) != spec:
            self.fleet.join(worker, now=now, **spec)
            self.workers[worker] = spec
        else:
            self.fleet.heartbeat(worker, now=now)

    @_operation
    def pop(
        self,
        now: float,
        *,
        worker: str,
        models: list[str] | None = None,
        resident: str | None = None,
        slots: int = 1,
        slow: bool = False,
    ) -> PopResult:
        """Grant the worker its next job, or say why there is none."""
        _check_types(
            "pop", worker=(worker, str), models=(models, (list, type(None))),
            resident=(resident, (str, type(None))), slots=(slots, int), slow=(slow, (bool,)),
        )  # fmt: skip
        spec = {"models": models, "resident": resident, "slots": slots, "slow": slow}
        self._join(now, worker, spec)
        self._touch(worker, now)
        grant = self.fleet.pop(worker, now=now)
        if grant is None:
            reasons = self.fleet.idle_reasons(worker, now=now)
            return PopResult(None, {str(k): int(v) for k, v in reasons.items() if v})
        return PopResult(self._granted(worker, grant, now), {})

    def _granted(self, worker: str, grant: Any, now: float) -> JobRecord:
        """Record the fleet's grant on the job's record; returns a copy of the record."""
        record = self.jobs[grant.job.id]
        record.state = "running"
        record.attempt = grant.attempt
        record.worker = worker
        lease = grant.lease
        record.lease_seconds = lease.seconds
        record.deadline = lease.deadline
        record.granted_at = now
        return attrs.evolve(record)

    def _held(self, job_id: str, worker: str, attempt: int) -> JobRecord:
        record = self.jobs.get(job_id)
        if record is None:
            raise Rejected(404, f"no job {job_id!r}", field="id")
        if record.state != "running":
            raise Rejected(
                409, f"job {job_id!r} is {record.state}, not running on {worker!r}", field="id"
            )
        if record.worker != worker or record.attempt != attempt:
            raise Rejected(
                409,
                f"job {job_id!r} is held by another grant (worker/attempt do not match the "
                "current one); this worker lost it",
                field="worker" if record.worker != worker else "attempt",
            )
        if record.deadline is not None and now_past(self.now, record.deadline):
            raise Rejected(409, f"job {job_id!r}: the lease ran out; it is being requeued")
        return record

    def _check_result(self, result: Any) -> None:
        size = len(json.dumps(result, separators=(",", ":")).encode())
        if size > self.config.result_max_bytes:
            raise Rejected(
                413,
                f"result is {size} bytes, over result_max_bytes={self.config.result_max_bytes}",
                field="result",
            )

    @_operation
    def complete(
        self, now: float, *, job_id: str, worker: str, attempt: int, result: Any = None
    ) -> JobRecord:
        """The holder finished the job: it is done and its result kept.

        Raises:
            Rejected: 404 unknown; 409 not this worker's current grant; 413 result too large.
        """
        _check_types("complete", job_id=(job_id, str), worker=(worker, str), attempt=(attempt, int))
        record = self._held(job_id, worker, attempt)
        self._check_result(result)
        self.fleet.complete(job_id, now=now, worker=worker)
        self._touch(worker, now)
        self._finish(record, "done", result, now)
        return attrs.evolve(record)

    @_operation
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
        _check_types("fail", job_id=(job_id, str), worker=(worker, str), attempt=(attempt, int))
        record = self._held(job_id, worker, attempt)
        self._check_result(result)
        self.fleet.fail(job_id, now=now, worker=worker, retry=retry)  # its group counts it
        self._touch(worker, now)
        if job_id in self.fleet:  # requeued: still unfinished, its bytes stay counted
            self.counts["retried"] += 1
            record.state = "queued"
            record.worker = None
            record.deadline = None
            record.result = result
            return attrs.evolve(record)
        self._finish(record, "failed", result, now)
        return attrs.evolve(record)

    @_operation
    def heartbeat(
        self, now: float, *, worker: str, resident: str | None = None
    ) -> list[dict[str, Any]]:
        """A worker is alive: returns the jobs it holds (id, attempt, deadline).

        A worker that lost a pop's answer (a broker restart) learns here what it holds.

        Raises:
            Rejected: 404 the worker never popped.
        """
        spec = self.workers.get(worker)
        if spec is None:
            raise Rejected(404, f"no worker {worker!r} (pop once to join)", field="worker")
        if resident is not None and spec["resident"] != resident:
            self._join(now, worker, {**spec, "resident": resident})
        else:
            self.fleet.heartbeat(worker, now=now)
        self._touch(worker, now)
        held = [r for r in self.jobs.values() if r.worker == worker and r.state == "running"]
        held.sort(key=lambda r: int(r.id.rpartition("-")[2]))
        return [{"id": r.id, "attempt": r.attempt, "deadline": r.deadline} for r in held]

    # ------------------------------------------------------------------ clients (long-poll)

    def try_pop(
        self,
        now: float,
        *,
        worker: str,
        models: list[str] | None = None,
        resident: str | None = None,
        slots: int = 1,
        slow: bool = False,
    ) -> PopResult | None:
        """:meth:`pop`, except that a pop that would change nothing returns None.

        A known worker whose settings are unchanged, that has not timed out and whose last
        journaled word is under ``worker_timeout / 2`` old, and that is granted nothing,
        leaves the state exactly as it was (its liveness is not refreshed): the driver answers
        such a call without journaling it (``skip_when_empty``), so waiting and empty pops
        write nothing. Any other case is :meth:`pop` (journaled): a join, a change of
        settings, a refresh of liveness at most once per ``worker_timeout / 2``, or a grant.

        Returns:
            The :class:`PopResult` of a journaled pop, or None (nothing changed).

        Raises:
            Rejected: 409 time went backwards.

        Complexity: :meth:`pop`'s; O(1) when the worker's slots are full or nothing is queued.
        """
        if not now >= self.now:
            raise Rejected(409, f"time went backwards: {now!r} after {self.now!r}")
        spec = {"models": models, "resident": resident, "slots": slots, "slow": slow}
        state = self._fresh_worker(worker, spec, now)
        if state is None:
            return self.pop(now, **{"worker": worker, **spec})  # type: ignore[arg-type]
        if len(state.held) >= state.slots or len(self.fleet) == 0:
            return None
        seen, clock = state.last_seen, self.fleet._now
        grant = self.fleet.pop(worker, now=now)
        if grant is None:
            # As if the pop never happened: the worker's last word and the fleet's clock
            # (reads pass the engine's time, which a skipped pop does not advance).
            state.last_seen = seen
            self.fleet._now = clock
            return None
        self.now = now
        return PopResult(self._granted(worker, grant, now), {})

    def _fresh_worker(self, worker: str, spec: Mapping[str, Any], now: float) -> Any:
        """The fleet's worker when a pop need not refresh or update it, else None. O(1)."""
        if self.workers.get(worker) != spec:
            return None
        state = self.fleet._workers.get(worker)  # the core's worker record (last_seen, held)
        timeout = self.config.worker_timeout_seconds
        if state is None or state.timed_out:
            return None
        if timeout is not None and now - state.last_seen >= timeout / 2:
            return None
        return state

    def liveness_due(self, worker: str) -> float | None:
        """When a waiting ``worker``'s liveness must next be journaled (None: never). O(1)."""
        timeout = self.config.worker_timeout_seconds
        state = self.fleet._workers.get(worker)
        if timeout is None or state is None:
            return None
        return float(state.last_seen) + timeout / 2

    @_operation
    def refresh(self, now: float, *, workers: list[str]) -> int:
        """Waiting workers are alive: one journaled event for every long poll of the fleet.

        Names of workers that are not known (they left meanwhile) are skipped.

        Returns:
            How many workers were marked alive.

        Complexity: O(len(workers)).
        """
        count = 0
        for name in workers:
            if name in self.workers:
                self.fleet.heartbeat(name, now=now)
                count += 1
        return count

    @_operation
    def leave(self, now: float, *, worker: str) -> list[str]:
        """A worker leaves: the jobs it holds go back to the heads of their lanes.

        Leaving is not the jobs' fault: they are requeued whatever their attempt count.

        Returns:
            The ids of the jobs requeued, in submission order.

        Raises:
            Rejected: 404 the worker never popped (or already left).

        Complexity: O(slots log n).
        """
        if worker not in self.workers:
            raise Rejected(404, f"no worker {worker!r} (pop once to join)", field="worker")
        requeued = [job.id for job in self.fleet.leave(worker, now=now)]
        for job_id in requeued:
            record = self.jobs[job_id]
            record.state = "queued"
            record.worker = None
            record.deadline = None
        del self.workers[worker]
        return requeued

    @_operation
    def submit_many(
        self, now: float, *, jobs: list[dict[str, Any]]
    ) -> list[tuple[JobRecord, bool]]:
        """Submit every job of a batch, or none: one journaled operation.

        Each item holds :meth:`submit`'s keyword arguments. The refusals :meth:`submit` can
        make (a reused idempotency key with a different body, ``max_queued``,
        ``max_queued_per_member``) are checked for the whole batch first, so a refused batch
        changes nothing. A refusal that still happened half way would be a bug: it escapes
        as ``RuntimeError`` and the driver stops (crash-only), so the batch is never half
        applied.

        Returns:
            ``(record, created)`` per job, in order.

        Raises:
            Rejected: 422 an empty batch or a reused key; 429 the batch does not fit.

        Complexity: O(b (log n + M)) for b jobs.
        """
        if not jobs:
            raise Rejected(422, "jobs: a batch holds at least one job", field="jobs")
        fresh: dict[str, int] = {}
        new: list[dict[str, Any]] = []
        for args in jobs:
            key = args.get("idempotency_key")
            member = args["member"]
            if key is not None and (member, key) in self.idempotency:
                if self.idempotency[(member, key)][1] != submit_digest(args):
                    raise Rejected(
                        422,
                        "Idempotency-Key was already used with a different request body",
                        field="Idempotency-Key",
                    )
                continue
            fresh[member] = fresh.get(member, 0) + 1
            if args.get("backoff") is not None:
                try:
                    Backoff.from_mapping(args["backoff"])
                except ConfigError as exc:
                    raise Rejected(422, str(exc), field="backoff") from None
            new.append(args)
        self._check_room(fresh)
        self._check_budgets(new, now)
        results: list[tuple[JobRecord, bool]] = []
        for index, args in enumerate(jobs):
            try:
                results.append(self.submit(now, **args))
            except Rejected as exc:
                if index == 0:
                    raise
                raise RuntimeError(f"a batch was refused half way (a bug): {exc}") from exc
        return results

    def _check_budgets(self, jobs: list[dict[str, Any]], now: float) -> None:
        """Refuse a batch that a level's budget would refuse half way.

        The core's checks (``max_queued``, ``max_wait``), run over the batch in order without
        changing anything.

        Raises:
            Rejected: 429 a level's ``max_queued``; 503 a level's forecast wait over
                ``max_wait``.

        Complexity: O(b x levels) for b new jobs.
        """
        from prioqueue._core import DEFAULT_EXPECTED_RUNTIME
        from prioqueue._core.queue import forecast_wait

        core = self.fleet
        budgets = core._budgets
        if not budgets:
            return
        added: dict[int, int] = {}  # queued (not delayed) jobs of the batch so far, per level
        held: dict[int, int] = {}  # queued or delayed, per level
        for args in jobs:
            level = int(core.policy.parse(args["priority"]))
            budget = budgets.get(level)
            not_before = args.get("not_before")
            delayed = not_before is not None and not_before > now
            if budget is not None and budget.max_queued is not None:
                stats = core._levels.get(level)
                queued = (0 if stats is None else stats.queued) + core._parked.get(level, 0)
                if queued + held.get(level, 0) >= budget.max_queued:
                    raise Rejected(
                        429,
                        f"the batch does not fit level {level}: it holds {queued} queued or "
                        f"delayed jobs, its limit max_queued={budget.max_queued}",
                        field="max_queued",
                        retry_after=core._retry_after(),
                    )
            if budget is not None and budget.max_wait is not None and not delayed:
                extra = 0.0
                for number, count in added.items():
                    if number >= level:
                        recent = core._recent_level.get(number)
                        mean = sum(recent) / len(recent) if recent else DEFAULT_EXPECTED_RUNTIME
                        extra += count * mean
                wait = forecast_wait(core._state, level) + extra / max(1, core._live)
                if wait > budget.max_wait:
                    raise Rejected(
                        503,
                        f"the batch does not fit level {level}: the forecast wait would be "
                        f"{wait:.0f} s, over its budget (max_wait={budget.max_wait:g} s)",
                        field="max_wait",
                        retry_after=float(max(1, math.ceil(wait - budget.max_wait))),
                    )
            held[level] = held.get(level, 0) + 1
            if not delayed:
                added[level] = added.get(level, 0) + 1

    def _check_room(self, fresh: Mapping[str, int]) -> None:
        """Refuse (429) a batch that ``max_queued`` or ``max_queued_per_member`` cannot hold."""
        total = sum(fresh.values())
        limit = self.config.max_queued
        if limit is not None and len(self.fleet) + total > limit:
            raise Rejected(
                429,
                f"the batch of {total} new jobs does not fit: the queue holds "
                f"{len(self.fleet)} jobs, its limit max_queued={limit}",
                retry_after=self.config.retry_after_seconds,
            )
        per_member = self.config.max_queued_per_member
        if per_member is None:
            return
        for member, count in fresh.items():
            stats = self.fleet._members.get(member)  # the core's per-member counts
            queued = 0 if stats is None else int(stats.queued)
            if queued + count > per_member:
                raise Rejected(
                    429,
                    f"the batch of {count} new jobs of member {member!r} does not fit: it has "
                    f"{queued} queued, its limit max_queued_per_member={per_member}",
                    retry_after=self.config.retry_after_seconds,
                )

    @_operation
    def tick(self, now: float) -> list[str]:
        """Take back expired leases; forget old records and silent workers.

        Records past their retention are dropped, and so are workers silent for
        ``forget_workers_seconds`` (one that still holds a job is kept, and looked at again
        that much later).

        Returns:
            The ids of the jobs whose lease ran out.
        """
        taken: list[str] = []
        for expired in self.fleet.expire(now):
            record = self.jobs[expired.job.id]
            if expired.cause == "ttl":  # still queued at its deadline
                self._finish(record, "expired", None, now)
                continue
            self.counts["expired"] += 1
            taken.append(record.id)
            if expired.requeued:
                record.state = "queued"
                record.worker = None
                record.deadline = None
            else:
                self._finish(record, "failed", {"error": "lease expired on every attempt"}, now)
        while self._retention and self._retention[0][0] <= now:
            _, job_id = heapq.heappop(self._retention)
            gone = self.jobs.pop(job_id, None)
            if gone is not None:
                if gone.idempotency_key is not None:
                    self.idempotency.pop((gone.member, gone.idempotency_key), None)
                _groups.released(self, gone)
        self._forget_workers(now)
        return taken

    def _forget_workers(self, now: float) -> None:
        """O(f log n) for f workers forgotten or looked at."""
        horizon = now - self.config.forget_workers_seconds
        while self.seen:
            worker, seen = next(iter(self.seen.items()))
            if seen > horizon:
                return
            if worker in self.workers and self.fleet.worker(worker).held:
                self._touch(worker, now)
                continue
            del self.seen[worker]
            if self.workers.pop(worker, None) is not None:
                self.fleet.leave(worker, now=now)

    def _finish(self, record: JobRecord, state: JobStatus, result: Any, now: float) -> None:
        record.state = state
        record.result = result
        record.finished_at = now
        record.deadline = None
        # "expired" in the counts is leases that ran out (kept as it was); ttl expiries apart.
        self.counts["ttl_expired" if state == "expired" else state] += 1
        _budget.released(self, record)
        heapq.heappush(self._retention, (now + self.config.result_ttl_seconds, record.id))

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
            explanation = self.fleet.explain(
                record.id, now=self.now, ahead_limit=AHEAD_LIMIT, overtakes_limit=20
            )
        except (UnknownJob, InvalidState):  # pragma: no cover - records mirror the fleet
            return None, None
        if sees is not None:
            explanation = _redacted(explanation, sees)
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
            value: float | None = self.fleet.not_before(record.id)
        except UnknownJob:  # pragma: no cover - records mirror the fleet
            return None
        return value

    def status(self) -> dict[str, Any]:
        """Counts by state, workers and totals (for ``GET /v1/status``), a fresh dict.

        Complexity: O(1) when no operation ran since the last call (the counts are cached
        by :attr:`version`), else O(jobs kept).
        """
        cached = self._status
        if cached is None or cached[0] != self.version:
            states = dict.fromkeys(
                ("queued", "running", "done", "failed", "cancelled", "expired"), 0
            )
            for record in self.jobs.values():
                states[record.state] = states.get(record.state, 0) + 1
            cached = self._status = (self.version, states)
        return {"jobs": dict(cached[1]), "workers": len(self.workers), "totals": dict(self.counts)}

    # ------------------------------------------------------------------ persistence

    def snapshot(self, *, now: float | None = None) -> dict[str, Any]:
        """The whole state as JSON data; :meth:`restore` rebuilds it exactly. O(n).

        Args:
            now: Used only before the first operation (the state is as of the last one).

        Returns:
            Plain JSON data.
        """
        at = self.now if math.isfinite(self.now) else (0.0 if now is None else now)
        return {
            "format": SNAPSHOT_FORMAT,
            "now": at,
            "counter": self.counter,
            "counts": dict(self.counts),
            "workers": dict(self.workers),
            "fleet": self.fleet.snapshot(now=at),
            # Shallow: payloads and results are shared, not copied (they are never changed
            # in place), so a snapshot costs O(jobs) on the loop, not O(bytes) (issue 21);
            # the store encodes them in its writer thread.
            "jobs": [attrs.asdict(r, recurse=False) for r in self.jobs.values()],
            "idempotency": [[m, k, j, d] for (m, k), (j, d) in self.idempotency.items()],
            "retention": [list(entry) for entry in self._retention],
            "seen": [[worker, seen] for worker, seen in self.seen.items()],
        }

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
        engine.now = float(state["now"])
        engine.counter = int(state["counter"])
        engine.counts.update(state["counts"])
        engine.workers = dict(state["workers"])
        engine.fleet = restore_fleet(state["fleet"], config, engine._lease_for)
        for data in state["jobs"]:
            record = JobRecord(**data)
            engine.jobs[record.id] = record
            _groups.kept(engine, record)
            if record.state not in FINISHED:
                _budget.held(engine, record)
        if "seen" in state:
            engine.seen = {str(w): float(t) for w, t in state["seen"]}
        else:  # a snapshot from before workers were forgotten: as the fleet last saw them
            infos = sorted(engine.fleet.workers(), key=lambda info: (info.last_seen, info.name))
            engine.seen = {info.name: float(info.last_seen) for info in infos}
        for member, key, job_id, digest in state["idempotency"]:
            engine.idempotency[(member, key)] = (job_id, digest)
        engine._retention = [(float(t), str(i)) for t, i in state["retention"]]
        heapq.heapify(engine._retention)
        return engine


def _check_types(op: str, **values: tuple[Any, type | tuple[type, ...]]) -> None:
    """Refuse an operation whose arguments do not have the types the HTTP layer guarantees.

    A live request never fails here (its body was validated); a journal row edited by hand
    does, so replay stops with a clear ``CorruptStore`` instead of serving a record that
    answers 500 later (issue 21). Booleans are not numbers. O(number of arguments).

    Raises:
        Rejected: 422 naming the first argument of the wrong type.
    """
    for name, (value, types) in values.items():
        if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else ()):
            ok = False
        else:
            ok = isinstance(value, types)
        if ok and isinstance(value, float) and not math.isfinite(value):
            ok = False
        if not ok:
            raise Rejected(422, f"{op}: {name} has the wrong type or value ({value!r})", field=name)


_HIDDEN_JOB: Final = "(hidden)"
_HIDDEN_MEMBER: Final = "(another member)"


def _redacted(explanation: Any, sees: Callable[[str], bool]) -> Any:
    """``explanation`` with other members' jobs anonymised (ids and members). O(ahead)."""

    def hide(entry: Any) -> Any:
        if sees(entry.member):
            return entry
        return attrs.evolve(entry, job_id=_HIDDEN_JOB, member=_HIDDEN_MEMBER)

    return attrs.evolve(
        explanation,
        ahead=tuple(hide(entry) for entry in explanation.ahead),
        overtaken_by=tuple(hide(entry) for entry in explanation.overtaken_by),
    )


def now_past(now: float, deadline: float) -> bool:
    """Whether ``now`` is at or past a lease ``deadline`` (the lease has run out). O(1)."""
    return now >= deadline
