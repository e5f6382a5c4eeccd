"""The one asyncio driver over a core (private): the rules are in ``prioqueue._driver``."""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from prioqueue._async_errors import DispatcherClosed, JobCancelled, QueueTimeout, ttl_timeout
from prioqueue._driver._core import Clock, DrivenCore, ExpiryCallback
from prioqueue._driver._turn import Turn
from prioqueue._errors import (
    ChargeError,
    InvalidState,
    LeaseError,
    LeaseExpired,
    UnknownJob,
    UnknownWorker,
)
from prioqueue._spec import check_options

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from prioqueue._groups import CancelRunning, GroupStatus
    from prioqueue._spec import SubmitOptions
    from prioqueue.records import Expired, Explanation, Grant, Job, Stats, Ticket

__all__ = ["Driver"]

D_co = TypeVar("D_co", bound=DrivenCore, covariant=True)


class Driver(ABC, Generic[D_co]):
    """Drive a core on an asyncio event loop: turns, waiters, timers (see the module notes).

    Args:
        core: The core to drive. The driver must be the only caller that changes it.
        clock: A zero-argument callable returning monotonic seconds; every ``now`` given to
            the core comes from it. Inject a manual clock in tests and call :meth:`tick`
            after moving it.
        on_expired: Called with each :class:`~prioqueue.records.Expired` when a job's lease
            (or ttl) runs out; more callbacks with :meth:`on_expire`.
        hold: The core's warm hold in seconds (0: none), for the re-pump timer.
    """

    def __init__(
        self,
        core: D_co,
        *,
        clock: Clock = time.monotonic,
        on_expired: ExpiryCallback | None = None,
        hold: float = 0.0,
    ) -> None:
        self._d = core
        self._clock = clock
        self._hold = hold
        self._callbacks: list[ExpiryCallback] = [] if on_expired is None else [on_expired]
        self._waiters: dict[str, Turn] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline: float | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._closed = False

    # -- reading -------------------------------------------------------------------------

    @property
    def dispatcher(self) -> D_co:
        """The driven dispatcher, for ``stats``, ``explain``, ``forecast`` and ``snapshot``."""
        return self._d

    @property
    def closed(self) -> bool:
        """True after :meth:`aclose`."""
        return self._closed

    def now(self) -> float:
        """Return the clock's current time (the ``now`` the driver gives the dispatcher)."""
        return self._clock()

    def stats(self) -> Stats:
        """Return ``dispatcher.stats(now=self.now())`` (e.g. for the Prometheus collector)."""
        return self._d.stats(now=self.now())

    def explain(self, job_id: str) -> Explanation:
        """Return ``dispatcher.explain(job_id, now=self.now())``.

        Raises:
            UnknownJob: The job is neither queued nor running.
        """
        return self._d.explain(job_id, now=self.now())

    def group_status(self, group: str) -> GroupStatus:
        """Return ``dispatcher.group_status(group, now=self.now())``.

        Raises:
            UnknownGroup: No job was ever submitted in the group.
        """
        return self._d.group_status(group, now=self.now())

    @abstractmethod
    def holding(self, worker: str = "") -> int:
        """Return how many jobs a worker holds now (the one resource: ``""``). O(1).

        Args:
            worker: The worker's name (ignored with one resource).
        """
        ...

    @abstractmethod
    def held(self) -> list[Grant]:
        """Return the grants held now, by worker. O(held)."""
        ...

    def holder(self, job_id: str) -> str | None:
        """Return the worker holding a job, or None (queued, unknown, or one resource). O(1)."""
        return None

    # -- changing ------------------------------------------------------------------------

    def turn(
        self,
        job_id: str,
        *,
        member: str,
        timeout: float | None = None,
        **options: Unpack[SubmitOptions],
    ) -> Turn:
        """Make the async context manager (a :class:`~prioqueue.asyncio.Turn`) of one job's turn.

        Nothing happens until the turn is entered: ``__aenter__`` submits (raising
        ``QueueFull``, ``DuplicateJob``, ``ValueError`` or ``TypeError`` at once, without
        waiting), waits for the grant and returns it; ``__aexit__`` completes the job with
        the measured runtime, or cancels it when the block raised (the lane is charged for
        the time the job ran either way). See :class:`~prioqueue.asyncio.Turn`.

        Args:
            job_id: The job id, unique among queued and running jobs.
            member: Who the job belongs to (fair share is per member).
            timeout: The most seconds to wait in the queue (loop time), or None to wait
                for as long as it takes. Past it the job is removed and entering raises
                :class:`~prioqueue.asyncio.QueueTimeout`. It does not bound the time the
                block holds the resource; the lease does.
            **options: What the job carries (``priority``, ``tier``, ``model``,
                ``estimate``, ``payload``, ``group``, ``ceiling``, ...): the keyword
                arguments of ``FleetDispatcher.submit``.

        Raises:
            ValueError: ``timeout`` is negative or not a number.
            TypeError: An unknown keyword argument.

        Complexity: O(1); entering costs a submit and a dispatch of the core.
        """
        if timeout is not None and not timeout >= 0:  # also rejects NaN
            raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
        check_options(options, call="turn()", named="job_id, member, timeout")
        kwargs: dict[str, Any] = {"member": member, **options}
        return Turn(self, job_id, kwargs, timeout)

    def cancel(self, job_id: str) -> None:
        """Cancel a queued or running job and dispatch the next one.

        A queued job's waiter fails with :class:`~prioqueue.asyncio.JobCancelled`. A running
        job's holder is told through :attr:`Turn.revoked`; its lane is charged for the time
        it ran.

        Args:
            job_id: The job.

        Raises:
            UnknownJob: The job is neither queued nor running.

        Complexity: one cancel and one dispatch of the core.
        """
        now = self.now()
        self._remove(job_id, now)  # raises UnknownJob before anything changes
        turn = self._waiters.pop(job_id, None)
        if turn is not None:
            if turn._grant is not None:
                self._ended(turn._grant, now)
            self._drop(turn, JobCancelled(f"job {job_id!r} was cancelled"))
        self._pump(now)

    def cancel_group(self, group: str, *, running: CancelRunning = "keep") -> list[Job]:
        """Cancel the group's queued jobs (and running ones, if asked): see :meth:`cancel`.

        Raises:
            UnknownGroup: No job was ever submitted in the group.
            ValueError: ``group`` or ``running`` is invalid.
        """
        now = self.now()
        cancelled = self._d.cancel_group(group, now=now, running=running)
        for job in cancelled:
            turn = self._waiters.pop(job.id, None)
            if turn is not None:
                self._drop(turn, JobCancelled(f"job {job.id!r} was cancelled"))
        self._pump(now)
        return cancelled

    def on_expire(self, callback: ExpiryCallback) -> Callable[[], None]:
        """Add a callback called with each lease expiry (see the ``on_expired`` argument).

        Args:
            callback: Called with the :class:`~prioqueue.records.Expired` record.

        Returns:
            A function that removes the callback.
        """
        self._callbacks.append(callback)

        def remove() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return remove

    @abstractmethod
    def set_resident(self, worker: str, model: str | None) -> None:
        """Tell the core which model a worker (the one resource: ``""``) has loaded.

        Args:
            worker: The worker's name (ignored with one resource).
            model: The resident model, or None.
        """
        ...

    def tick(self) -> list[Expired]:
        """Run what is due at ``now()``: lease expiry, then dispatch; re-arm the timer.

        The driver's timer calls this at each lease deadline. Call it yourself only after
        moving an injected manual clock.

        Returns:
            The expiries that happened (their holders were told, the jobs removed).
        """
        return self._run_due(self.now())

    async def aclose(self) -> None:
        """Close the driver: refuse new turns and fail every queued waiter.

        Each waiting ``turn`` raises :class:`~prioqueue.asyncio.DispatcherClosed` (its job
        is removed). The holders of running jobs keep them until they leave their blocks (or
        their leases expire). Closing twice does nothing.
        """
        if self._closed:
            return
        self._closed = True
        now = self.now()
        for turn in list(self._waiters.values()):
            if turn._grant is None:
                del self._waiters[turn.job_id]
                self._d.cancel(turn.job_id, now=now)
                self._drop(turn, DispatcherClosed("the dispatcher was closed"))
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._pump(now)
        await asyncio.sleep(0)  # let the failed waiters run

    # -- the hooks of the number of workers ------------------------------------------------

    def _order(self, now: float) -> Sequence[str]:
        """The workers that may pull now, in the order they pull (called once per pump)."""
        return ("",)

    @abstractmethod
    def _pop(self, worker: str, now: float) -> Grant | None:
        """Let a worker pull the next job (None: nothing for it now)."""
        ...

    def _full(self, worker: str) -> bool:
        """Whether a worker must not pull although the core would give it a job."""
        return False

    def _refused(self, worker: str) -> bool:
        """Whether a worker that got nothing had a free slot (a warm hold kept a job)."""
        return False

    def _give_back(self, grant: Grant, now: float) -> None:
        """Give back a grant nobody can take."""
        self._d.cancel(grant.job.id, now=now, charge=0.0)

    def _granted(self, turn: Turn, grant: Grant) -> None:
        """A grant reached its waiter."""

    def _ended(self, grant: Grant, now: float) -> None:
        """A grant ended (completed, cancelled, expired, given back)."""

    def _on_expiry(self, record: Expired, now: float) -> None:
        """A job's lease ran out (called before its holder is told)."""

    def _unused(self, turn: Turn, grant: Grant) -> None:
        """A grant was given back before its holder entered its block."""

    # -- internals -----------------------------------------------------------------------

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None and not self._loop.is_closed() and self._waiters:
                raise RuntimeError(f"this {type(self).__name__} is in use on another event loop")
            self._loop = loop
            self._timer = self._retry = None
            self._timer_deadline = None
        return loop

    def _submit(self, turn: Turn) -> Ticket:
        if self._closed:
            raise DispatcherClosed("the dispatcher was closed")
        loop = self._bind_loop()
        now = self.now()
        ticket = self._d.submit(turn.job_id, now=now, **turn._kwargs)
        turn._ticket = ticket
        turn._future = loop.create_future()
        self._waiters[turn.job_id] = turn
        if turn._timeout is not None:
            turn._timer = loop.call_later(turn._timeout, self._on_timeout, turn)
        self._pump(now)
        return ticket

    def _pump(self, now: float) -> None:
        """Let every worker with a free slot pull until it gets nothing; re-arm the timers."""
        d = self._d
        refused = False
        for worker in self._order(now):
            while len(d):  # an empty queue has nothing to give: skip the call
                try:
                    if self._full(worker):
                        break
                    grant = self._pop(worker, now)
                except UnknownWorker:
                    break
                except (LeaseError, ChargeError) as exc:  # the core is unchanged
                    self._drop_unleasable(exc, now)
                    continue
                if grant is None:
                    refused = refused or self._refused(worker)
                    break
                self._hand(grant, now)
        self._arm(refused and len(d) > 0)

    def _hand(self, grant: Grant, now: float) -> None:
        """Give a grant to its waiter, or give it back when nobody can take it."""
        turn = self._waiters.get(grant.job.id)
        future = None if turn is None else turn._future
        if turn is None or future is None or future.done():
            # Nobody can take it: its waiter was cancelled in this very instant, or the job
            # was not submitted through the driver. Give it back at once.
            if turn is not None:
                del self._waiters[turn.job_id]
            self._give_back(grant, now)
            return
        turn._grant = grant
        self._granted(turn, grant)
        turn._stop_timer()
        future.set_result(grant)

    def _drop_unleasable(self, exc: LeaseError | ChargeError, now: float) -> None:
        """Remove a job whose lease or expected charge fails (it would block the resource)."""
        job_id = exc.job_id
        self._d.cancel(job_id, now=now)
        turn = self._waiters.pop(job_id, None)
        if turn is None:
            self._report(exc, f"job {job_id!r} could not be granted; the job was cancelled")
        else:
            self._drop(turn, exc)

    def _arm(self, retry: bool = False) -> None:
        """Keep exactly one timer, at ``next_deadline()``; none when nothing is due."""
        loop = self._loop
        deadline = self._d.next_deadline()
        if deadline != self._timer_deadline or (deadline is not None and self._timer is None):
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._timer_deadline = deadline
            if deadline is not None and loop is not None and not loop.is_closed():
                delay = max(0.0, deadline - self.now())
                self._timer = loop.call_later(delay, self._on_timer)
        live = loop is not None and not loop.is_closed()
        if retry and live and self._hold > 0 and self._retry is None and not self._closed:
            assert loop is not None
            self._retry = loop.call_later(min(1.0, self._hold / 4), self._on_retry)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_deadline = None
        self.tick()

    def _on_retry(self) -> None:
        self._retry = None
        self._pump(self.now())

    def _run_due(self, now: float) -> list[Expired]:
        expired = self._d.expire(now)
        for record in expired:
            job_id = record.job.id
            if record.requeued:
                # The holder cannot take a second grant from inside its block: one attempt
                # per turn, so the requeued job is removed (queued: no charge).
                self._d.cancel(job_id, now=now)
            self._on_expiry(record, now)
            turn = self._waiters.pop(job_id, None)
            if turn is not None and record.cause == "ttl":  # expired queued: never granted
                self._drop(turn, ttl_timeout(record))
            elif turn is not None:
                if turn._grant is not None:
                    self._ended(turn._grant, now)
                turn._expired = record
                turn.revoked.set()
            for callback in list(self._callbacks):
                try:
                    callback(record)
                except Exception as exc:  # a callback's bug must not stop the driver
                    self._report(exc, "an on_expired callback raised")
        self._pump(now)
        return expired

    def _on_timeout(self, turn: Turn) -> None:
        turn._timer = None
        if self._waiters.get(turn.job_id) is not turn or turn._grant is not None:
            return
        now = self.now()
        del self._waiters[turn.job_id]
        self._d.cancel(turn.job_id, now=now)
        timeout = turn._timeout if turn._timeout is not None else 0.0
        error = QueueTimeout(
            f"job {turn.job_id!r} waited more than {timeout:g} s in the queue",
            job_id=turn.job_id,
            timeout=timeout,
        )
        self._drop(turn, error)
        self._pump(now)

    def _drop(self, turn: Turn, error: BaseException) -> None:
        """Fail a waiter that was just removed (its job too), or revoke a holder."""
        turn._stop_timer()
        if turn._grant is not None:
            turn.revoked.set()
        elif turn._future is not None and not turn._future.done():
            turn._future.set_exception(error)

    def _release(self, turn: Turn, *, failed: bool, unused: bool = False) -> None:
        """Give the resource (or the queue place) back when a turn ends.

        ``unused``: the holder never entered its block (cancelled in the instant of the grant).
        """
        if self._waiters.get(turn.job_id) is not turn:
            return  # already removed: timeout, close, cancel or lease expiry
        turn._stop_timer()
        now = self.now()
        grant = turn._grant
        job_id = turn.job_id
        try:
            if grant is not None and not failed:
                self._complete(job_id, now, max(0.0, now - grant.granted_at))
            elif turn._fails and failed and not unused and grant is not None:
                self._remove(job_id, now, fail=True)  # a chain's run raised: failed
            else:
                self._remove(job_id, now)
                if unused and grant is not None:
                    self._unused(turn, grant)
        except LeaseExpired:
            self._run_due(now)  # the timer had not fired yet: expire now, tell the holder
            return
        except UnknownJob:
            pass  # expired and failed meanwhile: nothing is held
        except InvalidState:
            # Given back by a take-out while its request went on and ended: it was served.
            self._d.cancel(job_id, now=now)
        if grant is not None:
            self._ended(grant, now)
        del self._waiters[job_id]
        self._pump(now)

    def _complete(self, job_id: str, now: float, runtime: float) -> None:
        try:
            self._d.complete(job_id, now=now, runtime=runtime)
        except ChargeError as exc:
            # The resource must be freed all the same: finish with no charge, say why.
            self._report(exc, f"the charge model failed for job {job_id!r}")
            self._d.complete(job_id, now=now, runtime=runtime, charge=0.0)

    def _remove(self, job_id: str, now: float, *, fail: bool = False) -> None:
        """Cancel (or fail) a job; a held one whose charge model fails gets no charge."""
        remove = self._d.fail if fail else self._d.cancel
        try:
            remove(job_id, now=now)
        except ChargeError as exc:
            self._report(exc, f"the charge model failed for job {job_id!r}")
            remove(job_id, now=now, charge=0.0)

    def _report(self, exc: BaseException, message: str) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_exception_handler(
                {"message": message, "exception": exc, "dispatcher": self}
            )
