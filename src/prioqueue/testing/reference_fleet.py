"""A brute-force model of :class:`~prioqueue.fleet.FleetDispatcher`, for tests.

Theory of operation
-------------------
:class:`ReferenceFleet` is written from ``docs/design/fleet.md`` alone, rule by rule, with
plain lists: every ``pop`` rescans every queued job, decides its eligibility for the popping
worker and recomputes every lane's offer and key from scratch. There are no heaps, no lazy
deletion and no cached keys, so it is slow (O(n) per call in the queued jobs) and meant to be
obviously right: random tests drive it beside the real dispatcher and compare every answer.

The rules it keeps, in the note's words, are listed in ``_rules``.

Statistics are modelled (reorders only on fast-path grants: see ``fast_path``); ``explain``,
``forecast`` and snapshots are not. Argument checks are minimal, but every error the tests
compare raises the same exception type as the real dispatcher.

The fleet is the public calls over the reference owners it composes (the layout:
``prioqueue.testing``): one facade, so one concern, past the 500-line gauge on purpose.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, ClassVar

from prioqueue._batch import BatchPop
from prioqueue._groups import checked_group
from prioqueue._readonly import ReadOnly
from prioqueue._spec import check_options
from prioqueue.capabilities import checked_capabilities
from prioqueue.errors import InvalidState, LeaseExpired, UnknownJob
from prioqueue.priority import PriorityPolicy
from prioqueue.records import (
    Completed,
    Expired,
    Grant,
    Job,
    JobState,
    Stats,
    Ticket,
    WorkerInfo,
)
from prioqueue.scoring import Scorer
from prioqueue.testing._charges import ReferenceCharges
from prioqueue.testing._grants import ReferenceGrants
from prioqueue.testing._lanes import ReferenceLanes
from prioqueue.testing._lifecycle import ReferenceLifecycle
from prioqueue.testing._options import DEFAULTS, FleetOptions, WorkerSettings
from prioqueue.testing._records import (
    DEFAULT_EXPECTED_RUNTIME,
    RECENT_RUNTIMES,
    Held,
    finite,
)
from prioqueue.testing._rules import ReferenceRules
from prioqueue.testing._stats import ReferenceStats, Runtimes
from prioqueue.testing._workers import UNCHANGED, ReferenceWorkers

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from prioqueue._spec import SubmitOptions

__all__ = ["DEFAULT_EXPECTED_RUNTIME", "RECENT_RUNTIMES", "ReferenceFleet"]


class ReferenceFleet(BatchPop):
    """A brute-force model of ``FleetDispatcher`` for tests: same calls, same answers.

    Each option left out takes ``FleetDispatcher``'s default.

    Args:
        scorer: The scoring weights (default ``Scorer()``).
        policy: Resolves priority numbers and aliases (default ``PriorityPolicy()``).
        charge: ``"runtime"``, ``"estimate"``, a constant number of seconds, or a callable
            ``(job, runtime) -> seconds``.
        lease_for: ``(job, worker_info) -> seconds`` or ``job -> seconds`` for each grant's
            lease (a ``LeaseCalculator`` gets the worker's ``slow`` flag), or None.
        max_queued: The most queued jobs, or None.
        max_queued_per_member: The most queued jobs of one member, or None.
        max_running_per_member: The most jobs of one member that workers hold, or None.
        max_attempts: Grants a job gets before an expired lease fails it.
        worker_timeout: Seconds of silence after which ``expire`` takes a worker's jobs back.
        warm_hold: Placement: seconds a job stays reserved for a warm worker (0: off).
        load_seconds: Cold-load seconds per model (caps the wait for a busy warm worker).
        fair_share: False makes every job its own lane with ``s = arrival`` and no charge.
        track_reorders: False leaves the reorder counts at zero.
        crossing_share: The share of GPU time crossings may take (1: never deferred).
        wait_buckets: Upper bounds of the grant-wait histogram (``inf`` is appended).
        budgets: ``{level: LevelBudget}`` (docs/design/lifecycle.md; ``_lifecycle``).
        backoff: The retry delays of ``fail(retry=True)`` for jobs without their own.

    Attributes:
        scorer: The scorer (read-only).
        policy: The priority policy (read-only).

    Raises:
        TypeError: An option ``FleetDispatcher`` does not take (or ``history``,
            ``history_bytes``: the model keeps no history).
    """

    scorer = ReadOnly[Scorer]("_rules.scorer", "The scorer.")
    policy = ReadOnly[PriorityPolicy]("_rules.policy", "The priority policy.")

    # The classes of the two owners an ablation replaces (tests/test_fleet_scenarios.py: a
    # subclass of the fleet names a subclass of the owner): the runtimes, whose ``expected``
    # is every expected runtime, and the worker table, whose ``capacity`` is every ``N``.
    _runtimes_type: ClassVar[type[Runtimes]] = Runtimes
    _workers_type: ClassVar[type[ReferenceWorkers]] = ReferenceWorkers

    def __init__(self, scorer: Scorer | None = None, **options: Unpack[FleetOptions]) -> None:
        check_options(
            options, call="ReferenceFleet()", named="scorer", allowed=FleetOptions.__annotations__
        )
        o: FleetOptions = {**DEFAULTS, **options}
        policy = o["policy"]
        self._fair_share = o["fair_share"]
        self._max_attempts = o["max_attempts"]
        self._latest = -math.inf
        self._seq = 0
        self._labels: dict[str, str | None] = {}  # job id -> group label
        self._lanes = ReferenceLanes(self._fair_share)
        self._workers = self._workers_type(o["worker_timeout"], float(o["warm_hold"]))
        self._runtimes = self._runtimes_type()
        self._stats = ReferenceStats(tuple(float(bound) for bound in o["wait_buckets"]))
        self._rules = ReferenceRules(
            Scorer() if scorer is None else scorer,
            PriorityPolicy() if policy is None else policy,
            self._lanes,
            self._workers,
            self._runtimes,
            fair_share=self._fair_share,
            warm_hold=float(o["warm_hold"]),
            load_seconds=o["load_seconds"] or {},
            max_running=o["max_running_per_member"],
            share=float(o["crossing_share"]),
        )
        self._lifecycle = ReferenceLifecycle(
            self._lanes,
            self._rules,
            self._runtimes,
            self._stats,
            budgets=o["budgets"],
            backoff=o["backoff"],
            max_queued=o["max_queued"],
            max_per_member=o["max_queued_per_member"],
        )
        self._grants = ReferenceGrants(
            self._lanes,
            self._workers,
            self._rules,
            ReferenceCharges(o["charge"], o["lease_for"]),
            self._runtimes,
            self._stats,
            fair_share=self._fair_share,
            track_reorders=o["track_reorders"],
            max_attempts=o["max_attempts"],
        )

    # -- time --------------------------------------------------------------------------------

    def _time(self, now: float) -> float:
        """Check ``now``: finite and not earlier than the latest call that succeeded.

        The lifecycle's lapses and releases due by ``now`` are then applied.
        """
        value = finite("now", now)
        if value < self._latest:
            raise ValueError(f"time went backwards: now={now!r} < {self._latest!r}")
        self._lifecycle.advance(value)
        return value

    @contextmanager
    def _at(self, now: float) -> Iterator[float]:
        """Check ``now`` (``_time``); it becomes the latest time when the block succeeds.

        A call that raises, in the check or in the block, leaves the latest time as it was.
        """
        checked = self._time(now)
        yield checked
        self._latest = checked

    # -- reading -----------------------------------------------------------------------------

    @property
    def held(self) -> list[Grant]:
        """The grants of every held job, by grant time (then ``seq``)."""
        return [held.grant for held in self._workers.held()]

    def workers(self) -> list[WorkerInfo]:
        """Every known worker's info (timed-out ones included), sorted by name."""
        return self._workers.infos()

    @property
    def capacity(self) -> int:
        """``N = max(1, live workers)``."""
        return self._workers.capacity

    def __len__(self) -> int:
        return len(self._lifecycle)

    def __contains__(self, job_id: object) -> bool:
        return isinstance(job_id, str) and self._known(job_id)

    def job(self, job_id: str) -> Job:
        """Return a queued or held job.

        Raises:
            UnknownJob: The id is neither queued nor held.
        """
        return self._found(job_id)[0]

    def state(self, job_id: str) -> JobState:
        """Return ``"queued"`` or ``"running"`` (held by a worker).

        Raises:
            UnknownJob: The id is neither queued nor held.
        """
        return self._found(job_id)[1]

    def holder(self, job_id: str) -> str | None:
        """Return the name of the worker holding ``job_id``, or None when it is queued.

        Raises:
            UnknownJob: The id is neither queued nor held.
        """
        self._found(job_id)
        held = self._workers.held_by_id(job_id)
        return None if held is None else held.worker

    def worker(self, name: str) -> WorkerInfo:
        """Return a known worker's info.

        Raises:
            UnknownWorker: The name was never joined, or has left.
        """
        return self._workers.info(self._workers.get(name))

    def group_of(self, job_id: str) -> str | None:
        """The group label a job was submitted with (None: none)."""
        return self._labels.get(job_id)

    def _narrowed(self, name: str, test: Callable[[Job], bool]) -> AbstractContextManager[None]:
        """A joined worker's filter narrowed by ``test`` (``pop_many(siblings=True)``)."""
        return self._workers.get(name).narrowed(test)

    def lane_jobs(self, member: str, level: int) -> tuple[Job, ...]:
        """Return the queued jobs of the lane ``(member, level)``, the head first.

        Empty for a lane that is not backlogged.
        """
        return self._lanes.lane_jobs(member, level)

    def lane_start(self, member: str, level: int) -> float:
        """Return the virtual start ``s`` of the lane ``(member, level)``.

        It includes the up-front charges of the lane's held jobs; ``-inf`` for a lane never
        seen, and without fair share.
        """
        return self._lanes.lane_start(member, level)

    def lane_held(self, member: str, level: int) -> float:
        """Return the up-front charges ``held`` of the lane ``(member, level)``'s held jobs.

        0 for a lane never seen.
        """
        return self._lanes.lane_held(member, level)

    def not_before(self, job_id: str) -> float | None:
        """When a delayed job becomes eligible, else None.

        Raises:
            UnknownJob: The id is neither queued, delayed nor held.
        """
        release = self._lifecycle.release_at(job_id)
        if release is not None:
            return release
        if self._find(job_id) is None:
            raise UnknownJob(f"unknown job {job_id!r}")
        return None

    def next_deadline(self) -> float | None:
        """The earliest lease deadline, live worker's timeout, or lifecycle timer, or None."""
        times = self._lifecycle.timer_times()
        base = self._workers.next_deadline()
        if base is not None:
            times.append(base)
        return min(times, default=None)

    def next_hold_end(self) -> float | None:
        """When a warm hold kept for a busy worker lapses (None: none, or no warm hold).

        The earliest ``expected free + warm_hold`` after the latest ``now`` over the live
        workers that hold ``slots`` jobs and serve their resident model.
        """
        return self._workers.next_hold_end(self._latest)

    def _find(self, job_id: str) -> tuple[Job, JobState] | None:
        """A held, queued or delayed job (delayed ones read as queued), or None."""
        held = self._workers.held_by_id(job_id)
        if held is not None:
            return held.job, "running"
        for entry in self._lanes.queued():
            if entry.job.id == job_id:
                return entry.job, "queued"
        delayed = self._lifecycle.find(job_id)
        return None if delayed is None else (delayed, "queued")

    def _known(self, job_id: str) -> bool:
        """Whether ``job_id`` is held, queued or delayed."""
        return self._find(job_id) is not None

    def _found(self, job_id: str) -> tuple[Job, JobState]:
        """``_find``, or ``UnknownJob`` when the id is neither queued nor held."""
        found = self._find(job_id)
        if found is None:
            raise UnknownJob(f"unknown job {job_id!r}")
        return found

    def _held_for(self, job_id: str, worker: str | None) -> Held:
        """The held job ``job_id``, reported by ``worker`` (None: whoever holds it)."""
        self._found(job_id)
        held = self._workers.held_by_id(job_id)
        if held is None:
            raise InvalidState(f"job {job_id!r} is queued, not held by a worker")
        if worker is not None and worker != held.worker:
            raise InvalidState(f"job {job_id!r} is held by {held.worker!r}, not {worker!r}")
        return held

    # -- workers -----------------------------------------------------------------------------

    def join(self, name: str, *, now: float, **settings: Unpack[WorkerSettings]) -> WorkerInfo:
        """Add a worker, or update every field of a known one (``resident=None`` keeps it).

        Args:
            name: The worker's name.
            now: The current time.
            **settings: ``FleetDispatcher.join``'s, each with its default: ``models`` (the
                models it serves, or None for every model), ``resident`` (the model it has
                loaded, or None), ``slots`` (how many jobs it holds at once, >= 1), ``slow``
                (whether it is extra slow: its leases are longer), ``accepts`` (a predicate
                over jobs it may take, or None) and ``capabilities`` (what it declared it can
                run, or None).

        Returns:
            The worker's info.

        Raises:
            ValueError: ``now`` went backwards, or a bad argument.
            TypeError: An argument of the wrong type, or a setting ``join`` does not take.
        """
        check_options(
            settings, call="join()", named="name, now", allowed=WorkerSettings.__annotations__
        )
        models, resident = settings.get("models"), settings.get("resident")
        slots, slow = settings.get("slots", 1), settings.get("slow", False)
        accepts = settings.get("accepts")
        caps = checked_capabilities(settings.get("capabilities"))
        with self._at(now) as t:
            return self._workers.join(
                name,
                t,
                models=models,
                resident=resident,
                slots=slots,
                slow=slow,
                accepts=accepts,
                capabilities=caps,
            )

    def heartbeat(self, name: str, *, now: float, resident: str | None = UNCHANGED) -> WorkerInfo:
        """Mark a worker seen (reviving it), and set its resident model when given.

        Args:
            name: The worker's name.
            now: The current time.
            resident: The model it has loaded (None: nothing); omitted: unchanged.

        Returns:
            The worker's info.

        Raises:
            ValueError: ``now`` went backwards.
            UnknownWorker: The name was never joined, or has left.
        """
        with self._at(now) as t:
            return self._workers.heartbeat(name, t, resident)

    def leave(self, name: str, *, now: float) -> list[Job]:
        """Forget a worker; every job it holds is requeued at its lane's head.

        Args:
            name: The worker's name.
            now: The current time.

        Returns:
            The jobs requeued, in ascending ``seq``.

        Raises:
            ValueError: ``now`` went backwards.
            UnknownWorker: The name was never joined, or has left.
        """
        with self._at(now) as t:
            worker = self._workers.get(name)
            taken = list(worker.held)
            self._grants.take_back(taken, t, always_requeue=True)
            self._workers.remove(name)
            return sorted((held.job for held in taken), key=lambda job: job.seq)

    def idle_reasons(self, name: str, *, now: float) -> Mapping[str, int]:
        """Why ``pop(name)`` finds nothing: queued jobs per first cause of ineligibility.

        Args:
            name: The worker's name.
            now: The current time.

        Returns:
            Counts per cause (causes with 0 omitted); empty when a pop would grant a job.

        Raises:
            ValueError: ``now`` went backwards.
            UnknownWorker: The name was never joined, or has left.
        """
        now = self._time(now)
        return self._rules.idle_reasons(self._workers.get(name), now)

    # -- jobs --------------------------------------------------------------------------------

    def submit(
        self, job_id: str, *, member: str, now: float, **options: Unpack[SubmitOptions]
    ) -> Ticket:
        """Queue a job at the tail of its lane, lifting the lane if it was not backlogged.

        With a ``not_before`` after ``now`` the job is delayed instead (its arrival is then
        ``not_before``); ``ttl`` gives it a deadline ``ttl`` after its arrival (the level's
        budget's ``ttl`` when not given).

        Args:
            job_id: A unique id among the queued and held jobs.
            member: Who the job belongs to.
            now: The current time.
            **options: What :meth:`FleetDispatcher.submit <prioqueue.fleet.FleetDispatcher.
                submit>` takes: ``priority`` (a number, alias or header value, resolved by the
                policy), ``tier``, ``model``, ``estimate`` (> 0 or None), ``payload``,
                ``ceiling`` (kept even below the policy's minimum), ``ttl``, ``not_before``,
                ``max_attempts`` and ``backoff``. Of ``group``, only the label is kept (for
                ``pop_many(siblings=True)``): group counts are not modelled.

        Returns:
            The ticket.

        Raises:
            TypeError: An unknown option.
            ValueError: ``now`` went backwards, the tier is unknown, or an argument is bad.
            DuplicateJob: The id is queued or held.
            QueueFull: A queue limit is reached.
        """
        check_options(options)
        with self._at(now) as t:
            job = self._lifecycle.new_job(job_id, member, t, options, self._seq, self._known)
            group = options.get("group")
            self._labels[job_id] = None if group is None else checked_group(group)
            self._seq += 1
            self._stats.submitted(job)
            if job.not_before is not None:
                self._lifecycle.delay(job, 0, job.arrival)
            else:
                self._lifecycle.queue(job, t, 0)
            return Ticket(job=job, queued=len(self))

    def pop(self, name: str, *, now: float) -> Grant | None:
        """Grant the worker its best-scoring eligible job (it is marked seen first).

        Args:
            name: The worker's name.
            now: The current time.

        Returns:
            The grant, or None when the worker's slots are full or no job is eligible.

        Raises:
            ValueError: ``now`` went backwards, or the charge model's expected charge is bad.
            UnknownWorker: The name was never joined, or has left.
            LeaseError: ``lease_for`` failed (nothing changes).
        """
        with self._at(now) as t:
            worker = self._workers.get(name)
            worker.revive(t)  # heard from, whatever follows
            return self._grants.grant(worker, t)

    def complete(
        self,
        job_id: str,
        *,
        now: float,
        runtime: float | None = None,
        worker: str | None = None,
    ) -> Completed:
        """Finish a held job and correct its lane's charge.

        Args:
            job_id: The held job's id.
            now: The current time.
            runtime: Seconds it ran (default: measured since its grant).
            worker: The worker reporting it; when given it must be the holder.

        Returns:
            The job, its runtime and its final charge.

        Raises:
            ValueError: ``now`` went backwards, ``runtime`` is negative, or a bad charge.
            UnknownJob: The id is neither queued nor held.
            InvalidState: The job is queued, or ``worker`` does not hold it.
            LeaseExpired: Its lease deadline has passed (nothing changes).
        """
        with self._at(now) as t:
            held = self._held_for(job_id, worker)
            grant = held.grant
            if grant.lease is not None and t >= grant.lease.deadline:
                raise LeaseExpired(f"the lease of {job_id!r} expired at {grant.lease.deadline}")
            if runtime is not None and not finite("runtime", runtime) >= 0:
                raise ValueError(f"runtime must be >= 0, got {runtime!r}")
            ran = t - grant.granted_at if runtime is None else float(runtime)
            charge = self._grants.finish(held, ran, t)
            self._stats.completed(held.job.member)
            return Completed(job=held.job, runtime=ran, charge=charge)

    def cancel(self, job_id: str, *, now: float, worker: str | None = None) -> Job:
        """Drop a queued job, or finish a held one (charged for the time it ran).

        A cancel naming the holding worker counts as word from it (its ``last_seen``); a
        client's cancel without ``worker`` does not.

        Args:
            job_id: The job's id.
            now: The current time.
            worker: For a held job, the worker reporting it; when given it must be the holder.

        Returns:
            The cancelled job.

        Raises:
            ValueError: ``now`` went backwards.
            UnknownJob: The id is neither queued nor held.
            InvalidState: ``worker`` is given and does not hold the job.
        """
        with self._at(now) as t:
            job, state = self._found(job_id)
            if state == "running":
                self._end_run(job_id, worker, t)
            else:
                self._lifecycle.drop(job)
            self._stats.count("cancelled")
            return job

    def fail(
        self, job_id: str, *, now: float, worker: str | None = None, retry: bool = False
    ) -> Job:
        """Fail a job; with ``retry`` a held one with attempts left is delayed instead.

        A queued or delayed job is dropped, a held one finished as a failed run (its lane
        charged for the time it was held); a retried one then waits out its backoff.

        Raises:
            ValueError: ``now`` went backwards or ``retry`` is not a bool.
            UnknownJob: The id is neither queued, delayed nor held.
            InvalidState: ``worker`` is given and does not hold the job.
        """
        with self._at(now) as t:
            if not isinstance(retry, bool):
                raise ValueError(f"retry must be a bool, got {retry!r}")
            job, state = self._found(job_id)
            if state == "running":
                held = self._end_run(job_id, worker, t)
                limit = job.max_attempts or self._max_attempts
                if retry and held.grants < limit:
                    self._lifecycle.retry(job, held.grants, t)
                    self._stats.count("retried")
                    return job
            elif worker is not None:
                raise InvalidState(f"job {job_id!r} is queued, not held by {worker!r}")
            else:
                self._lifecycle.drop(job)
            self._stats.count("failed")
            return job

    def expire(self, now: float) -> list[Expired]:
        """Take back the jobs past their lease, and every job of a worker silent too long.

        Args:
            now: The current time.

        Returns:
            One record per job taken back, in ascending ``seq``: requeued at its lane's head,
            or failed after ``max_attempts`` grants.

        Raises:
            ValueError: ``now`` went backwards.
        """
        with self._at(now) as t:
            due = self._grants.due(t)
            lapsed = self._lifecycle.take_lapsed()
            requeued = self._grants.take_back([held for held, _, _ in due], t, always_requeue=False)
            self._lifecycle.advance(t)  # a job requeued past its deadline expires t
            lapsed += self._lifecycle.take_lapsed()
            records = [
                Expired(
                    held.job,
                    held.grants,
                    deadline,
                    held.job.seq in requeued,
                    worker=held.worker,
                    cause=cause,
                )
                for held, deadline, cause in due
            ]
            return sorted(records, key=lambda record: record.job.seq) + lapsed

    def stats(self, *, now: float) -> Stats:
        """Return the counters and per-level and per-member statistics at ``now``.

        ``running`` is the first held job by grant time (None when none is held),
        ``resident_model`` the resident model of the first-joined worker.

        Args:
            now: The current time.

        Returns:
            The statistics.

        Raises:
            ValueError: ``now`` went backwards.
        """
        with self._at(now) as t:
            first = self._workers.first()
            return self._stats.stats(
                t,
                [entry.job for entry in self._lanes.queued()],
                self._lifecycle.delayed(),
                self._workers.held(),
                self._workers.infos(),
                None if first is None else first.resident,
            )

    def _end_run(self, job_id: str, worker: str | None, now: float) -> Held:
        """Finish a held job's run as a cancel or a failure does (``worker``: its holder)."""
        held = self._held_for(job_id, worker)
        self._grants.end_run(held, worker is not None, now)
        return held


def add_fixed_worker(fleet: ReferenceFleet, name: str) -> None:
    """Add a worker with the defaults (one slot, every model) to ``fleet``, outside time.

    It is the one worker of a size-one dispatcher (``ReferenceDispatcher``): there from
    construction, never leaving.
    """
    fleet._workers.add_fixed(name)


def keep_affinity_unpriced(fleet: ReferenceFleet) -> None:
    """Leave ``fleet``'s affinity unpriced.

    A size-one dispatcher's load times price only its warm crossing (docs/design/fleet.md,
    "Warm crossings").
    """
    fleet._rules.keep_affinity_unpriced()


def set_resident(fleet: ReferenceFleet, name: str, model: str | None) -> None:
    """Set a worker's resident model without a heartbeat (``set_resident_model``)."""
    fleet._workers.get(name).load(model)
