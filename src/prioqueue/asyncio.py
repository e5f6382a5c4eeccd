"""An asyncio driver for :class:`~prioqueue.dispatcher.SizeOneDispatcher`: wait for your turn.

Theory of operation
-------------------
The core is sans-IO: it takes ``now`` and never sleeps. :class:`AsyncDispatcher` owns one
:class:`~prioqueue.dispatcher.SizeOneDispatcher`, one clock and one event loop. It is the
one-worker case of the library's one asyncio driver (``prioqueue._driver``; the gateway's
fleet gate is its case of several workers, see ``docs/design/driver.md``), and keeps these
rules:

1. **One waiter per job.** ``turn()`` submits the job and registers a waiter: a future that
   only the driver's pump resolves. While a waiter is registered its job is
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

Time: the dispatcher is stamped with ``clock()`` (``SYSTEM_CLOCK.monotonic`` of
:mod:`prioqueue.clock` by default). Sleeping (lease timer, queue timeouts) uses the event
loop's timer with delays computed from the clock. With an injected manual clock, call
:meth:`AsyncDispatcher.tick` after moving it; or give it the loop's own clock
(``clock=loop.time``) on a loop whose time a test controls.

Everything here must run on the event loop's thread; the adapter is not thread-safe.

Costs: a turn costs one submit, one dispatch and one complete of the core (each
O(log n + M), see the dispatcher's design note), one future and O(1) bookkeeping.
"""

from __future__ import annotations

import asyncio  # noqa: F401 - the stdlib module stays reachable as prioqueue.asyncio.asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from prioqueue._driver import Clock, Driver, ExpiryCallback, Remove
from prioqueue.asyncio_chain import AsyncChain, ChainResult
from prioqueue.clock import SYSTEM_CLOCK
from prioqueue.dispatcher import SizeOneDispatcher
from prioqueue.errors import DispatcherClosed, JobCancelled, QueueTimeout
from prioqueue.records import Grant
from prioqueue.turn import Turn

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from prioqueue.chain import ChainOptions
    from prioqueue.records import Expired

__all__ = [
    "AsyncChain",
    "AsyncDispatcher",
    "ChainResult",
    "DispatcherClosed",
    "JobCancelled",
    "QueueTimeout",
    "Turn",
]

_ONE = ("",)


class _OneWorker:
    """The pull policy of one worker (a ``PullPolicy``): ``dispatch(now)``, resident model kept.

    A grant nobody takes, or one its holder never used, loaded no model: the resident model
    seen before the pull is restored. One resource holds one grant at a time, so one model
    remembered is enough.
    """

    __slots__ = ("_before", "_d", "_seen")

    def __init__(self, d: SizeOneDispatcher) -> None:
        self._d = d
        self._seen: str | None = None  # the resident model before the last dispatch
        self._before: str | None = None  # ... before the held job's grant

    def order(self, now: float) -> tuple[str]:
        return _ONE

    def full(self, worker: str) -> bool:
        return False

    def pop(self, worker: str, now: float) -> Grant | None:
        self._seen = self._d.resident_model
        return self._d.dispatch(now)

    def refused(self, worker: str) -> bool:
        return False

    def give_back(self, grant: Grant, now: float, remove: Remove) -> None:
        remove(grant.job.id, now, None)
        self._d.set_resident_model(self._seen)  # nothing was loaded for it

    def granted(self, grant: Grant) -> None:
        self._before = self._seen

    def unused(self, grant: Grant) -> None:
        if self._d.resident_model == grant.job.model:
            self._d.set_resident_model(self._before)

    def ended(self, grant: Grant, now: float) -> None:
        pass

    def on_expiry(self, record: Expired, now: float) -> None:
        pass


class AsyncDispatcher(Driver[SizeOneDispatcher]):
    """Run a :class:`~prioqueue.dispatcher.SizeOneDispatcher` on an asyncio event loop.

    The one-worker case of the driver (``prioqueue._driver.Driver``): the resource is one
    worker, pulled for with ``dispatch(now)``.

    Args:
        dispatcher: The dispatcher to drive (a default one when None). The adapter must be
            the only caller that changes it; reading it (``stats``, ``explain``,
            ``snapshot``) is fine. Queued jobs that were not submitted through the adapter
            (restored from a snapshot, say) have nobody to run them and are cancelled when
            they are granted.
        clock: A zero-argument callable returning monotonic seconds; every ``now`` given to
            the dispatcher comes from it. Inject a manual clock to control time in tests
            and call :meth:`tick` after moving it.
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
        clock: Clock = SYSTEM_CLOCK.monotonic,
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
        super().__init__(d, _OneWorker(d), clock=clock, on_expired=on_expired)

    def holding(self, worker: str = "") -> int:
        """Return 1 while a job holds the resource, else 0. O(1).

        Args:
            worker: Ignored (there is one resource).
        """
        return 0 if self._d.running is None else 1

    def held(self) -> list[Grant]:
        """Return the running job's grant in a list (empty when the resource is free). O(1)."""
        running = self._d.running
        return [] if running is None else [running]

    def set_resident(self, worker: str, model: str | None) -> None:
        """Same as :meth:`set_resident_model` (``worker`` is ignored: one resource)."""
        self._d.set_resident_model(model)

    def set_resident_model(self, model: str | None) -> None:
        """Tell the dispatcher which model is loaded (None after the server unloads it).

        Args:
            model: The resident model, or None.
        """
        self._d.set_resident_model(model)

    def chain(
        self,
        specs: Iterable[Mapping[str, Any]],
        *,
        run: Callable[[Grant], Awaitable[Any]],
        **options: Unpack[ChainOptions],
    ) -> AsyncChain:
        """Run a sequence of jobs through :class:`~prioqueue.chain.Chain`, ``depth`` at a time.

        ``async for result in gate.chain(specs, run=render):`` submits the first ``depth``
        jobs, awaits ``run(grant)`` while each holds the resource, submits the next as each
        finishes, and yields a :class:`ChainResult` per job in completion order (a job whose
        ``run`` raised counts as failed and the failure policy applies). Use ``async with``
        (or ``aclose()``) to cancel what is left when leaving the loop early.

        Args:
            specs: The jobs: mappings of :meth:`turn`'s keyword arguments plus ``job_id``.
            run: ``async (grant) -> value``: the work, done while the job holds the resource.
            **options: ``Chain``'s keyword arguments (:class:`~prioqueue.chain.ChainOptions`):
                ``depth``, most jobs in flight at once (default 1); ``group``, the group label
                (None, the default: the first ``job_id``); ``on_failure``, ``"stop"`` (the
                default), ``"skip"`` or ``("retry", n)`` (see ``Chain``).

        Returns:
            The async iterator of results.

        Raises:
            TypeError, ValueError, ConfigError: As ``Chain`` does; ``run`` is not callable.
        """
        return AsyncChain(self, specs, run=run, **options)
