"""One job's turn at a driven resource: the async context manager of every driver (private).

A :class:`Turn` is made by ``Driver.turn()`` (``AsyncDispatcher.turn``, the gateway's fleet
gate): entering submits the job and waits for its grant, leaving completes it (or cancels it
when the block raised). Only the driver resolves its future; see ``prioqueue._driver``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from prioqueue._async_errors import JobCancelled

if TYPE_CHECKING:
    from prioqueue.records import Expired, Grant, Ticket

__all__ = ["Turn", "TurnOwner"]


class TurnOwner(Protocol):
    """What a turn calls on its driver (``prioqueue._driver.Driver``)."""

    @property
    def _waiters(self) -> Mapping[str, Turn]: ...

    def _submit(self, turn: Turn) -> Ticket: ...

    def _release(self, turn: Turn, *, failed: bool, unused: bool = False) -> None: ...


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
    """

    __slots__ = (
        "_entered",
        "_expired",
        "_fails",
        "_future",
        "_gate",
        "_grant",
        "_kwargs",
        "_requeued",
        "_resident_before",
        "_revoked",
        "_ticket",
        "_timeout",
        "_timer",
        "attempts",
        "job_id",
    )

    def __init__(
        self, gate: TurnOwner, job_id: str, kw: dict[str, Any], timeout: float | None
    ) -> None:
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
        self._requeued = False
        self._fails = False  # a block that raises fails the job (a chain's turn), not cancel
        self.attempts = 0
        """How many grants the turn has taken (more than one after :meth:`regrant`)."""

    @property
    def ticket(self) -> Ticket | None:
        """The submit's ticket (the job and the queue depth after it), None before submit."""
        return self._ticket

    @property
    def grant(self) -> Grant | None:
        """The grant once the job runs, else None (also after its worker gave it back)."""
        return self._grant

    @property
    def expired(self) -> Expired | None:
        """The expiry record when the job's lease ran out while it held the resource."""
        return self._expired

    @property
    def requeued(self) -> bool:
        """True when the job was given back (its worker was taken out) and awaits a new grant."""
        return self._requeued

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
        return await self._wait()

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
        if not self._requeued or self._future is None:
            raise RuntimeError(f"turn {self.job_id!r} is not waiting for a new grant")
        self._requeued = False
        return await self._wait()

    async def _wait(self) -> Grant:
        future = self._future
        assert future is not None
        try:
            grant = await future
            if self._gate._waiters.get(self.job_id) is not self:
                # Revoked between the grant and this task's wake-up (cancel or expiry).
                why = "its lease expired" if self._expired else "it was cancelled"
                raise JobCancelled(f"job {self.job_id!r} lost its grant before it began: {why}")
        except BaseException:
            # Cancelled while waiting, or failed by timeout/close/cancel. In the first case
            # the job may still be queued, or may even have been granted in the same
            # instant: give it back either way (a no-op when the adapter removed it).
            self._gate._release(self, failed=True, unused=True)
            raise
        self.attempts += 1
        return grant

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        self._gate._release(self, failed=exc_type is not None)

    def _stop_timer(self) -> None:
        """Cancel the queue time-out's timer (granted, removed or released)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def __repr__(self) -> str:
        state = "granted" if self._grant else "submitted" if self._ticket else "new"
        return f"<Turn {self.job_id!r} {'expired' if self._expired else state}>"
