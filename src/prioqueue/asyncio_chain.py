"""``AsyncDispatcher.chain``: a :class:`~prioqueue.chain.Chain` run on an asyncio gate (private).

Theory of operation:

* The sans-IO :class:`~prioqueue.chain.Chain` decides what to submit; this module gives it a
  target that submits through the gate (``turn(...).submit()``), so every job of the chain has
  a waiter and the gate's rules (one waiter per job, dispatch after every change, leaving
  frees the resource) hold unchanged.
* Each submitted job gets one task: it enters its turn, awaits ``run(grant)`` while holding
  the resource, leaves (completing the job, or *failing* it when ``run`` raised), then tells
  the chain (``completed`` / ``failed``), which submits what comes next, and queues a
  :class:`ChainResult` for the iterator. Results come in completion order.
* A job the chain cancelled (a ``"stop"`` failure, ``aclose``) yields a result with its
  :class:`~prioqueue.asyncio.JobCancelled` error and is not reported to the chain again.
* The iterator ends when no task is left. A spec the gate refuses when its turn comes (a
  bad argument, a full queue) cancels the chain; the iterator raises that error once the
  results before it were read. ``aclose()`` (and leaving ``async with``) cancels
  the chain, queued and running jobs alike, and awaits the tasks, so nothing is left behind.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import attrs

from prioqueue._readonly import ReadOnly
from prioqueue._timers import disarm
from prioqueue.chain import Chain, ChainProgress, ChainStep
from prioqueue.errors import LeaseExpired
from prioqueue.records import Grant, Job, Ticket

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from prioqueue._driver import DrivenCore, Driver
    from prioqueue._driver._core import TurnOptions
    from prioqueue.chain import ChainOptions
    from prioqueue.turn import Turn
    from prioqueue.views import GroupStatus

__all__ = ["AsyncChain", "ChainResult"]


@attrs.frozen
class ChainResult:
    """One job of an async chain, when it finished.

    Attributes:
        job_id: The job.
        grant: Its grant, or None when it never got the resource (cancelled while queued).
        value: What ``run(grant)`` returned (None on failure).
        error: None when the job completed; else why it did not: the exception ``run``
            raised, ``LeaseExpired`` when its lease ran out, or ``JobCancelled`` when the
            chain (or someone) cancelled it.
    """

    job_id: str
    grant: Grant | None
    value: Any = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        """True when the job completed."""
        return self.error is None


class _GateTarget:
    """The chain's dispatcher: submits through the gate so each job has a waiter."""

    def __init__(self, gate: Driver[DrivenCore], owner: AsyncChain) -> None:
        self._gate = gate
        self._owner = owner

    def submit(
        self, job_id: str, *, member: str, now: float, **options: Unpack[TurnOptions]
    ) -> Ticket:
        del now  # the gate stamps every call with its own clock
        turn = self._gate.chain_turn(job_id, member=member, **options)
        ticket = turn.submit()
        self._owner._spawn(turn)
        return ticket

    def cancel(self, job_id: str, *, now: float) -> Job:
        del now
        job = self._gate.dispatcher.job(job_id)
        self._gate.cancel(job_id)
        return job

    def fail(self, job_id: str, *, now: float) -> Job:
        # Reached only for a job still held when its task reported it (not a normal path):
        # the gate removes it like a cancel, which also tells its waiter.
        return self.cancel(job_id, now=now)

    def state(self, job_id: str) -> Literal["queued", "running"]:
        return self._gate.dispatcher.state(job_id)

    def group_status(self, group: str, *, now: float) -> GroupStatus:
        return self._gate.dispatcher.group_status(group, now=now)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._gate.dispatcher


class AsyncChain:
    """The async iterator made by :meth:`~prioqueue.asyncio.AsyncDispatcher.chain`.

    Iterating starts the chain and yields one :class:`ChainResult` per job as it finishes::

        async with gate.chain(shots, run=render, group="film-1") as film:
            async for result in film:
                print(result.job_id, result.ok, film.progress.done)

    Args:
        gate: The asyncio adapter.
        specs: As for :class:`~prioqueue.chain.Chain` (keyword arguments of ``turn()`` plus
            ``job_id``).
        run: ``async (grant) -> value``, awaited while the job holds the resource.
        **options: ``Chain``'s: ``depth`` (most jobs in flight), ``group`` (the group label;
            None: the first ``job_id``) and ``on_failure`` (the chain's failure policy).

    Attributes:
        chain: The sans-IO chain being driven (read it; the iterator drives it).
        group: The chain's group label.
        progress: The chain's progress.

    Raises:
        TypeError: ``run`` is not callable (and what ``Chain`` raises).
    """

    def __init__(
        self,
        gate: Driver[DrivenCore],
        specs: Iterable[Mapping[str, Any]],
        *,
        run: Callable[[Grant], Awaitable[Any]],
        **options: Unpack[ChainOptions],
    ) -> None:
        if not callable(run):
            raise TypeError(f"run must be an async callable grant -> value, got {run!r}")
        self._gate = gate
        self._run = run
        self._chain = Chain(_GateTarget(gate, self), specs, **options)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._ready: deque[ChainResult] = deque()
        self._wake: asyncio.Event | None = None
        self._error: Exception | None = None
        self._retry: asyncio.TimerHandle | None = None  # a top_up after a full queue

    chain = ReadOnly[Chain](
        "_chain", "The sans-IO chain being driven (read it; the iterator drives it)."
    )
    group = ReadOnly[str]("_chain.group", "The chain's group label.")
    progress = ReadOnly[ChainProgress]("_chain.progress", "The chain's progress.")

    def status(self) -> GroupStatus:
        """Return the group's status now (see ``SizeOneDispatcher.group_status``).

        Raises:
            UnknownGroup: Nothing was submitted yet.
        """
        return self._chain.status(now=self._gate.now())

    def __aiter__(self) -> AsyncChain:
        return self

    async def __anext__(self) -> ChainResult:
        if self._chain.progress.state == "new":
            # A refused first spec raises here.
            self._schedule(self._chain.start(now=self._gate.now()))
        while not self._ready:
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            if not self._tasks and self._retry is None:
                raise StopAsyncIteration
            self._wake = asyncio.Event()
            await self._wake.wait()
        return self._ready.popleft()

    async def aclose(self) -> None:
        """Cancel what is left of the chain (queued and running jobs) and await its tasks."""
        disarm(self._retry)
        self._retry = None
        if self._chain.progress.state in ("new", "running", "stopped"):
            self._chain.cancel(now=self._gate.now(), running="cancel")
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def __aenter__(self) -> AsyncChain:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- internals -----------------------------------------------------------------------

    def _schedule(self, step: ChainStep) -> None:
        """After a full queue, submit the pending spec again when the gate suggests."""
        if step.retry_after is not None and self._retry is None:
            loop = asyncio.get_running_loop()
            self._retry = loop.call_later(step.retry_after, self._top_up)

    def _top_up(self) -> None:
        self._retry = None
        if self._chain.progress.state == "running":
            try:
                self._schedule(self._chain.top_up(now=self._gate.now()))
            except Exception as exc:  # a spec the gate refused: stop; the iterator raises it
                self._chain.cancel(now=self._gate.now(), running="cancel")
                self._error = exc
        self._notify()

    def _notify(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _spawn(self, turn: Turn) -> None:
        self._tasks[turn.job_id] = asyncio.get_running_loop().create_task(self._drive(turn))

    async def _drive(self, turn: Turn) -> None:
        job_id = turn.job_id
        value: Any = None
        error: BaseException | None = None
        try:
            async with turn as grant:
                value = await self._run(grant)
        except Exception as exc:  # the work failed, or the job was cancelled or closed
            error = exc
        if error is None and turn.expired is not None:
            error = LeaseExpired(f"job {job_id!r}'s lease expired while it ran")
        self._tasks.pop(job_id, None)  # before the chain may resubmit the same id
        result = ChainResult(job_id, turn.grant, None if error else value, error)
        try:
            if job_id in self._chain.progress.in_flight:
                now = self._gate.now()
                if error is None:
                    self._schedule(self._chain.completed(job_id, now=now))
                else:
                    self._schedule(self._chain.failed(job_id, now=now))
        except Exception as exc:  # a spec the gate refused: stop; the iterator raises it
            self._chain.cancel(now=self._gate.now(), running="cancel")
            self._error = exc
        self._ready.append(result)
        self._notify()
