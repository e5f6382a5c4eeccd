"""An asyncio driver for :class:`~prioqueue.dispatcher.SizeOneDispatcher`: wait for your turn.

Theory of operation
-------------------
The core is sans-IO: it takes ``now`` and never sleeps. :class:`AsyncDispatcher` owns one
:class:`~prioqueue.dispatcher.SizeOneDispatcher`, one clock and one event loop, and keeps
these rules:

1. **One waiter per job.** ``turn()`` submits the job and registers a waiter: a future that
   only :meth:`AsyncDispatcher._pump` resolves. While a waiter is registered its job is
   known to the dispatcher (queued or running), and the other way round for every job
   submitted through the adapter. Removing a waiter and removing its job happen in the same
   synchronous step, so a job id can be reused as soon as its turn is over.
2. **Dispatch after every change.** Submit, complete, cancel, timeout and expiry all end in
   ``_pump()``, which calls ``dispatch(now)`` and hands the grant to its waiter. A grant that
   nobody can take (its waiter was cancelled in the same instant, or the job was submitted
   behind the adapter's back, e.g. restored from a snapshot) is cancelled at once and the
   next job is dispatched, so the resource never leaks and a disconnected client never
   causes a model load (the resident model is restored too). A job whose ``lease_for``
   raises, or whose charge model gives no valid expected charge, is removed and its waiter
   fails with that error, so it cannot block the queue.
3. **One timer.** A single ``loop.call_later`` handle is armed at ``next_deadline()`` and
   re-armed only when the deadline changes; it is cancelled when no lease runs. Nothing
   polls: waiters sleep on their futures, the holder sleeps on its own work.
4. **A turn is one attempt.** When a lease expires the holder loses the resource: the
   adapter removes the job (the core would requeue it, but its holder is still inside its
   ``async with`` block and cannot take a second grant), sets :attr:`Turn.revoked`, records
   :attr:`Turn.expired` and calls the ``on_expired`` callbacks. The caller retries, if it
   wants to, with a new turn.
5. **Leaving frees the resource.** A block that exits normally completes the job with the
   measured runtime (``now - granted_at``: the time it held the resource). A block that
   raises (``CancelledError`` included) *cancels* the running job: the dispatcher charges
   the member's lane for the time it ran, and the job does not count as completed nor feed
   the runtime statistics. A charge model that fails at that moment (NaN, say) is reported
   to the loop's exception handler and the job is finished with a zero charge, so the next
   turn is still granted. ``__aexit__`` never raises an error of its own and never swallows
   the block's.
6. **Nothing holds the resource without a holder.** A dispatcher whose running job has no
   lease (restored from a snapshot, say) is refused at construction: no ``async with``
   block would ever release it.

Time: the dispatcher is stamped with ``clock()`` (``time.monotonic`` by default). Sleeping
(lease timer, queue timeouts) uses the event loop's timer with delays computed from the
clock. With an injected manual clock, call :meth:`AsyncDispatcher.tick` after moving it.

Everything here must run on the event loop's thread; the adapter is not thread-safe.

Costs: a turn costs one submit, one dispatch and one complete of the core (each
O(log n + M), see the dispatcher's design note), one future and O(1) bookkeeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from prioqueue._async_errors import DispatcherClosed, JobCancelled, QueueTimeout, ttl_timeout
from prioqueue._asyncio_chain import AsyncChain, ChainResult, GroupGate
from prioqueue._errors import ChargeError, LeaseError, LeaseExpired
from prioqueue.dispatcher import SizeOneDispatcher
from prioqueue.records import Expired, Explanation, Grant, Stats, Ticket

__all__ = [
    "AsyncChain",
    "AsyncDispatcher",
    "ChainResult",
    "DispatcherClosed",
    "JobCancelled",
    "QueueTimeout",
    "Turn",
]

Clock = Callable[[], float]
ExpiryCallback = Callable[[Expired], object]


class Turn:
    """One job's turn at the resource: an async context manager made by ``turn()``.

    ``async with gate.turn(...) as grant:`` submits the job on entry, waits until it is
    granted and yields the :class:`~prioqueue.records.Grant`; leaving the block completes the
    job (or cancels it when the block raised). Keep the ``Turn`` object to watch the lease::

        turn = gate.turn("job-1", member="alice", priority="interactive")
        async with turn as grant:
            work = asyncio.ensure_future(run_on_gpu(grant.job))
            await asyncio.wait([work, asyncio.ensure_future(turn.revoked.wait())],
                               return_when=asyncio.FIRST_COMPLETED)

    A ``Turn`` is used once. Callers that want to act between submitting and waiting (e.g.
    answer 429 at once, or report the queue position) call :meth:`submit` first; a turn that
    was submitted must then be entered, or cancelled with :meth:`AsyncDispatcher.cancel`.
    """

    __slots__ = (
        "_entered",
        "_expired",
        "_fails",
        "_future",
        "_gate",
        "_grant",
        "_kwargs",
        "_resident_before",
        "_revoked",
        "_ticket",
        "_timeout",
        "_timer",
        "job_id",
    )

    def __init__(
        self, gate: AsyncDispatcher, job_id: str, kw: dict[str, Any], timeout: float | None
    ):
        self._gate = gate
        self.job_id = job_id
        self._kwargs = kw
        self._timeout = timeout
        self._ticket: Ticket | None = None
        self._future: asyncio.Future[Grant] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._grant: Grant | None = None
        self._expired: Expired | None = None
        self._revoked: asyncio.Event | None = None
        self._resident_before: str | None = None
        self._entered = False
        self._fails = False  # a block that raises fails the job (a chain's turn), not cancel

    @property
    def ticket(self) -> Ticket | None:
        """The submit's ticket (the job and the queue depth after it), None before submit."""
        return self._ticket

    @property
    def grant(self) -> Grant | None:
        """The grant once the job runs, else None."""
        return self._grant

    @property
    def expired(self) -> Expired | None:
        """The expiry record when the job's lease ran out while it held the resource."""
        return self._expired

    @property
    def revoked(self) -> asyncio.Event:
        """An event set when the adapter took the resource back from the holder.

        That happens when the lease expires (then :attr:`expired` is set too) and when the
        running job is cancelled through :meth:`AsyncDispatcher.cancel`. The holder should
        stop its work: another job may already be running.
        """
        if self._revoked is None:
            self._revoked = asyncio.Event()
        return self._revoked

    def submit(self) -> Ticket:
        """Submit the job to the dispatcher without waiting; the first half of entering.

        When the resource is free the job is granted at once and holds it from here: enter
        the turn next (or cancel the job) without delay.

        Returns:
            The dispatcher's ticket.

        Raises:
            DispatcherClosed: The adapter was closed.
            RuntimeError: The turn was already submitted.
            QueueFull: The queue or the member's share of it is full.
            DuplicateJob: A job with this id is still queued or running.
            ValueError: A bad argument (see ``SizeOneDispatcher.submit``).
            TypeError: A bad argument type.

        Complexity: one ``submit`` and one ``dispatch`` of the core.
        """
        if self._ticket is not None:
            raise RuntimeError(f"turn {self.job_id!r} was already submitted")
        return self._gate._submit(self)

    async def __aenter__(self) -> Grant:
        """Submit if :meth:`submit` was not called, then wait until the job is granted.

        Returns:
            The grant. The caller holds the resource until it leaves the block.

        Raises:
            QueueTimeout: The job waited longer than ``timeout``; it was removed.
            DispatcherClosed: The adapter was closed while the job waited.
            JobCancelled: The job was cancelled through :meth:`AsyncDispatcher.cancel`, or
                lost its grant (cancel, lease expiry) before this task could resume.
            asyncio.CancelledError: The waiting task was cancelled; the job was removed
                (or, when the grant arrived in the same instant, released at once).
            RuntimeError: The turn was already entered.
            LeaseError: ``lease_for`` failed for this job when it won (it was removed); the
                original exception is the ``__cause__``.
            Exception: Everything :meth:`submit` raises, at once, without waiting.
        """
        if self._entered:
            raise RuntimeError(f"turn {self.job_id!r} was already entered")
        self._entered = True
        if self._ticket is None:
            self._gate._submit(self)
        future = self._future
        assert future is not None
        try:
            grant = await future
            if self._gate._waiters.get(self.job_id) is not self:
                # Revoked between the grant and this task's wake-up (cancel or expiry).
                why = "its lease expired" if self._expired else "it was cancelled"
                raise JobCancelled(f"job {self.job_id!r} lost its grant before it began: {why}")
            return grant
        except BaseException:
            # Cancelled while waiting, or failed by timeout/close/cancel. In the first case
            # the job may still be queued, or may even have been granted in the same
            # instant: give it back either way (a no-op when the adapter removed it).
            self._gate._release(self, failed=True, unused=True)
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._gate._release(self, failed=exc_type is not None)

    def __repr__(self) -> str:
        state = "granted" if self._grant else "submitted" if self._ticket else "new"
        return f"<Turn {self.job_id!r} {'expired' if self._expired else state}>"


class AsyncDispatcher(GroupGate):
    """Run a :class:`~prioqueue.dispatcher.SizeOneDispatcher` on an asyncio event loop.

    Args:
        dispatcher: The dispatcher to drive (a default one when None). The adapter must be
            the only caller that changes it; reading it (``stats``, ``explain``,
            ``snapshot``) is fine. Queued jobs that were not submitted through the adapter
            (restored from a snapshot, say) have nobody to run them and are cancelled when
            they are granted.
        clock: A zero-argument callable returning monotonic seconds; every ``now`` given to
            the dispatcher comes from it.
        on_expired: Called with each :class:`~prioqueue.records.Expired` when a running
            job's lease runs out (after the job was removed and before the next dispatch).
            More callbacks can be added with :meth:`on_expire`. An exception in a callback is
            reported to the loop's exception handler and does not stop the others.

    Raises:
        ValueError: ``dispatcher`` has a running job without a lease: nothing would ever
            release it (restore snapshots with ``require_lease=True``, or cancel the job).

    The adapter binds to the running event loop on first use; it must be used from that
    loop's thread only.
    """

    def __init__(
        self,
        dispatcher: SizeOneDispatcher | None = None,
        *,
        clock: Clock = time.monotonic,
        on_expired: ExpiryCallback | None = None,
    ) -> None:
        d = dispatcher if dispatcher is not None else SizeOneDispatcher()
        running = d.running
        if running is not None and running.lease is None:
            raise ValueError(
                f"the dispatcher's running job {running.job.id!r} has no lease: no turn holds "
                "it, so nothing would ever free the resource; cancel it first, or restore "
                "with lease_for and require_lease=True"
            )
        self._d = d
        self._clock = clock
        self._callbacks: list[ExpiryCallback] = [] if on_expired is None else [on_expired]
        self._waiters: dict[str, Turn] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline: float | None = None
        self._closed = False

    # -- reading -------------------------------------------------------------------------

    @property
    def dispatcher(self) -> SizeOneDispatcher:
        """The driven dispatcher, for ``stats``, ``explain``, ``forecast`` and ``snapshot``."""
        return self._d

    @property
    def closed(self) -> bool:
        """True after :meth:`aclose`."""
        return self._closed

    def now(self) -> float:
        """Return the clock's current time (the ``now`` the adapter gives the dispatcher)."""
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

    # -- changing ------------------------------------------------------------------------

    def turn(
        self,
        job_id: str,
        *,
        member: str,
        priority: int | str | bytes | None = 0,
        tier: str = "free",
        model: str | None = None,
        estimate: float | None = None,
        payload: Any = None,
        timeout: float | None = None,
        group: str | None = None,
        ceiling: int | None = None,
    ) -> Turn:
        """Make the async context manager of one job's turn at the resource.

        Nothing happens until the turn is entered: ``__aenter__`` submits (raising
        ``QueueFull``, ``DuplicateJob``, ``ValueError`` or ``TypeError`` at once, without
        waiting), waits for the grant and returns it; ``__aexit__`` completes the job with
        the measured runtime, or cancels it when the block raised (the lane is charged for
        the time the job ran either way). See :class:`Turn`.

        Args:
            job_id: The job id, unique among queued and running jobs.
            member: Who the job belongs to (fair share is per member).
            priority: A priority number, alias or header value (see ``PriorityPolicy``).
            tier: The member's tier.
            model: The model the job needs, or None.
            estimate: The runtime estimate in seconds, or None.
            payload: An opaque value kept with the job.
            timeout: The most seconds to wait in the queue (loop time), or None to wait
                for as long as it takes. Past it the job is removed and entering raises
                :class:`QueueTimeout`. It does not bound the time the block holds the
                resource; the lease does.
            group: The job's group label (see ``SizeOneDispatcher.submit``), or None.
            ceiling: The caller's priority ceiling (see ``SizeOneDispatcher.submit``), kept
                even below the policy's minimum, or None.

        Returns:
            The :class:`Turn`.

        Raises:
            ValueError: ``timeout`` is negative or not a number.

        Complexity: O(1); entering costs a submit and a dispatch of the core.
        """
        if timeout is not None and not timeout >= 0:  # also rejects NaN
            raise ValueError(f"timeout must be >= 0 seconds or None, got {timeout!r}")
        kwargs: dict[str, Any] = {
            "member": member,
            "priority": priority,
            "tier": tier,
            "model": model,
            "estimate": estimate,
            "payload": payload,
        }
        if group is not None:
            kwargs["group"] = group
        if ceiling is not None:
            kwargs["ceiling"] = ceiling
        return Turn(self, job_id, kwargs, timeout)

    def cancel(self, job_id: str) -> None:
        """Cancel a queued or running job and dispatch the next one.

        A queued job's waiter fails with :class:`JobCancelled`. A running job's holder is
        told through :attr:`Turn.revoked`; its lane is charged for the time it ran.

        Args:
            job_id: The job.

        Raises:
            UnknownJob: The job is neither queued nor running.

        Complexity: one cancel and one dispatch of the core.
        """
        now = self.now()
        self._cancel(job_id, now)  # raises UnknownJob before anything changes
        turn = self._waiters.pop(job_id, None)
        if turn is not None:
            self._drop_waiter(turn, JobCancelled(f"job {job_id!r} was cancelled"))
        self._pump(now)

    def set_resident_model(self, model: str | None) -> None:
        """Tell the dispatcher which model is loaded (None after the server unloads it).

        Args:
            model: The resident model, or None.
        """
        self._d.set_resident_model(model)

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

    def tick(self) -> list[Expired]:
        """Run what is due at ``now()``: lease expiry, then dispatch; re-arm the timer.

        The adapter's timer calls this at each lease deadline. Call it yourself only after
        moving an injected manual clock.

        Returns:
            The expiries that happened (their holders were told, the jobs removed).
        """
        return self._run_due(self.now())

    async def aclose(self) -> None:
        """Close the adapter: refuse new turns and fail every queued waiter.

        Each waiting ``turn`` raises :class:`DispatcherClosed` (its job is removed). The
        holder of the running job keeps it until it leaves its block (or its lease
        expires). Closing twice does nothing.
        """
        if self._closed:
            return
        self._closed = True
        now = self.now()
        for turn in list(self._waiters.values()):
            if turn._grant is None:
                del self._waiters[turn.job_id]
                self._d.cancel(turn.job_id, now=now)
                self._drop_waiter(turn, DispatcherClosed("the dispatcher was closed"))
        self._pump(now)
        await asyncio.sleep(0)  # let the failed waiters run

    # -- internals -----------------------------------------------------------------------

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None and not self._loop.is_closed() and self._waiters:
                raise RuntimeError("this AsyncDispatcher is in use on another event loop")
            self._loop = loop
            self._timer = None
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
        """Dispatch and hand the grant to its waiter; re-arm the lease timer."""
        d = self._d
        while len(d):  # an empty queue has nothing to dispatch: skip the call
            resident = d.resident_model
            try:
                grant = d.dispatch(now)
            except (LeaseError, ChargeError) as exc:  # the dispatcher is unchanged
                self._drop_unleasable(exc, now)
                continue
            if grant is None:
                break
            turn = self._waiters.get(grant.job.id)
            future = None if turn is None else turn._future
            if turn is None or future is None or future.done():
                # Nobody can take it: its waiter was cancelled in this very instant, or the
                # job was not submitted through the adapter. Give it back at once.
                if turn is not None:
                    del self._waiters[turn.job_id]
                self._cancel(grant.job.id, now)
                d.set_resident_model(resident)  # nothing was loaded for it
                continue
            turn._grant = grant
            turn._resident_before = resident
            if turn._timer is not None:
                turn._timer.cancel()
                turn._timer = None
            future.set_result(grant)
            break
        self._arm()

    def _drop_unleasable(self, exc: LeaseError | ChargeError, now: float) -> None:
        """Remove the job that cannot be granted and fail its waiter with the error.

        Without this, a job whose lease or expected charge cannot be computed would block the
        resource for good.
        """
        job_id = exc.job_id
        self._d.cancel(job_id, now=now)
        turn = self._waiters.pop(job_id, None)
        if turn is None:
            self._report(exc, f"job {job_id!r} could not be granted; the job was cancelled")
        else:
            self._drop_waiter(turn, exc)

    def _arm(self) -> None:
        """Keep exactly one timer, at ``next_deadline()``; none when no lease runs."""
        deadline = self._d.next_deadline()
        if deadline == self._timer_deadline and (deadline is None or self._timer is not None):
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_deadline = deadline
        if deadline is None or self._loop is None or self._loop.is_closed():
            return
        delay = max(0.0, deadline - self.now())
        self._timer = self._loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self.tick()

    def _run_due(self, now: float) -> list[Expired]:
        expired = self._d.expire(now)
        for record in expired:
            job_id = record.job.id
            if record.requeued:
                # The holder cannot take a second grant from inside its block: one attempt
                # per turn, so the requeued job is removed (queued: no charge).
                self._d.cancel(job_id, now=now)
            turn = self._waiters.pop(job_id, None)
            if turn is not None and record.cause == "ttl":  # expired queued: never granted
                self._drop_waiter(turn, ttl_timeout(record))
            elif turn is not None:
                turn._expired = record
                turn.revoked.set()
            for callback in list(self._callbacks):
                try:
                    callback(record)
                except Exception as exc:  # a callback's bug must not stop the adapter
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
        self._drop_waiter(
            turn,
            QueueTimeout(
                f"job {turn.job_id!r} waited more than {timeout:g} s in the queue",
                job_id=turn.job_id,
                timeout=timeout,
            ),
        )
        self._pump(now)

    def _drop_waiter(self, turn: Turn, error: BaseException) -> None:
        """Fail a waiter that was just removed (its job too), or revoke a holder."""
        if turn._timer is not None:
            turn._timer.cancel()
            turn._timer = None
        if turn._grant is not None:
            turn.revoked.set()
        elif turn._future is not None and not turn._future.done():
            turn._future.set_exception(error)

    def _release(self, turn: Turn, *, failed: bool, unused: bool = False) -> None:
        """Give the resource (or the queue place) back when a turn ends.

        ``unused``: the holder never entered its block (its task was cancelled in the instant
        of the grant), so no model was loaded for the job: the resident model is restored.
        """
        if self._waiters.get(turn.job_id) is not turn:
            return  # already removed: timeout, close, cancel or lease expiry
        if turn._timer is not None:
            turn._timer.cancel()
            turn._timer = None
        now = self.now()
        if turn._grant is not None and not failed:
            runtime = max(0.0, now - turn._grant.granted_at)
            try:
                self._d.complete(turn.job_id, now=now, runtime=runtime)
            except LeaseExpired:
                self._run_due(now)  # the timer had not fired yet: expire now, tell the holder
                return
            except ChargeError as exc:
                # The resource must be freed all the same: finish with no charge, say why.
                self._report(exc, f"the charge model failed for job {turn.job_id!r}")
                self._d.complete(turn.job_id, now=now, runtime=runtime, charge=0.0)
        elif turn._fails and failed and not unused and turn._grant is not None:
            self._cancel(turn.job_id, now, fail=True)  # a chain's run raised: failed
        else:
            self._cancel(turn.job_id, now)
            grant = turn._grant
            if unused and grant is not None and self._d.resident_model == grant.job.model:
                self._d.set_resident_model(turn._resident_before)
        del self._waiters[turn.job_id]
        self._pump(now)

    def _cancel(self, job_id: str, now: float, *, fail: bool = False) -> None:
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
