"""What both dispatchers share: ``Facade``, which holds one ``Core`` and delegates (private).

Transitions go to ``queue`` and ``grant``, reads to ``observe``, ``persist`` and ``views``; the
public methods keep their signatures, docstrings and ``@journaled`` marks. The state never
leaves: reads hand out frozen copies (docs/design/state.md, "Previews and views").

The shared public methods and their docstrings are one concern, past the 500-line gauge on
purpose: they are the dispatchers' common public surface (issue 29).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from prioqueue._core import check, grant, observe, persist, views
from prioqueue._core.config import Config
from prioqueue._core.core import Core
from prioqueue._core.queue import admit, fire, submit
from prioqueue._groups import CancelRunning, checked_group
from prioqueue._journaled import journaled
from prioqueue._lanes import PARKED, RUNNING
from prioqueue._readonly import ReadOnly
from prioqueue._spec import SUBMIT_OPTIONS, JobSpec, SubmitOptions, check_options
from prioqueue._validate import count, finite
from prioqueue.lifecycle import Backoff, LevelBudget
from prioqueue.priority import PriorityPolicy
from prioqueue.records import (
    AheadJob,
    Completed,
    Expired,
    Explanation,
    Job,
    JobState,
    Refusal,
    Stats,
    Ticket,
)
from prioqueue.scoring import Scorer
from prioqueue.views import GrantRecord, GroupFinish, GroupStatus, LaneView, WorkerView

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__: list[str] = []  # private module


class Facade:
    """The public methods both dispatchers share, over the state they hold (private)."""

    scorer = ReadOnly[Scorer]("_core.config.scorer", "The scorer (read-only).")
    policy = ReadOnly[PriorityPolicy]("_core.config.policy", "The priority policy (read-only).")
    fair_share = ReadOnly[bool](
        "_core.config.fair_share", "Whether lanes are per member (True) or per job (False)."
    )

    def __init__(self, config: Config) -> None:
        self._core = Core(config)

    @staticmethod
    def _core_of(facade: Facade) -> Core:
        """The state a facade holds (``restore.restored`` fills a new one's)."""
        return facade._core

    def __len__(self) -> int:
        """Return the number of queued jobs (held ones excluded). O(1)."""
        return len(self._core)

    def __contains__(self, job_id: object) -> bool:
        """Return whether the job is queued or held by a worker. O(1)."""
        return job_id in self._core.entries

    def job(self, job_id: str) -> Job:
        """Return a queued or running job.

        Raises:
            UnknownJob: The id is not queued or running.
        """
        return self._core.entry(job_id).job

    def state(self, job_id: str) -> JobState:
        """Return ``"queued"`` or ``"running"`` (held by a worker, prefetched included).

        Raises:
            UnknownJob: The id is not queued or running.
        """
        return "running" if self._core.entry(job_id).state == RUNNING else "queued"

    def not_before(self, job_id: str) -> float | None:
        """When a delayed job becomes eligible, or None for a job that is eligible or held.

        A delayed job is one submitted with a future ``not_before``, or a retry waiting out
        its backoff (``fail(retry=True)``); ``state`` says ``"queued"`` for it.

        Raises:
            UnknownJob: The id is not queued, delayed or running.

        Complexity: O(1).
        """
        entry = self._core.entry(job_id)
        return entry.queued_at if entry.state == PARKED else None

    @journaled
    def submit(
        self, job_id: str, *, member: str, now: float, **options: Unpack[SubmitOptions]
    ) -> Ticket:
        """Queue a job.

        Args:
            job_id: A non-empty id, unique among the queued and running jobs.
            member: Who the job belongs to (fair share is per member inside a level).
            priority: The priority number, an alias (``"interactive"``) or a raw header value;
                resolved and clamped by the policy (unparseable means the policy's default).
                The result must lie within ``+-10**9``.
            tier: The member's tier name, one of the scorer's tiers.
            model: The model the job needs loaded, or None.
            estimate: Expected runtime in seconds (> 0), or None.
            payload: An opaque value kept with the job (e.g. for ``lease_for``); it must be
                JSON-serialisable for ``snapshot``.
            group: A label shared by jobs that belong together (a film's shots), for
                ``group_status`` and ``cancel_group``; it changes no score and no lane.
            ceiling: The caller's priority ceiling (an operator's cap on this identity), or
                None. Applied after the policy's range, as in ``PriorityPolicy.parse``: a
                ceiling below the policy's ``minimum`` is kept (the minimum bounds what a
                caller asks for, not what an operator imposes).
            now: The current monotonic time.
            ttl: Seconds (> 0) the job may stay queued once eligible; past it the job leaves
                as expired (``expire`` reports it with ``cause="ttl"``). None: the level's
                ``LevelBudget.ttl``, else no limit.
            not_before: A time (same clock as ``now``) before which the job is not eligible:
                it is delayed, in no lane, and enters its lane at that time as a submit then
                would. None or a time not after ``now``: eligible now.
            max_attempts: Grants the job may get (an int >= 1; None: the dispatcher's), used by
                lease expiries and by ``fail(retry=True)`` alike.
            backoff: The job's retry delays, a ``Backoff`` or its JSON form (``as_dict()``;
                a journal keeps calls as JSON); None: the dispatcher's ``backoff``.

        Returns:
            The ticket: the job as stored and the queue depth after it.

        Raises:
            DuplicateJob: A job with this id is queued or running.
            QueueFull: ``max_queued``, ``max_queued_per_member`` or the level's
                ``LevelBudget.max_queued`` is reached; the exception's ``retry_after``
                estimates when a retry may succeed from the recent service rate.
            Overloaded: The forecast wait is over the level's ``LevelBudget.max_wait`` (a
                ``QueueFull`` with ``scope="wait"``).
            ValueError: An argument is out of range (unknown tier, non-finite time, a priority
                beyond ``+-10**9``, ...).
            TypeError: ``priority`` has a type no header could have, or ``ceiling`` is not
                an int (bools are refused), or an option ``SubmitOptions`` does not name.

        Complexity: amortised O(log n + M).
        """
        if not SUBMIT_OPTIONS.issuperset(options):
            check_options(options)
        state = self._core
        fire(state, now)
        spec = JobSpec.checked(state.config.policy, state.config.scorer, job_id, member, **options)
        return submit(state, job_id, spec, now)

    def admit(self, jobs: Sequence[Mapping[str, Any]], *, now: float) -> Refusal | None:
        """Whether submitting ``jobs`` one by one at ``now`` would queue them all: a read.

        ``submit``'s own admission rule over a batch, each job counted as if the ones before
        it were queued: a caller queues a batch whole or not at all. It fires due timers first,
        as every call taking ``now`` does (where a timer fires never changes what it leaves).

        Args:
            jobs: Each ``submit``'s keywords: ``member`` and the options (no id, no ``now``).
            now: The time of the submits.

        Returns:
            None: every job would be queued; else the first refused one.

        Raises:
            ValueError, TypeError: A job ``submit`` would refuse as bad input (the message
                names its index), or a bad ``now`` (not finite, or going backwards).

        Complexity: O(b x levels) for b jobs.
        """
        return admit(self._core, jobs, now)

    @journaled
    def complete(
        self,
        job_id: str,
        *,
        now: float,
        runtime: float | None = None,
        worker: str | None = None,
        charge: float | None = None,
    ) -> Completed:
        """Mark a held job done and free its worker's slot.

        Args:
            job_id: A job a worker holds.
            now: The current monotonic time.
            runtime: Seconds it ran (>= 0); None measures ``now - granted_at``.
            worker: The worker reporting, when known: a worker that no longer holds the job
                (it lost it to ``expire``, and it may have been granted again) is refused.
            charge: Overrides the charge model for this completion (seconds >= 0).

        Returns:
            The job, its runtime and its final charge.

        Raises:
            UnknownJob: The id is not queued or held.
            InvalidState: The job is queued, or ``worker`` does not hold it.
            LeaseExpired: ``now`` is at or past the job's lease deadline; ``expire`` owns it.
            ValueError: ``now``, ``runtime`` or ``charge`` is out of range.
            ChargeError: The charge model returned no finite number >= 0 (a ``ValueError``).
                Nothing changes on any error.

        Complexity: amortised O(log n + M + slots).
        """
        return grant.complete(self._core, job_id, now, runtime, worker, charge)

    @journaled
    def cancel(
        self,
        job_id: str,
        *,
        now: float,
        worker: str | None = None,
        charge: float | None = None,
    ) -> Job:
        """Remove a queued job, or stop a held one (charged for the time it was held).

        Args:
            job_id: A queued or held job.
            now: The current monotonic time.
            worker: For a held job, the worker asking, when known (see ``complete``).
            charge: For a held job, overrides the charge model (seconds >= 0).

        Returns:
            The removed job.

        Raises:
            UnknownJob: The id is not queued or held.
            InvalidState: ``worker`` is given and does not hold the job.
            ValueError: ``now`` or ``charge`` is out of range.
            ChargeError: The charge model returned no finite number >= 0 for a held job
                (a ``ValueError``; nothing changes).

        Complexity: amortised O(log n + M + slots).
        """
        return grant.cancel(self._core, job_id, now, worker, charge)

    @journaled
    def fail(
        self,
        job_id: str,
        *,
        now: float,
        worker: str | None = None,
        charge: float | None = None,
        retry: bool = False,
    ) -> Job:
        """Remove a job whose work failed: ``cancel``, but counted as failed; or retry it.

        A worker that reports a failed run calls this instead of ``complete``: a held job is
        charged for the time it was held, as by ``cancel``; ``Stats.failed`` and the job's
        group count it as failed, not cancelled (a ``Chain`` applies its failure policy).

        With ``retry=True`` a held job whose attempts are not used up (its ``max_attempts``,
        else the dispatcher's) is not failed: it is charged the same way, then delayed by its
        backoff (``Backoff.delay(job id, attempt)``, deterministic) and queued again as its
        next attempt (``state`` says ``"queued"``, ``not_before`` until when); with no delay
        it is queued at once. ``Stats.retried`` counts it. Without attempts left, or for a
        queued job, ``retry`` changes nothing: the job fails.

        Args:
            job_id: A queued or held job.
            now: The current monotonic time.
            worker: For a held job, the worker reporting, when known (see ``complete``).
            charge: For a held job, overrides the charge model (seconds >= 0).
            retry: Requeue a held job after its backoff while attempts remain (see above).

        Returns:
            The removed (or retried) job.

        Raises:
            UnknownJob: The id is not queued or held.
            InvalidState: ``worker`` is given and does not hold the job.
            ValueError: ``now`` or ``charge`` is out of range, or ``retry`` is not a bool.
            ChargeError: The charge model returned no finite number >= 0 for a held job
                (a ``ValueError``; nothing changes).

        Complexity: amortised O(log n + M + slots).
        """
        return grant.fail(self._core, job_id, now, worker, charge, retry)

    @journaled
    def expire(self, now: float) -> list[Expired]:
        """Take back every held job past its lease, and every job of a silent worker.

        A worker silent for ``worker_timeout`` (no pop, heartbeat or completion) times out:
        all its jobs are taken back and it no longer counts; its next pop or heartbeat revives
        it. Each job taken back gets its up-front charge refunded and goes back to the head of
        its lane, or, after ``max_attempts`` grants, is reported as failed and forgotten.

        It also fires the lifecycle's timers (docs/design/lifecycle.md): delayed jobs whose
        time has come enter their lanes, and every queued or delayed job whose ttl ran out
        leaves, reported here with ``cause="ttl"`` and ``requeued=False`` (after the take-backs).

        Args:
            now: The current monotonic time.

        Returns:
            One ``Expired`` per job taken back, by submission order, then one per job whose
            ttl ran out, by deadline.

        Raises:
            ValueError: ``now`` is out of range.

        Complexity: O(workers + k log n) for k jobs taken back or expired (amortised).
        """
        return grant.expire(self._core, now)

    def next_deadline(self) -> float | None:
        """When ``expire`` next has work: a lease deadline, worker timeout or lifecycle timer.

        The lifecycle's timers are a delayed job's release and a queued job's ttl deadline
        (docs/design/lifecycle.md): a driver that sleeps until this time and then calls
        ``expire`` (and grants) wakes for them too.

        Returns None when no job holds a lease, there is no ``worker_timeout`` and no timer.

        Complexity: O(workers) amortised.
        """
        return grant.next_deadline(self._core)

    def forecast(self, *, now: float, limit: int | None = None) -> list[AheadJob]:
        """Predict the grant order of the queued jobs, with estimated starts.

        The prediction replays the rules on the current state (no new arrivals; runtimes from
        estimates or recent means; affinity at lane heads only; a fleet is treated as its
        capacity of identical workers serving every model). It is a forecast, not a promise.

        Args:
            now: The current monotonic time.
            limit: Predict at most this many jobs (None: all).

        Returns:
            The queued jobs in predicted order.

        Raises:
            ValueError: ``now`` is out of range or ``limit`` is negative.

        Complexity: O(L log L + k log L) for L backlogged lanes and k predicted jobs.
        """
        fire(self._core, now)
        return observe.forecast(self._core, self._core.tick(now), limit)

    def explain(
        self,
        job_id: str,
        *,
        now: float,
        ahead_limit: int | None = None,
        overtakes_limit: int | None = None,
    ) -> Explanation:
        """Explain why a job waits: its score's terms, the jobs ahead, what overtook it.

        Args:
            job_id: A queued or held job.
            now: The current monotonic time.
            ahead_limit: Forecast at most this many jobs ahead (None: all; 0: no forecast).
                When the job is not reached, ``ahead_complete`` is False.
            overtakes_limit: Report at most the latest this many overtakes, reading at most
                four times as many remembered grants (None: every grant since it was queued).

        Returns:
            The explanation (``str()`` of it reads like ``sprio``).

        Raises:
            UnknownJob: The id is not queued or held.
            ValueError: ``now`` or a limit is out of range.

        Complexity: O(L log L + k log L + g) for L backlogged lanes, k forecast jobs and g
        grants read; with both limits, independent of the history's and the queue's length
        beyond the lanes (O(log h + limit) for the overtakes).
        """
        fire(self._core, now)
        return observe.explain(self._core, job_id, now, ahead_limit, overtakes_limit)

    def stats(self, *, now: float) -> Stats:
        """Return a consistent picture of queues, waits, grants and reorders.

        Args:
            now: The current monotonic time.

        Returns:
            The statistics (levels highest first).

        Raises:
            ValueError: ``now`` is out of range.

        Complexity: O(levels + members + workers + held jobs).
        """
        fire(self._core, now)
        return observe.stats(self._core, self._core.tick(now))

    def snapshot(self, *, now: float) -> dict[str, Any]:
        """Return the state as JSON-serialisable data, for ``restore``.

        It holds every queued job (in lane order), each lane's virtual start (without fair
        share: the order the jobs' own lanes were made in), every held job with its worker and
        lease, the workers (without their ``accepts`` filters), and every group's counts and
        live jobs. Counters behind ``stats`` and the grant history are not
        kept: they restart at zero.

        Args:
            now: The current monotonic time (stored as ``taken_at``).

        Returns:
            A dict of plain JSON types.

        Raises:
            TypeError: A job's payload is not JSON-serialisable (the message names the job).
            ValueError: ``now`` is out of range.

        Complexity: O(n) in the jobs.
        """
        fire(self._core, now)
        return persist.dump(self._core, self._core.tick(now))

    def group_of(self, job_id: str) -> str | None:
        """Return the group of a queued or running job (None when it has none).

        Raises:
            UnknownJob: The id is not queued or running.

        Complexity: O(1).
        """
        self._core.entry(job_id)
        return self._core.groups.group_of(job_id)

    def group_status(self, group: str, *, now: float, forecast: bool = True) -> GroupStatus:
        """Return how far a group has got: counts by state, GPU time and a finish forecast.

        Every job ever submitted in the group is counted once, in the state it is in now.
        The forecast is the same dry run as ``forecast()``: exact when the estimates are and
        nothing else arrives.

        Args:
            group: The group's label.
            now: The current monotonic time.
            forecast: False skips the dry run (``forecast_finish`` is None): the counts
                alone, for a page that forecasts many groups at once (``group_finishes``).

        Returns:
            The group's status.

        Raises:
            UnknownGroup: No job was ever submitted in the group.
            ValueError: ``group`` is not a non-empty str, or ``now`` is out of range.
            TypeError: ``forecast`` is not a bool.

        Complexity: O(1) when nothing of the group is queued or running, else that of
        ``forecast()``; without the forecast, O(the group's queued and running jobs).
        """
        if not isinstance(forecast, bool):
            raise TypeError(f"forecast must be a bool, got {forecast!r}")
        state = self._core
        fire(state, now)
        if forecast:
            return observe.group_status(state, group, now)
        group = checked_group(group)
        return state.groups.status(group, now=state.tick(now), finish=None)

    def group_listing(self) -> list[tuple[str, bool]]:
        """Every known group and whether it is active (a job queued or running), a copy.

        Complexity: O(groups).
        """
        return self._core.groups.listing()

    def group_finishes(
        self, groups: Collection[str], *, now: float, limit: int
    ) -> dict[str, GroupFinish]:
        """Each group's predicted finish from one dry run shared by all (a dashboard's).

        The dry run is ``forecast()``'s, stopped after ``limit`` predicted grants: a group
        with queued jobs past it is ``beyond`` (no finish), as is one with a runtime on the
        way that is unknown (no estimate, no recent mean). Only active groups get a finish;
        for an inactive one it is None.

        Args:
            groups: Known group labels.
            now: The current monotonic time.
            limit: Most predicted grants the dry run reads (an int >= 0).

        Returns:
            ``{group: GroupFinish}`` for each group asked for.

        Raises:
            UnknownGroup: A group was never submitted in.
            ValueError: A label is not a non-empty str, ``limit`` is not an int >= 0, or
                ``now`` is out of range.

        Complexity: O(workers x slots + L log L + limit log L) for L backlogged lanes, plus
        O(jobs of the groups) for their counts.
        """
        wanted = {checked_group(group) for group in groups}
        limit = count("limit", limit)
        state = self._core
        fire(state, now)
        t = state.tick(now)
        return views.group_finishes(state, t, wanted, limit)

    def recent_grants(self, *, since: float, limit: int) -> list[GrantRecord]:
        """The remembered grants at or after ``since``, newest first (copies).

        The history is the bounded one ``explain`` reads for overtakes (``history`` grants,
        ``history_bytes``).

        Args:
            since: The earliest grant time wanted (same clock as ``now``).
            limit: Most records returned (an int >= 0).

        Raises:
            ValueError: ``since`` is not finite, or ``limit`` is not an int >= 0.

        Complexity: O(limit).
        """
        return views.recent_grants(self._core, finite("since", since), count("limit", limit))

    def member_lanes(self, *, heads: int = 3, scan: int = 64) -> list[LaneView]:
        """Every member's lane with a job queued or held: counts and oldest queued jobs.

        Highest level first, then by member. Without fair share every job is its own lane and
        none is listed (an empty list): ``forecast()`` is the queue's order then.

        Args:
            heads: Most queued jobs listed per lane (its oldest, in lane order).
            scan: Most entries of a lane looked at to find them (lazy deletion leaves some
                that are no longer queued).

        Raises:
            ValueError: ``heads`` or ``scan`` is not an int >= 0.

        Complexity: O(lanes x min(scan, heads + stale entries) + lanes log lanes); lanes
        that hold nothing and queue nothing are skipped, but still looked at.
        """
        return views.member_lanes(self._core, count("heads", heads), count("scan", scan))

    def worker_views(self) -> list[WorkerView]:
        """Every known worker (timed-out ones included) with the jobs it holds, by name.

        Complexity: O(workers x slots + workers log workers).
        """
        return views.worker_views(self._core)

    def delayed_count(self) -> int:
        """The delayed jobs: a future ``not_before``, or a retry waiting out its backoff.

        Complexity: O(levels).
        """
        return sum(self._core.lifecycle.timers.parked.values())

    def job_ids(self) -> list[str]:
        """The ids of every queued, delayed or held job, sorted (a copy). O(n log n)."""
        return sorted(self._core.entries)

    @property
    def budgets(self) -> dict[int, LevelBudget]:
        """The per-level budgets (``budgets=``), a copy: level -> ``LevelBudget``. O(levels)."""
        return dict(self._core.lifecycle.budgets)

    @property
    def backoff(self) -> Backoff:
        """The retry delays of jobs without their own (``backoff=``; frozen). O(1)."""
        return self._core.config.backoff

    @journaled
    def cancel_group(self, group: str, *, now: float, running: CancelRunning = "keep") -> list[Job]:
        """Cancel every queued job of a group (and its running ones, if asked).

        Jobs of other groups and members are untouched. The group stays known: its
        ``group_status`` counts the cancelled jobs.

        Args:
            group: The group's label.
            now: The current monotonic time.
            running: ``"keep"`` lets the group's running jobs finish (complete them as
                usual); ``"cancel"`` stops them too, charged for the time they ran.

        Returns:
            The cancelled jobs, oldest submission first.

        Raises:
            UnknownGroup: No job was ever submitted in the group.
            ValueError: ``group`` or ``running`` is invalid, or ``now`` is out of range.
            ChargeError: The charge model failed for a running job (a ``ValueError``): the
                jobs before it in the list are cancelled, the rest are not.

        Complexity: O(k (log n + M)) for the k cancelled jobs.
        """
        fire(self._core, now)
        return grant.cancel_group(self._core, group, now, running)

    @journaled
    def forget_group(self, group: str) -> None:
        """Drop a finished group's counts (groups are kept until then, like members).

        Raises:
            UnknownGroup: No job was ever submitted in the group.
            ValueError: A job of the group is still queued or running.

        Complexity: O(1).
        """
        self._core.groups.forget(checked_group(group))

    def _check(self) -> None:
        """Assert every internal invariant (for tests; O(n))."""
        check.check(self._core)
