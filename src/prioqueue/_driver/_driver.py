"""The one asyncio driver over a core (private): the rules are in ``prioqueue._driver``.

The driver owns its waiters: :class:`_Waiter` is its record of one turn, created, changed and
read here only; callers get a read-only :class:`~prioqueue.turn.Turn` over it. What
differs with the number of workers is the :class:`~prioqueue._driver._policy.PullPolicy` the
driver is composed with.
"""

from __future__ import annotations

import asyncio
from abc import abstractmethod
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import attrs

from prioqueue._driver._alarm import Alarm
from prioqueue._driver._core import Clock, DrivenCore, ExpiryCallback
from prioqueue._driver._policy import PullPolicy
from prioqueue._driver._reader import CoreReader, D_co
from prioqueue._spec import check_options
from prioqueue._timers import disarm
from prioqueue.clock import SYSTEM_CLOCK
from prioqueue.errors import (
    ChargeError,
    DispatcherClosed,
    InvalidState,
    JobCancelled,
    LeaseError,
    LeaseExpired,
    QueueTimeout,
    UnknownJob,
    UnknownWorker,
)
from prioqueue.turn import Turn

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from prioqueue._groups import CancelRunning
    from prioqueue._spec import SubmitOptions
    from prioqueue.records import Expired, Grant, Job, Ticket

__all__ = ["Driver"]


@attrs.define(eq=False)
class _Waiter:
    """The driver's record of one turn (a :class:`~prioqueue.turn.TurnRecord`).

    Only this module creates or changes it; the turn handed to the caller reads it.
    """

    driver: Driver[DrivenCore]
    job_id: str
    kwargs: dict[str, Any]
    timeout: float | None
    fails: bool = False  # a block that raises fails the job (a chain's turn), not cancel
    ticket: Ticket | None = None
    future: asyncio.Future[Grant] | None = None
    timer: asyncio.TimerHandle | None = None
    grant: Grant | None = None
    expired: Expired | None = None
    revoked: asyncio.Event | None = None
    entered: bool = False
    requeued: bool = False
    attempts: int = 0

    def revoked_event(self) -> asyncio.Event:
        if self.revoked is None:
            self.revoked = asyncio.Event()
        return self.revoked

    def submit(self) -> Ticket:
        if self.ticket is not None:
            raise RuntimeError(f"turn {self.job_id!r} was already submitted")
        return self.driver._submit(self)

    # enter and regrant return the waiting coroutine rather than being coroutines: one
    # frame less between a woken task and its grant.
    def enter(self) -> Coroutine[Any, Any, Grant]:
        if self.entered:
            raise RuntimeError(f"turn {self.job_id!r} was already entered")
        self.entered = True
        if self.ticket is None:
            self.driver._submit(self)
        return self._wait()

    def regrant(self) -> Coroutine[Any, Any, Grant]:
        if not self.requeued or self.future is None:
            raise RuntimeError(f"turn {self.job_id!r} is not waiting for a new grant")
        self.requeued = False
        return self._wait()

    async def _wait(self) -> Grant:
        future = self.future
        assert future is not None
        try:
            grant = await future
            if self.driver._waiters.get(self.job_id) is not self:
                # Revoked between the grant and this task's wake-up (cancel or expiry).
                why = "its lease expired" if self.expired else "it was cancelled"
                raise JobCancelled(f"job {self.job_id!r} lost its grant before it began: {why}")
        except BaseException:
            # Cancelled while waiting, or failed by timeout/close/cancel. In the first case
            # the job may still be queued, or may even have been granted in the same
            # instant: give it back either way (a no-op when the driver removed it).
            self.driver._release(self, failed=True, unused=True)
            raise
        self.attempts += 1
        return grant

    def leave(self, *, failed: bool) -> None:
        self.driver._release(self, failed=failed)

    def stop_timer(self) -> None:
        """Cancel the queue time-out's timer (granted, removed or released)."""
        disarm(self.timer)
        self.timer = None


class Driver(CoreReader[D_co]):
    """Drive a core on an asyncio event loop: turns, waiters, timers (see the module notes).

    Args:
        core: The core to drive. The driver must be the only caller that changes it.
        policy: How its workers pull (:class:`~prioqueue._driver._policy.PullPolicy`).
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
        policy: PullPolicy,
        *,
        clock: Clock = SYSTEM_CLOCK.monotonic,
        on_expired: ExpiryCallback | None = None,
        hold: float = 0.0,
    ) -> None:
        super().__init__(core, clock)
        self._policy = policy
        self._waiters: dict[str, _Waiter] = {}
        self._alarm = Alarm(clock, hold, self.tick, self._on_retry, on_expired, source=self)
        self._closed = False

    @property
    def closed(self) -> bool:
        """True after :meth:`aclose`."""
        return self._closed

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
        return Turn(self._new(job_id, member, timeout, options, "turn()"))

    def chain_turn(
        self,
        job_id: str,
        *,
        member: str,
        timeout: float | None = None,
        **options: Unpack[SubmitOptions],
    ) -> Turn:
        """Make a chain's turn: :meth:`turn` whose raising block *fails* the job (not cancel).

        Raises:
            ValueError: ``timeout`` is negative or not a number.
            TypeError: An unknown keyword argument.
        """
        waiter = self._new(job_id, member, timeout, options, "chain_turn()")
        waiter.fails = True
        return Turn(waiter)

    def _new(
        self, job_id: str, member: str, timeout: float | None, opts: Any, call: str
    ) -> _Waiter:
        if timeout is not None and not timeout >= 0:  # also rejects NaN
            raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
        check_options(opts, call=call, named="job_id, member, timeout")
        return _Waiter(self, job_id, {"member": member, **opts}, timeout)

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
        waiter = self._waiters.pop(job_id, None)
        if waiter is not None:
            if waiter.grant is not None:
                self._policy.ended(waiter.grant, now)
            self._drop(waiter, JobCancelled(f"job {job_id!r} was cancelled"))
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
            waiter = self._waiters.pop(job.id, None)
            if waiter is not None:
                self._drop(waiter, JobCancelled(f"job {job.id!r} was cancelled"))
        self._pump(now)
        return cancelled

    def on_expire(self, callback: ExpiryCallback) -> Callable[[], None]:
        """Add a callback called with each lease expiry (see the ``on_expired`` argument).

        Args:
            callback: Called with the :class:`~prioqueue.records.Expired` record.

        Returns:
            A function that removes the callback.
        """
        return self._alarm.listen(callback)

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
        for waiter in list(self._waiters.values()):
            if waiter.grant is None:
                del self._waiters[waiter.job_id]
                self._d.cancel(waiter.job_id, now=now)
                self._drop(waiter, DispatcherClosed("the dispatcher was closed"))
        self._alarm.cancel_retry()
        self._pump(now)
        await asyncio.sleep(0)  # let the failed waiters run

    # -- internals -----------------------------------------------------------------------

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        bound = self._alarm.loop
        if bound is not loop:
            if bound is not None and not bound.is_closed() and self._waiters:
                raise RuntimeError(f"this {type(self).__name__} is in use on another event loop")
            self._alarm.bind(loop)
        return loop

    def _submit(self, waiter: _Waiter) -> Ticket:
        if self._closed:
            raise DispatcherClosed("the dispatcher was closed")
        loop = self._bind_loop()
        now = self.now()
        ticket = self._d.submit(waiter.job_id, now=now, **waiter.kwargs)
        waiter.ticket = ticket
        waiter.future = loop.create_future()
        self._waiters[waiter.job_id] = waiter
        if waiter.timeout is not None:
            waiter.timer = loop.call_later(waiter.timeout, self._on_timeout, waiter)
        self._pump(now)
        return ticket

    def _requeue(self, turn: Turn, requeue: Callable[[str, float], object]) -> bool:
        """Give a held job back with ``requeue``: its turn waits for a regrant (False: no-op)."""
        waiter = self._waiters.get(turn.job_id)
        # A ticket is made once per submit: the same ticket is the same turn.
        if waiter is None or waiter.grant is None or waiter.ticket is not turn.ticket:
            return False
        now = self.now()
        try:
            requeue(turn.job_id, now)
        except (UnknownJob, InvalidState):
            return False
        self._policy.ended(waiter.grant, now)
        waiter.grant = None
        waiter.requeued = True
        waiter.revoked = None
        loop = self._alarm.loop
        waiter.future = None if loop is None else loop.create_future()
        self._pump(now)
        return True

    def _pump(self, now: float) -> None:
        """Let every worker with a free slot pull until it gets nothing; re-arm the timers."""
        d = self._d
        policy = self._policy
        refused = False
        for worker in policy.order(now):
            while len(d):  # an empty queue has nothing to give: skip the call
                try:
                    if policy.full(worker):
                        break
                    grant = policy.pop(worker, now)
                except UnknownWorker:
                    break
                except (LeaseError, ChargeError) as exc:  # the core is unchanged
                    self._drop_unleasable(exc, now)
                    continue
                if grant is None:
                    refused = refused or policy.refused(worker)
                    break
                self._hand(grant, now)
        self._alarm.arm(d.next_deadline(), refused and len(d) > 0 and not self._closed)

    def _hand(self, grant: Grant, now: float) -> None:
        """Give a grant to its waiter, or give it back when nobody can take it."""
        waiter = self._waiters.get(grant.job.id)
        future = None if waiter is None else waiter.future
        if waiter is None or future is None or future.done():
            # Nobody can take it (its waiter was cancelled this instant, or no waiter): give back.
            if waiter is not None:
                del self._waiters[waiter.job_id]
            self._policy.give_back(grant, now, self._remove)
            return
        waiter.grant = grant
        self._policy.granted(grant)
        waiter.stop_timer()
        future.set_result(grant)

    def _drop_unleasable(self, exc: LeaseError | ChargeError, now: float) -> None:
        """Remove a job whose lease or expected charge fails (it would block the resource)."""
        job_id = exc.job_id
        self._d.cancel(job_id, now=now)
        waiter = self._waiters.pop(job_id, None)
        if waiter is None:
            self._alarm.report(exc, f"job {job_id!r} could not be granted; the job was cancelled")
        else:
            self._drop(waiter, exc)

    def _on_retry(self) -> None:
        self._pump(self.now())

    def _run_due(self, now: float) -> list[Expired]:
        expired = self._d.expire(now)
        for record in expired:
            job_id = record.job.id
            if record.requeued:
                # The holder cannot take a second grant from inside its block: one attempt
                # per turn, so the requeued job is removed (queued: no charge).
                self._d.cancel(job_id, now=now)
            self._policy.on_expiry(record, now)
            waiter = self._waiters.pop(job_id, None)
            if waiter is not None and record.cause == "ttl":  # expired queued: never granted
                ttl = record.deadline - record.job.arrival
                self._drop(waiter, QueueTimeout.ttl_ran_out(record.job.id, ttl))
            elif waiter is not None:
                if waiter.grant is not None:
                    self._policy.ended(waiter.grant, now)
                waiter.expired = record
                waiter.revoked_event().set()
            self._alarm.notify(record)
        self._pump(now)
        return expired

    def _on_timeout(self, waiter: _Waiter) -> None:
        waiter.timer = None
        if self._waiters.get(waiter.job_id) is not waiter or waiter.grant is not None:
            return
        now = self.now()
        del self._waiters[waiter.job_id]
        self._d.cancel(waiter.job_id, now=now)
        job_id, timeout = waiter.job_id, waiter.timeout or 0.0
        why = f"job {job_id!r} waited more than {timeout:g} s in the queue"
        self._drop(waiter, QueueTimeout(why, job_id=job_id, timeout=timeout))
        self._pump(now)

    def _drop(self, waiter: _Waiter, error: BaseException) -> None:
        """Fail a waiter that was just removed (its job too), or revoke a holder."""
        waiter.stop_timer()
        if waiter.grant is not None:
            waiter.revoked_event().set()
        elif waiter.future is not None and not waiter.future.done():
            waiter.future.set_exception(error)

    def _release(self, waiter: _Waiter, *, failed: bool, unused: bool = False) -> None:
        """Give the resource (or the queue place) back when a turn ends.

        ``unused``: the holder never entered its block (cancelled in the instant of the grant).
        """
        if self._waiters.get(waiter.job_id) is not waiter:
            return  # already removed: timeout, close, cancel or lease expiry
        waiter.stop_timer()
        now = self.now()
        grant = waiter.grant
        job_id = waiter.job_id
        try:
            if grant is not None and not failed:
                self._complete(job_id, now, max(0.0, now - grant.granted_at))
            elif waiter.fails and failed and not unused and grant is not None:
                self._remove(job_id, now, fail=True)  # a chain's run raised: failed
            else:
                self._remove(job_id, now)
                if unused and grant is not None:
                    self._policy.unused(grant)
        except LeaseExpired:
            self._run_due(now)  # the timer had not fired yet: expire now, tell the holder
            return
        except UnknownJob:
            pass  # expired and failed meanwhile: nothing is held
        except InvalidState:
            # Given back by a take-out while its request went on and ended: it was served.
            self._d.cancel(job_id, now=now)
        if grant is not None:
            self._policy.ended(grant, now)
        del self._waiters[job_id]
        self._pump(now)

    def _complete(self, job_id: str, now: float, runtime: float) -> None:
        try:
            self._d.complete(job_id, now=now, runtime=runtime)
        except ChargeError as exc:
            # The resource must be freed all the same: finish with no charge, say why.
            self._alarm.report(exc, f"the charge model failed for job {job_id!r}")
            self._d.complete(job_id, now=now, runtime=runtime, charge=0.0)

    def _remove(
        self, job_id: str, now: float, charge: float | None = None, *, fail: bool = False
    ) -> None:
        """Cancel (or fail) a job; a held one whose charge model fails gets no charge."""
        remove = self._d.fail if fail else self._d.cancel
        try:
            remove(job_id, now=now, charge=charge)
        except ChargeError as exc:
            self._alarm.report(exc, f"the charge model failed for job {job_id!r}")
            remove(job_id, now=now, charge=0.0)
