"""``FleetDispatcher``: one queue for many one-job-at-a-time workers that pull their jobs.

Theory of operation (the full model, its fairness bound and its proof are
docs/design/fleet.md):

* Jobs wait in **lanes**, one per ``(member, level)`` for the whole fleet, exactly as in
  :class:`~prioqueue.dispatcher.SizeOneDispatcher`; lanes compete with one score,
  ``level + tier + affinity + (now - s) / divisor``, where the affinity term is the *popping
  worker's*: the bonus goes to jobs for the model resident on that worker.
* A worker **pulls**: ``pop(worker, now=...)`` returns the best job it may run (it serves the
  job's model, its ``accepts`` filter says yes, the member is under ``max_running_per_member``,
  no warm worker is holding the job). A lane whose head the worker cannot run offers its
  oldest job that the worker can run.
* **Charge at grant, correct at completion.** A grant charges its lane the job's expected
  charge divided by the fleet's capacity (live workers); completion replaces it with the final
  charge over the same capacity. So one member's backlog cannot take every idle worker at once,
  and ``s`` stays in wall-clock seconds. A job taken back is refunded exactly.
* **Workers vanish.** ``expire`` takes back jobs past their lease and every job of a worker
  silent for ``worker_timeout``; a job is reported failed after ``max_attempts`` grants, never
  dropped.
* Sans-IO: every call that depends on time takes ``now``.
* The class is a facade: it holds one ``prioqueue._core`` state and delegates every call to
  it (docs/design/state.md).

The fleet's public methods and their docstrings are one concern, past the 500-line gauge on
purpose: the class is the fleet's public surface (issue 29).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from prioqueue._batch import BatchPop
from prioqueue._core import choose, grant, restore
from prioqueue._core.config import (
    DEFAULT_CROSSING_SHARE,
    DEFAULT_HISTORY_BYTES,
    DEFAULT_WAIT_BUCKETS,
    ChargeModel,
    Config,
    constructor_arguments,
)
from prioqueue._core.facade import Facade
from prioqueue._core.queue import fire
from prioqueue._journaled import journaled
from prioqueue._lanes import QUEUED, RUNNING
from prioqueue._validate import checked_name
from prioqueue._workers import idle_reasons
from prioqueue.capabilities import Capabilities, checked_capabilities
from prioqueue.errors import ConfigError, InvalidState
from prioqueue.lifecycle import Backoff, LevelBudget
from prioqueue.priority import PriorityPolicy
from prioqueue.records import Grant, Job, WorkerInfo
from prioqueue.scoring import Scorer
from prioqueue.views import WorkerLoad

__all__ = ["FleetDispatcher"]

_F = TypeVar("_F", bound="FleetDispatcher")
_UNSET: Any = object()


class FleetDispatcher(BatchPop, Facade):
    """The waiting jobs of a fleet of workers, and which job each worker pulls next.

    Args:
        scorer: The score's weights (default ``Scorer()``).
        policy: Turns ``submit(priority=...)`` values into priority numbers (default
            ``PriorityPolicy()``).
        charge: How a finished job advances its lane's virtual start: ``"runtime"``,
            ``"estimate"``, a number, or a callable ``(job, runtime) -> seconds``. At a grant
            the same model is applied to the job's *expected* runtime (its estimate, else the
            recent mean runtime of its model, else of its level, else 60 s).
        lease_for: Sizes each grant's lease: ``(job, worker_info) -> seconds``, or
            ``job -> seconds`` (the signature is read once, here). A
            :class:`~prioqueue.lease.LeaseCalculator` gets ``extra_slow_worker`` from the
            worker's ``slow`` flag. None for no leases.
        max_queued: Most jobs that may wait at once; None for no limit.
        max_queued_per_member: Most jobs one member may have waiting; None for no limit.
        max_running_per_member: Most jobs of one member that workers may hold at once; a
            member at the cap is skipped (its lanes keep their place). None for no limit.
        max_attempts: Grants a job gets before a lease expiry or a worker timeout fails it.
        worker_timeout: Seconds without a pop, heartbeat or completion after which ``expire``
            takes a worker's jobs back; None never.
        warm_hold: Placement (docs/design/fleet.md, "Placement: the warm hold"): a cold
            worker is refused a job while another worker with the job's model loaded is free
            (for ``warm_hold`` seconds after the job was queued) or is busy and expected to
            start it within ``warm_hold`` seconds (and ``load_seconds``); 0 turns it off.
        load_seconds: Cold-load seconds per model name (a swap's cost): a job is kept for a
            busy warm worker only while that worker is expected to start it no later than a
            cold worker would finish loading the model. None (or a model not in it): only
            ``warm_hold`` bounds the wait.
        fair_share: False turns every job into its own lane aging from its arrival.
        track_reorders: Keep the counterfactual rankings behind ``Stats`` reorder counts.
        crossing_share: The share of GPU time that *crossings* (grants to a job below the
            highest level with eligible work, which only aging can carry there) may take
            from the higher levels while they have work waiting; beyond it a crossing is
            deferred and the higher level's best job is granted instead (see
            ``docs/design/dispatcher.md``, "Bounded crossings"). In ``(0, 1]``; 1 never
            defers (the policy before issue 17). Default 0.05.
        history: Grants remembered for ``explain``'s overtakes.
        history_bytes: The history's byte budget (estimated; the payload is never kept).
        wait_buckets: Upper bounds of the grant-wait histogram, increasing.
        budgets: Overload protection per priority level: ``{level: LevelBudget(max_queued=,
            max_wait=, ttl=)}`` (docs/design/lifecycle.md); none by default.
        backoff: The retry delays of ``fail(retry=True)`` for jobs without their own
            (default: retry at once).

    Attributes:
        scorer: The scorer (read-only).
        policy: The priority policy (read-only).
        fair_share: Whether lanes are per member (True) or per job (False); read-only.

    Raises:
        ConfigError: An option is out of range.
        TypeError: ``scorer`` or ``policy`` has the wrong type.

    Complexity: ``submit``, ``complete``, ``cancel`` are amortised O(log n + M); ``pop`` is
    amortised O(log n + M) for a worker that serves every model with no filter, else
    O((k + 1)(log n + F) + a) for k lanes skipped, F served models per lane and a ``accepts``
    calls; ``expire`` and ``next_deadline`` add O(workers).
    """

    def __init__(
        self,
        scorer: Scorer | None = None,
        *,
        policy: PriorityPolicy | None = None,
        charge: ChargeModel = "runtime",
        lease_for: Callable[..., float] | None = None,
        max_queued: int | None = None,
        max_queued_per_member: int | None = None,
        max_running_per_member: int | None = None,
        max_attempts: int = 3,
        worker_timeout: float | None = None,
        warm_hold: float = 0.0,
        load_seconds: Mapping[str, float] | None = None,
        fair_share: bool = True,
        track_reorders: bool = True,
        crossing_share: float = DEFAULT_CROSSING_SHARE,
        history: int = 10_000,
        history_bytes: int = DEFAULT_HISTORY_BYTES,
        wait_buckets: Sequence[float] = DEFAULT_WAIT_BUCKETS,
        budgets: Mapping[int, LevelBudget] | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        super().__init__(Config.checked(constructor_arguments(locals())))

    # ------------------------------------------------------------------ workers

    @journaled
    def join(
        self,
        name: str,
        *,
        models: Iterable[str] | None = None,
        resident: str | None = None,
        slots: int = 1,
        slow: bool = False,
        accepts: Callable[[Job], bool] | None = None,
        capabilities: Capabilities | Mapping[str, Any] | None = None,
        now: float,
    ) -> WorkerInfo:
        """Add a worker, or update every setting of a known one (a re-join revives it).

        Args:
            name: The worker's name (non-empty).
            models: The models it serves; None serves every model. A job without a model runs
                on any worker.
            resident: The model loaded on it now; None keeps a re-joining worker's resident
                (a new worker starts with none).
            slots: Jobs it may hold at once (1: run one; 2: run one and prefetch one).
            slow: Whether it is extra slow (a ``LeaseCalculator`` lease gets its x3).
            accepts: ``job -> bool``: a filter on the jobs it may take, or None. It is called
                during ``pop`` and ``idle_reasons`` and must not call back into the fleet; its
                result is read as a truth value, and an exception it raises propagates out of
                those calls with nothing changed but the worker's last word.
            capabilities: What it can run (:class:`~prioqueue.capabilities.Capabilities`,
                or its ``as_dict()`` form), or None for anything. Unlike ``accepts`` it is
                data: journaled, snapshotted, and a job's ``needs`` are checked against it.
            now: The current monotonic time.

        Returns:
            The worker as it stands.

        Raises:
            ValueError: A name or model is not a non-empty str, ``models`` is not an iterable
                of names (or None), ``slots`` is not an int >= 1,
                ``slow`` is not a bool, ``accepts`` is not callable, ``capabilities`` is not
                valid, or ``now`` is out of range.

        Complexity: O(|models| + |capabilities|).
        """
        state = self._core
        fire(state, now)
        name = checked_name("worker name", name)
        served = None
        if models is not None:
            if isinstance(models, str) or not isinstance(models, Iterable):
                raise ValueError(f"models must be an iterable of model names, got {models!r}")
            served = frozenset(checked_name("model", model) for model in models)
        if resident is not None:
            resident = checked_name("resident", resident)
        if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
            raise ValueError(f"slots must be an int >= 1, got {slots!r}")
        if not isinstance(slow, bool):
            raise ValueError(f"slow must be a bool, got {slow!r}")
        if accepts is not None and not callable(accepts):
            raise ValueError(f"accepts must be a callable job -> bool or None, got {accepts!r}")
        caps = checked_capabilities(capabilities)
        t = state.tick(now)
        worker = state.workers.by_name.get(name)
        if worker is None:
            worker = state.workers.add(name, t)
        else:
            state.workers.seen(worker, t)
        worker.configure(served, slots, slow, accepts, caps)
        if resident is not None:
            state.workers.set_resident(worker, resident)
        return worker.info()

    @journaled
    def heartbeat(self, name: str, *, now: float, resident: str | None = _UNSET) -> WorkerInfo:
        """Tell the fleet a worker is alive (a timed-out worker is revived).

        Args:
            name: A joined worker.
            now: The current monotonic time.
            resident: The model now loaded on it (None: nothing loaded); left unchanged when
                not given.

        Returns:
            The worker as it stands.

        Raises:
            UnknownWorker: The worker has not joined (or left).
            ValueError: ``resident`` is not a non-empty str or None, or ``now`` is out of range.

        Complexity: O(1).
        """
        state = self._core
        fire(state, now)
        worker = state.workers.worker_of(name)
        if resident is not _UNSET and resident is not None:
            resident = checked_name("resident", resident)
        t = state.tick(now)
        state.workers.seen(worker, t)
        if resident is not _UNSET:
            state.workers.set_resident(worker, resident)
        return worker.info()

    @journaled
    def leave(self, name: str, *, now: float) -> list[Job]:
        """Remove a worker; the jobs it holds go back to the heads of their lanes.

        Leaving is not the jobs' fault: they are requeued whatever their attempt count, and
        each lane is refunded its up-front charge.

        Args:
            name: A joined worker.
            now: The current monotonic time.

        Returns:
            The jobs requeued, by submission order.

        Raises:
            UnknownWorker: The worker has not joined (or left).
            ValueError: ``now`` is out of range.

        Complexity: O(slots log n).
        """
        state = self._core
        fire(state, now)
        worker = state.workers.worker_of(name)
        t = state.tick(now)
        taken = grant.take_back(state, list(worker.held), t, always=True)
        state.workers.remove(worker)
        return [entry.job for entry, _ in taken]

    def requeue(self, job_id: str, *, now: float) -> Job:
        """Give one held job back to the head of its lane, as ``leave`` does for each of its.

        For a job whose run never reached its worker (a connection that failed): not the
        job's fault, so it is requeued whatever its attempt count and its lane is refunded
        its up-front charge. The worker keeps its other jobs.

        Args:
            job_id: A held job.
            now: The current monotonic time.

        Returns:
            The requeued job.

        Raises:
            UnknownJob: The id is not queued or held.
            InvalidState: The job is queued, not held.
            ValueError: ``now`` is out of range.

        Complexity: O(log n + slots).
        """
        state = self._core
        fire(state, now)
        entry = state.entry(job_id)
        if entry.state != RUNNING:  # queued, or delayed (docs/design/lifecycle.md)
            raise InvalidState(f"job {job_id!r} is queued, not held: nothing to requeue")
        t = state.tick(now)
        grant.take_back(state, [entry], t, always=True)
        return entry.job

    def _narrowed(self, name: str, test: Callable[[Job], bool]) -> AbstractContextManager[None]:
        """A joined worker's filter narrowed by ``test`` (``pop_many(siblings=True)``)."""
        return self._core.workers.worker_of(name).narrowed(test)

    @journaled
    def pop(self, name: str, *, now: float) -> Grant | None:
        """Pull the best job this worker may run now (see the class docstring).

        The worker is marked seen (a timed-out worker is revived) even when nothing is
        returned.

        Args:
            name: A joined worker.
            now: The current monotonic time.

        Returns:
            The grant (``Grant.worker`` is the name), or None when the worker holds ``slots``
            jobs or no queued job is eligible for it (``idle_reasons`` says why).

        Raises:
            UnknownWorker: The worker has not joined (or left).
            ValueError: ``now`` is out of range.
            ChargeError: The charge model returned no finite number >= 0 for the expected
                charge (a ``ValueError``; nothing changes, the error names the job).
            LeaseError: ``lease_for`` raised or returned no positive finite number of seconds;
                nothing changes and the error names the job.
            Exception: Whatever the worker's ``accepts`` filter raised, unchanged; no job is
                granted and nothing changes but the worker's last word (it was seen).

        Complexity: see the class docstring.
        """
        state = self._core
        fire(state, now)
        worker = state.workers.worker_of(name)
        t = state.tick(now)
        state.workers.seen(worker, t)
        return grant.pop(state, worker, t)

    def would_pop(self, name: str, *, now: float) -> Grant | None:
        """What ``pop(name, now=now)`` would return, with no change of any state: a read.

        The preview is ``pop``'s own computation (the ranking, the worker's eligibility,
        bounded crossings, the overdue rule, the warm hold, the lease and the expected
        charge), stopped before its first change: the worker's last word, the clock, the
        counters, the grant history, the crossing credit and the lanes stay as they were
        (docs/design/state.md, "Previews and views"). So a ``pop`` at the same ``now`` with
        no call between returns an equal grant, or None when this returns None. A timed-out
        worker is previewed as its pop would revive it (counted in the capacity).

        It calls ``lease_for``, the charge model and the worker's ``accepts`` as ``pop``
        does: they must be pure functions of their arguments for the answer to hold.

        Args:
            name: A joined worker.
            now: The time of the pop it previews (not before a time already seen).

        Returns:
            The grant ``pop`` would make, or None (slots full, nothing eligible).

        Raises:
            UnknownWorker: The worker has not joined (or left).
            ValueError: ``now`` is out of range (not finite, or before a time already seen).
            InvalidState: A lifecycle timer is due at ``now`` (a delayed job's release, a
                ttl): ``pop`` would fire it first, a change no read makes; call ``expire``
                (or ``pop``) at ``now`` first. A driver that expires before it pops never
                sees this.
            ChargeError, LeaseError: As ``pop`` would raise them (nothing changes).
            Exception: Whatever the worker's ``accepts`` filter raised, unchanged.

        Complexity: ``pop``'s, plus O(k) for k timers due at ``now`` when the earliest is.
        """
        state = self._core
        worker = state.workers.worker_of(name)
        t = state.checked_now(now)
        timers = state.lifecycle.timers
        if timers.next <= t and timers.any_due(t):
            raise InvalidState(
                f"a lifecycle timer is due at {t!r} (a delayed job's release or a ttl): a pop "
                "would fire it first; call expire() at that time before previewing a pop"
            )
        return grant.pop(state, worker, t, preview=True)

    def idle_reasons(self, name: str, *, now: float) -> Mapping[str, int]:
        """Why ``pop`` finds nothing for this worker: queued jobs it may not take, by cause.

        Causes, checked in this order (each job counts once, under the first that applies):
        ``"slots_full"`` (the worker holds ``slots`` jobs), ``"member_cap"``, ``"model"`` (not
        served, or a job that accepts several models none of which it serves), then the
        capability causes of ``prioqueue.capabilities.CAPABILITY_CAUSES`` (``"max_pixels"``,
        ``"lora"``...: the job's ``needs`` do not fit the worker's ``capabilities``),
        ``"accepts"`` (its filter said no), ``"warm_hold"`` (kept for a warm worker).

        Args:
            name: A joined worker.
            now: The current monotonic time.

        Returns:
            Counts per cause (causes with no job omitted); empty when it may take every job.

        Raises:
            UnknownWorker: The worker has not joined (or left).
            ValueError: ``now`` is out of range.
            Exception: Whatever the worker's ``accepts`` filter raised, unchanged (nothing
                changes).

        Complexity: O(n) in the queued jobs (diagnostic), plus one ``accepts`` call per job
        that reaches that check.
        """
        state = self._core
        fire(state, now)
        worker = state.workers.worker_of(name)
        t = state.tick(now)
        entries = state.entries_in(QUEUED)
        search = choose.search_for(state, worker, t)
        counts = idle_reasons(entries, worker, search)
        relaxed = search.relaxed()
        if relaxed is not None and sum(counts.values()) == len(entries):
            counts = idle_reasons(entries, worker, relaxed)  # nothing eligible: capped holds
        return counts

    def next_hold_end(self) -> float | None:
        """When a warm hold kept for a busy worker lapses, with nothing else happening.

        The warm hold keeps a job from a cold worker while another live worker that has the
        job's model loaded is free (for ``warm_hold`` seconds after the job was queued), or is
        expected to free a slot within ``warm_hold`` seconds of now, either way (see
        docs/design/fleet.md). The second kind lapses at that worker's expected free time plus
        ``warm_hold`` if it is still busy then. A driver that pulls only when something happens
        (a submit, a completion, ``queued_at + warm_hold`` of a job it holds back) should also
        pull at this time.

        Returns:
            The earliest such time after the latest ``now`` seen, or None (``warm_hold`` is 0,
            or no busy live worker serves its resident model).

        Complexity: O(workers x slots).
        """
        hold = self._core.config.warm_hold
        if not hold > 0:
            return None
        t = self._core.now
        best: float | None = None
        for worker in self._core.workers.by_name.values():
            resident = worker.resident
            if (
                resident is None
                or worker.timed_out
                or len(worker.held) < worker.slots
                or not worker.serves(resident)
            ):
                continue
            end = worker.expected_free() + hold
            if end > t and (best is None or end < best):
                best = end
        return best

    def workers(self) -> list[WorkerInfo]:
        """Every known worker (timed-out ones included), by name. O(workers x slots)."""
        workers = self._core.workers.by_name
        return [workers[name].info() for name in sorted(workers)]

    def worker(self, name: str) -> WorkerInfo:
        """One worker as it stands.

        Raises:
            UnknownWorker: The worker has not joined (or left).
        """
        return self._core.workers.worker_of(name).info()

    def worker_load(self, name: str) -> WorkerLoad:
        """A worker's last word, time-out and slots in use: ``worker``'s cheap subset. O(1).

        Raises:
            UnknownWorker: The worker has not joined (or left).
        """
        worker = self._core.workers.worker_of(name)
        return WorkerLoad(worker.last_seen, worker.timed_out, len(worker.held), worker.slots)

    def holder(self, job_id: str) -> str | None:
        """The worker holding a job, or None when it is queued.

        Raises:
            UnknownJob: The id is not queued or held.
        """
        entry = self._core.entry(job_id)
        return entry.worker.name if entry.state == RUNNING else None

    @property
    def capacity(self) -> int:
        """The fleet's capacity: its live workers (at least 1; charges are divided by it)."""
        return max(1, self._core.workers.live)

    @property
    def held(self) -> list[Grant]:
        """The grants of every job the workers hold, by grant time. O(h log h)."""
        return [e.grant for e in self._core.workers.held_entries()]

    @classmethod
    def restore(
        cls: type[_F],
        state: Mapping[str, Any],
        *,
        scorer: Scorer | None = None,
        now: float | None = None,
        require_lease: bool = False,
        **options: Any,
    ) -> _F:
        """Rebuild a fleet from ``snapshot()`` data: no queued job, lane age or lease lost.

        Workers come back with their models, resident, slots, slow flag, held jobs, last word
        and timed-out state (their ``accepts`` filters are not stored: re-join to set them);
        the recent runtimes behind the expected charge come back too, so the restored fleet
        grants exactly what the original would have.

        Args:
            state: What ``snapshot`` returned (possibly through JSON).
            scorer: The scorer of the new fleet.
            now: The new process's monotonic time; every stored time is shifted by
                ``now - taken_at`` (None keeps them: same clock).
            require_lease: Refuse a held job without a lease (an adapter that relies on leases
                to free a worker sets it).
            **options: The constructor's other keyword arguments.

        Returns:
            The restored fleet.

        Raises:
            ValueError: ``state`` is not a valid snapshot (the message says what is wrong).

        Complexity: O(n log n) in the jobs.
        """
        if "workers" in options:
            raise ConfigError("workers come from the snapshot")
        return restore.restored(cls, cls._core_of, state, scorer, now, require_lease, options)
