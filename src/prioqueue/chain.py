"""``Chain``: submit a sequence of jobs (a film's shots) a few at a time, sans-IO.

Theory of operation (the contract, with its invariants, is docs/design/chains.md):

* A chain holds a sequence of job specs and keeps at most ``depth`` of them **in flight**
  (submitted, not yet reported finished). ``depth=1`` is the seed's one-at-a-time producer:
  the next shot is queued when the previous one finishes, so an interactive request never
  waits behind more than the shot in progress, and the film's lane is lifted like any
  returning member's.
* Every job of the chain is submitted with the chain's **group**, so ``group_status`` (counts,
  GPU time, a finish forecast) and ``cancel_group`` see the film as one thing.
* The caller drives it, as it drives the dispatcher: after ``complete`` it calls
  :meth:`Chain.completed`; when a job's work fails it calls :meth:`Chain.failed`, which
  applies the failure policy. Each call returns a :class:`ChainStep`: what was submitted and
  cancelled. Nothing here reads a clock: every call takes ``now``.
* Submitting never loses a spec: when the dispatcher's queue is full the spec stays pending,
  the step says when to retry (``retry_after``), and :meth:`Chain.top_up` submits it later.

The dispatcher may be a ``SizeOneDispatcher``, a ``FleetDispatcher`` or anything with their
``submit`` / ``cancel`` / ``fail`` / ``state`` / ``group_status`` methods (the asyncio adapter
passes its own; see :meth:`prioqueue.asyncio.AsyncDispatcher.chain`).

Costs: each call is O(1) plus the dispatcher calls it makes (one submit per job started, one
cancel per job cancelled); ``forecast_finish`` is one ``group_status`` plus O(pending).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, Protocol, TypedDict

import attrs

from prioqueue._chain_specs import check_spec_keys, checked_policy, checked_specs
from prioqueue._groups import CancelRunning, checked_group, checked_running
from prioqueue._readonly import ReadOnly
from prioqueue._validate import finite
from prioqueue.errors import ConfigError, InvalidState, QueueFull, UnknownGroup, UnknownJob
from prioqueue.records import Job, Ticket
from prioqueue.views import GroupStatus

__all__ = [
    "Chain",
    "ChainOptions",
    "ChainProgress",
    "ChainState",
    "ChainStep",
    "ChainTarget",
    "FailurePolicy",
]

#: What a chain does when a job fails: stop, skip it, or retry it up to n times (then stop).
FailurePolicy = Literal["stop", "skip"] | tuple[Literal["retry"], int]
#: Where a chain is: not started, submitting, every spec handled, stopped by a failure, or
#: cancelled.
ChainState = Literal["new", "running", "finished", "stopped", "cancelled"]


class ChainOptions(TypedDict, total=False):
    """The optional keyword arguments of :class:`Chain` (defaults and meaning there).

    The asyncio driver's ``chain()`` takes them as ``**options: Unpack[ChainOptions]`` and
    passes them on, so the list and its defaults are written once, in ``Chain``.
    """

    depth: int
    group: str | None
    on_failure: FailurePolicy


class ChainTarget(Protocol):
    """What a chain needs of a dispatcher (``SizeOneDispatcher`` and ``FleetDispatcher`` fit)."""

    @property
    def submit(self) -> Callable[..., Ticket]:
        """``submit(job_id, *, group=..., now=..., **spec) -> Ticket``."""

    def cancel(self, job_id: str, *, now: float) -> Job:
        """Remove a queued or running job."""

    def fail(self, job_id: str, *, now: float) -> Job:
        """Remove a queued or running job whose work failed."""

    def state(self, job_id: str) -> Literal["queued", "running"]:
        """Return the state of a queued or running job."""

    def group_status(self, group: str, *, now: float) -> GroupStatus:
        """Return a group's status."""

    def __contains__(self, job_id: object) -> bool:
        """Return whether a job is queued or running."""


@attrs.frozen
class ChainStep:
    """What one call on a chain did.

    Attributes:
        submitted: The tickets of the jobs it submitted (a retry resubmits the same id).
        cancelled: The jobs it cancelled (a ``"stop"`` failure, or ``cancel``).
        retry_after: Set when the dispatcher's queue was full: the spec stays pending;
            call ``top_up`` after about this many seconds. None otherwise.
    """

    submitted: tuple[Ticket, ...] = ()
    cancelled: tuple[Job, ...] = ()
    retry_after: float | None = None


@attrs.frozen
class ChainProgress:
    """How far a chain has got (``chain.progress``).

    Attributes:
        state: ``"new"``, ``"running"``, ``"finished"``, ``"stopped"`` or ``"cancelled"``.
        total: Specs in the chain.
        done: Jobs reported completed.
        failed: Jobs that failed for good (skipped, or the one that stopped the chain).
        retries: Resubmissions after failures.
        cancelled: Jobs the chain cancelled (a stop, or ``cancel``).
        in_flight: Ids of the jobs submitted and not yet reported, oldest first.
        pending: Specs not submitted yet (never, once the chain stopped or was cancelled).
    """

    state: ChainState
    total: int
    done: int
    failed: int
    retries: int
    cancelled: int
    in_flight: tuple[str, ...]
    pending: int

    @property
    def finished(self) -> bool:
        """True when nothing is in flight and nothing more will be submitted."""
        return (
            self.state != "new"
            and not self.in_flight
            and (self.state != "running" or self.pending == 0)
        )


class Chain:
    """A sequence of jobs submitted ``depth`` at a time under one group.

    Args:
        dispatcher: Where the jobs go: a ``SizeOneDispatcher``, a ``FleetDispatcher``, or
            anything with their ``submit``, ``cancel``, ``fail``, ``state``, ``group_status``
            and ``in``.
        specs: The jobs in order, each a mapping of ``submit()``'s keyword arguments plus
            ``job_id`` (without ``now`` and ``group``: the chain passes them). Job ids must
            be unique within the chain.
        depth: Most jobs in flight at once (>= 1). 1 submits the next job when the previous
            one finishes.
        group: The group label of every job (None: the first spec's ``job_id``).
        on_failure: ``"stop"`` (submit nothing more and cancel the chain's queued jobs; a
            running one may still complete), ``"skip"`` (go on with the next spec) or
            ``("retry", n)`` (resubmit the failed job, up to n times per job, then stop).

    Attributes:
        group: The group label of the chain's jobs.
        depth: Most jobs in flight at once.
        dispatcher: The dispatcher the jobs go to.

    Raises:
        TypeError: ``dispatcher`` lacks a method a chain needs, or ``specs`` is not an
            iterable of mappings.
        ValueError: A spec has no job_id, repeats one, sets ``now`` or ``group``, sets a key
            the dispatcher's ``submit`` does not take or lacks one it requires; or
            ``specs`` is empty; or ``group`` is not a non-empty str.
        ConfigError: ``depth`` or ``on_failure`` is out of range.

    Example:
        >>> from prioqueue import SizeOneDispatcher
        >>> gpu = SizeOneDispatcher()
        >>> shots = [{"job_id": f"shot-{i}", "member": "dora", "priority": "batch",
        ...           "estimate": 240.0} for i in range(1, 4)]
        >>> film = Chain(gpu, shots, group="film-1")
        >>> film.start(now=0.0).submitted[0].job.id
        'shot-1'
        >>> gpu.dispatch(0.0).job.id
        'shot-1'
        >>> _ = gpu.complete("shot-1", now=240.0)
        >>> film.completed("shot-1", now=240.0).submitted[0].job.id
        'shot-2'
        >>> film.progress.done, film.progress.pending
        (1, 1)
    """

    def __init__(
        self,
        dispatcher: ChainTarget,
        specs: Iterable[Mapping[str, Any]],
        *,
        depth: int = 1,
        group: str | None = None,
        on_failure: FailurePolicy = "stop",
    ) -> None:
        for name in ("submit", "cancel", "fail", "state", "group_status", "__contains__"):
            if not callable(getattr(dispatcher, name, None)):
                raise TypeError(
                    f"dispatcher must have a {name}() method (a SizeOneDispatcher or "
                    f"FleetDispatcher), got {type(dispatcher).__name__}"
                )
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 1:
            raise ConfigError(f"depth must be an int >= 1, got {depth!r}")
        self._policy, self._retry_limit = checked_policy(on_failure)
        self._specs = checked_specs(specs)
        check_spec_keys(dispatcher.submit, self._specs)
        self._d = dispatcher
        self._depth = depth
        self._group = self._specs[0][0] if group is None else checked_group(group)
        self._pending: deque[tuple[str, dict[str, Any]]] = deque(self._specs)
        self._flight: dict[str, dict[str, Any]] = {}  # in flight, oldest first
        self._retried: dict[str, int] = {}
        self._state: ChainState = "new"
        self._done = 0
        self._failed = 0
        self._retries = 0
        self._cancelled = 0

    # ------------------------------------------------------------------ reading

    group = ReadOnly[str]("_group", "The group label of the chain's jobs.")
    depth = ReadOnly[int]("_depth", "Most jobs in flight at once.")
    dispatcher = ReadOnly[ChainTarget]("_d", "The dispatcher the jobs go to.")

    @property
    def progress(self) -> ChainProgress:
        """The chain's counts and state, as of its last call. O(in flight).

        A ``cancel_group`` made on the dispatcher directly is seen at the chain's next call
        that takes ``now`` (``status``, ``top_up``, ``completed``, ``failed``); to stop a
        chain at once, call :meth:`cancel` on it.
        """
        return ChainProgress(
            state=self._state,
            total=len(self._specs),
            done=self._done,
            failed=self._failed,
            retries=self._retries,
            cancelled=self._cancelled,
            in_flight=tuple(self._flight),
            pending=len(self._pending) if self._state in ("new", "running") else 0,
        )

    def status(self, *, now: float) -> GroupStatus:
        """Return the group's status (``dispatcher.group_status(chain.group, now=now)``).

        Its forecast covers the submitted jobs only; :meth:`forecast_finish` adds the
        pending ones. Like every call with ``now``, it notices a ``cancel_group`` made on the
        dispatcher directly: the chain is then ``"cancelled"`` (see :meth:`cancel`).

        Raises:
            UnknownGroup: The chain has not submitted anything yet.
            ValueError: ``now`` is out of range.
        """
        status = self._d.group_status(self._group, now=now)
        self._notice_outside_cancel(status)
        return status

    def forecast_finish(self, *, now: float) -> float | None:
        """Predict when the chain's last job finishes.

        The group's forecast (the dry run of ``forecast()``) for the submitted jobs, plus the
        expected runtimes of the pending specs (their ``estimate``, else the group's mean
        runtime) run back to back after it. Exact when estimates are exact and nothing else
        is queued or arrives; other work that would run between two of the chain's jobs is
        not counted, so the forecast is early by that work under load.

        Args:
            now: The current monotonic time.

        Returns:
            The predicted finish; ``now`` when nothing is left; None when a runtime is unknown
            or the chain has not started.

        Raises:
            ValueError: ``now`` is out of range.
        """
        t = finite("now", now)
        if self._state == "new":
            return None
        pending = list(self._pending) if self._state == "running" else []
        if not self._flight and not pending:
            return t
        finish, mean = t, None
        if self._flight:
            status = self._d.group_status(self._group, now=t)
            if status.forecast_finish is None:
                return None
            finish, mean = status.forecast_finish, status.mean_runtime
        else:  # nothing submitted now (a full queue): the pending specs from now on
            try:
                mean = self._d.group_status(self._group, now=t).mean_runtime
            except UnknownGroup:
                mean = None
        for _, spec in pending:
            estimate = spec.get("estimate")
            seconds = estimate if estimate is not None else mean
            if not isinstance(seconds, (int, float)):
                return None
            finish += seconds
        return finish

    # ------------------------------------------------------------------ driving

    def start(self, *, now: float) -> ChainStep:
        """Submit the first ``depth`` jobs.

        Args:
            now: The current monotonic time.

        Returns:
            What was submitted (``retry_after`` set when the queue was full).

        Raises:
            InvalidState: The chain was already started.
            ValueError, TypeError, DuplicateJob: A spec's arguments were refused by the
                dispatcher's ``submit`` (the spec stays pending; nothing else changed for it).
        """
        if self._state != "new":
            raise InvalidState(f"chain {self._group!r} was already started")
        self._state = "running"
        return self._fill(now)

    def top_up(self, *, now: float) -> ChainStep:
        """Submit pending jobs until ``depth`` are in flight (after a full queue, say).

        Raises:
            InvalidState: The chain was not started.
            ValueError, TypeError, DuplicateJob: As for :meth:`start`.
        """
        if self._state == "new":
            raise InvalidState(f"chain {self._group!r} was not started; call start()")
        return self._fill(now)

    def completed(self, job_id: str, *, now: float) -> ChainStep:
        """Record that a job completed (after the dispatcher's ``complete``); submit the next.

        Args:
            job_id: A job of the chain in flight.
            now: The current monotonic time.

        Returns:
            What was submitted.

        Raises:
            UnknownJob: The job is not in flight in this chain.
            InvalidState: The dispatcher still holds the job: ``complete`` it first.
            ValueError, TypeError, DuplicateJob: As for :meth:`start` (the completion is
                recorded; the refused spec stays pending).
        """
        self._in_flight(job_id)
        if job_id in self._d:
            raise InvalidState(
                f"job {job_id!r} is still {self._d.state(job_id)} in the dispatcher; "
                "complete it there first, then tell the chain"
            )
        del self._flight[job_id]
        self._done += 1
        return self._fill(now)

    def failed(self, job_id: str, *, now: float) -> ChainStep:
        """Record that a job failed and apply the failure policy.

        A job the dispatcher still holds (its worker failed while it ran) is removed there
        with ``fail`` first; one it dropped already (its last lease expired) is not.

        Args:
            job_id: A job of the chain in flight.
            now: The current monotonic time.

        Returns:
            What was resubmitted, submitted next or cancelled.

        Raises:
            UnknownJob: The job is not in flight in this chain.
            ValueError, TypeError, DuplicateJob: As for :meth:`start`.
        """
        spec = self._in_flight(job_id)
        t = finite("now", now)
        if job_id in self._d:
            self._d.fail(job_id, now=t)
        del self._flight[job_id]
        if self._state == "running" and self._policy == "retry":
            used = self._retried.get(job_id, 0)
            if used < self._retry_limit:
                self._retried[job_id] = used + 1
                self._retries += 1
                self._pending.appendleft((job_id, spec))
                return self._fill(t)
        self._failed += 1
        if self._state == "running" and self._policy == "skip":
            return self._fill(t)
        if self._state != "running":
            return ChainStep()
        self._state = "stopped"
        return ChainStep(cancelled=self._cancel_flight(t, "keep"))

    def cancel(self, *, now: float, running: CancelRunning = "keep") -> ChainStep:
        """Stop the chain: submit nothing more and cancel its queued jobs.

        Args:
            now: The current monotonic time.
            running: ``"keep"`` lets a running job finish (``completed`` still accepts it);
                ``"cancel"`` stops it too.

        Returns:
            A step whose ``cancelled`` holds the jobs cancelled (``submitted`` is empty).

        Raises:
            ValueError: ``running`` is not ``"keep"`` or ``"cancel"``, or ``now`` is out of
                range.
        """
        mode = checked_running(running)
        t = finite("now", now)
        self._state = "cancelled"
        return ChainStep(cancelled=self._cancel_flight(t, mode))

    # ------------------------------------------------------------------ internals

    def _in_flight(self, job_id: object) -> dict[str, Any]:
        spec = self._flight.get(job_id) if isinstance(job_id, str) else None
        if spec is None:
            raise UnknownJob(f"job {job_id!r} is not in flight in chain {self._group!r}")
        return spec

    def _cancel_flight(self, t: float, mode: CancelRunning) -> tuple[Job, ...]:
        cancelled = []
        for job_id in list(self._flight):
            if job_id not in self._d:
                continue  # finished in the dispatcher, not reported yet
            if mode == "keep" and self._d.state(job_id) == "running":
                continue
            cancelled.append(self._d.cancel(job_id, now=t))
            del self._flight[job_id]
        self._cancelled += len(cancelled)
        return tuple(cancelled)

    def _notice_outside_cancel(self, status: GroupStatus | None = None, now: float = 0.0) -> None:
        """Stop submitting when the group lost queued jobs the chain did not cancel itself.

        ``cancel_group`` on the dispatcher (a service's "cancel film" button) removes the
        chain's queued jobs behind its back; the group's ``cancelled`` count then exceeds the
        chain's own. O(in flight) when no in-flight job is missing from the dispatcher (no
        dispatcher call), else one ``group_status``.
        """
        if self._state != "running":
            return
        if status is None:
            if all(job_id in self._d for job_id in self._flight):
                return
            try:
                status = self._d.group_status(self._group, now=now)
            except UnknownGroup:  # pragma: no cover - a chain in flight has submitted
                return
        if status.cancelled > self._cancelled:
            self._state = "cancelled"

    def _fill(self, now: float) -> ChainStep:
        t = finite("now", now)
        self._notice_outside_cancel(now=t)
        tickets = []
        retry_after = None
        while self._state == "running" and self._pending and len(self._flight) < self._depth:
            job_id, spec = self._pending[0]
            try:
                ticket = self._d.submit(job_id, group=self._group, now=t, **spec)
            except QueueFull as exc:
                retry_after = exc.retry_after
                break
            self._pending.popleft()
            self._flight[job_id] = spec
            tickets.append(ticket)
        if self._state == "running" and not self._pending and not self._flight:
            self._state = "finished"
        return ChainStep(submitted=tuple(tickets), retry_after=retry_after)
