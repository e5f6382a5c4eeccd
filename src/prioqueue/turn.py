"""One job's turn at a driven resource: the read-only handle every driver hands out.

A :class:`Turn` is made by ``Driver.turn()`` (``AsyncDispatcher.turn``, the gateway's fleet
gate): entering submits the job and waits for its grant, leaving completes it (or cancels it
when the block raised). The turn holds no state of its own: it reads the driver's record of
its waiter (a :class:`TurnRecord`, which only the driver's module changes) and asks the
record to submit, wait and release. ``prioqueue.asyncio`` re-exports it. See
``prioqueue._driver``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Awaitable

    from prioqueue.records import Expired, Grant, Ticket

__all__ = ["Turn", "TurnRecord"]


class TurnRecord(Protocol):
    """What a turn reads and asks of the driver's record of its waiter."""

    @property
    def job_id(self) -> str:
        """The job's id."""

    @property
    def ticket(self) -> Ticket | None:
        """The submit's ticket, None before the turn is entered."""

    @property
    def grant(self) -> Grant | None:
        """The grant being run, None while queued."""

    @property
    def expired(self) -> Expired | None:
        """The lease expiry that ended the turn, if one did."""

    @property
    def requeued(self) -> bool:
        """Whether the job was handed back and waits again."""

    @property
    def attempts(self) -> int:
        """Grants so far (1 after the first)."""

    def revoked_event(self) -> asyncio.Event:
        """Set when the turn loses the resource."""

    def submit(self) -> Ticket:
        """Submit the job (once)."""

    def enter(self) -> Awaitable[Grant]:
        """Submit if needed and wait for the grant."""

    def regrant(self) -> Awaitable[Grant]:
        """Wait for the next grant of a handed-back job."""

    def leave(self, *, failed: bool) -> None:
        """Complete the job, or cancel it when ``failed``."""


class Turn:
    """One job's turn at the resource: an async context manager made by ``turn()``.

    ``async with gate.turn(...) as grant:`` submits the job on entry, waits until it is
    granted and yields the :class:`~prioqueue.records.Grant` (``grant.worker`` names the
    worker that took it when the driver runs several); leaving the block completes the job
    (or cancels it when the block raised). Keep the ``Turn`` object to watch the lease::

        turn = gate.turn("job-1", member="alice", priority="interactive")
        async with turn as grant:
            work = asyncio.ensure_future(run_on_gpu(grant.job))
            await asyncio.wait([work, asyncio.ensure_future(turn.revoked.wait())],
                               return_when=asyncio.FIRST_COMPLETED)

    A ``Turn`` is used once. Callers that want to act between submitting and waiting (e.g.
    answer 429 at once, or report the queue position) call :meth:`submit` first; a turn that
    was submitted must then be entered, or cancelled with :meth:`AsyncDispatcher.cancel`.

    A turn is a read-only handle: every property reads the driver's record of the waiter,
    which only the driver changes.
    """

    __slots__ = ("_record",)

    def __init__(self, record: TurnRecord) -> None:
        self._record = record

    @property
    def job_id(self) -> str:
        """The job's id."""
        return self._record.job_id

    @property
    def attempts(self) -> int:
        """How many grants the turn has taken (more than one after :meth:`regrant`)."""
        return self._record.attempts

    @property
    def ticket(self) -> Ticket | None:
        """The submit's ticket (the job and the queue depth after it), None before submit."""
        return self._record.ticket

    @property
    def grant(self) -> Grant | None:
        """The grant once the job runs, else None (also after its worker gave it back)."""
        return self._record.grant

    @property
    def expired(self) -> Expired | None:
        """The expiry record when the job's lease ran out while it held the resource."""
        return self._record.expired

    @property
    def requeued(self) -> bool:
        """True when the job was given back (its worker was taken out) and awaits a new grant."""
        return self._record.requeued

    @property
    def revoked(self) -> asyncio.Event:
        """An event set when the adapter took the resource back from the holder.

        That happens when the lease expires (then :attr:`expired` is set too) and when the
        running job is cancelled through :meth:`AsyncDispatcher.cancel`. The holder should
        stop its work: another job may already be running.
        """
        return self._record.revoked_event()

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
        return self._record.submit()

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
        return await self._record.enter()

    async def regrant(self) -> Grant:
        """Wait for the next grant after this job was given back (see :attr:`requeued`).

        Call it only when :attr:`requeued` is true, inside the block; the new grant may
        already be there.

        Returns:
            The new grant.

        Raises:
            RuntimeError: The job is not waiting for a new grant.
            DispatcherClosed, JobCancelled, QueueTimeout: As when entering.
        """
        return await self._record.regrant()

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        self._record.leave(failed=exc_type is not None)

    def __repr__(self) -> str:
        record = self._record
        state = "granted" if record.grant else "submitted" if record.ticket else "new"
        return f"<Turn {record.job_id!r} {'expired' if record.expired else state}>"
