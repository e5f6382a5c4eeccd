"""``Core``: one dispatcher's state, composed of its owners, and the changes that span them.

Theory of operation (the model is docs/design/dispatcher.md and docs/design/fleet.md; the
object itself is docs/design/state.md):

* ``Core`` composes the owners, each a class with private fields, its own methods and its own
  ``check``: ``lanes`` (``Lanes``: lanes, levels, members, rankings, crossing credit),
  ``workers`` (``Workers``: workers, resident models, held count, lease deadlines),
  ``lifecycle`` (``Lifecycle``: timers, delayed jobs, recent runtimes, budgets, admission)
  and ``groups`` (``GroupBook``). It holds itself the clock (``now``), the submission counter
  (``seq``), the entries (every queued, delayed or held job), the totals, the grant count
  (``dispatches``), the swap count and the grant history, and the validated configuration.
* Its methods are the changes that span owners: ``enqueue`` (an entry into the entry map, its
  lane and its lapse timer), ``drop_queued``, ``park``/``unpark``, ``lapsed``, ``refused``,
  ``hand_over`` (a grant: out of its lane, onto its worker, charged), ``release``, and the
  restore steps. The journaled operations are functions of a ``Core`` (``queue.submit``,
  ``grant.pop``, ``grant.complete``...), called by the facades.
* ``submit`` files a job in its lane, lifting the lane's virtual start ``s`` when it becomes
  backlogged. ``pop`` asks ``choose.pick`` (which reads and changes nothing) for the winner,
  then hands it to the worker and charges its lane up front (``held += expected / N``).
  ``finish`` corrects the lane with the final charge; ``take_back`` refunds it exactly and
  requeues the job at the head of its lane (or fails it after ``max_attempts``).
* Every call validates what it is given and computes what can fail before it changes
  anything: nothing is lost and nothing runs twice.
* Sans-IO: every time-dependent call takes ``now`` (monotonic seconds, never going
  backwards, within ``+-1e15``); ``fire`` runs the lifecycle's timers first.
"""

from __future__ import annotations

from collections import deque

from prioqueue._core.config import Config
from prioqueue._core.items import History
from prioqueue._core.lanes import Lanes
from prioqueue._core.lifecycle import Lifecycle
from prioqueue._core.workers import Workers
from prioqueue._groups import GroupBook
from prioqueue._lanes import _Entry
from prioqueue._rankings import _BonusCache
from prioqueue._validate import TIME_LIMIT, finite
from prioqueue._workers import _Worker
from prioqueue.errors import UnknownJob
from prioqueue.records import Expired, Job

__all__: list[str] = []  # private module


class Core:
    """The owners (lanes, workers, lifecycle, groups), the entries, the clock (private).

    Built from a validated ``Config``; the facades (``FleetDispatcher``...) delegate to it.
    """

    def __init__(self, config: Config) -> None:
        self.config = config  # the validated options (the scorer, the policy...): read, never set
        d = self.divisor = config.scorer.config.aging_divisor
        self.window = config.scorer.config.max_affinity * d
        affinity = self.affinity = _BonusCache(config.priced_affinity()).__getitem__
        # The owner of lanes, levels, members, rankings and the crossing credit.
        self.lanes = Lanes(config, affinity)
        self.entries: dict[str, _Entry] = {}
        self.workers = Workers()  # the owner of workers, residents, held jobs, deadlines
        self.seq = 0
        self.now = -TIME_LIMIT
        # The owner of the timers, delayed jobs, recent runtimes, budgets and admission.
        self.lifecycle = Lifecycle(config.budgets, config.max_queued, config.max_member)
        # Whether any admission limit or budget is set (a submit skips the rule without).
        self.limited = bool(
            config.budgets or config.max_queued is not None or config.max_member is not None
        )
        runtimes = self.lifecycle.runtimes
        self.expected_runtime = runtimes.expected  # the expected runtime of a job
        self.retry_after = runtimes.retry_after  # ``QueueFull.retry_after``
        self.history = History(config.history, config.history_bytes)
        self.dispatches = 0  # grants so far (the history's record numbers)
        totals = ("dispatched", "completed", "cancelled", "expired", "failed", "ttl_expired")
        self.totals = dict.fromkeys((*totals, "refused", "retried"), 0)
        self.swaps = 0
        self.groups = GroupBook()

    # ------------------------------------------------------------------ reads

    def __len__(self) -> int:
        """The queued jobs (delayed ones included, held ones not). O(1)."""
        return len(self.entries) - self.workers.held

    def entry(self, job_id: object) -> _Entry:
        """The entry of a queued, delayed or held job; ``UnknownJob`` otherwise. O(1)."""
        entry = self.entries.get(job_id) if isinstance(job_id, str) else None
        if entry is None:
            raise UnknownJob(f"job {job_id!r} is not queued or running")
        return entry

    def entries_in(self, state: int) -> list[_Entry]:
        """The entries in ``state`` (``QUEUED``, ``RUNNING`` or ``PARKED``). O(n)."""
        return [e for e in self.entries.values() if e.state == state]

    # ------------------------------------------------------------------ time

    def tick(self, now: object) -> float:
        """Advance the clock to ``now``; ``ValueError`` when it is bad or goes backwards."""
        if now.__class__ is float and self.now <= now <= TIME_LIMIT:  # type: ignore[operator,unused-ignore]
            self.now = now  # type: ignore[assignment,unused-ignore]
            return now  # type: ignore[return-value,unused-ignore]
        self.now = t = self.checked_now(now)
        return t

    def advance(self, at: float) -> None:
        """Move the clock to ``at`` when it is later (a timer fired at its own time)."""
        self.now = max(self.now, at)

    def next_seq(self) -> int:
        """The next submission's sequence number (counted). O(1)."""
        self.seq += 1
        return self.seq

    def checked_now(self, now: object) -> float:
        """``now`` as ``tick`` would take it, the clock left as it is (a preview's). O(1)."""
        t = finite("now", now)
        if t < self.now:
            raise ValueError(
                f"now ({t!r}) is earlier than a time already seen ({self.now!r}); "
                "pass monotonic seconds"
            )
        return t

    # ------------------------------------------------------------------ queue

    def enqueue(
        self, job: Job, *, attempt: int, now: float, requeue: bool, lift: bool = True
    ) -> _Entry:
        """File a job's entry in its lane (at the head for a requeue), lifting a new lane."""
        lanes = self.lanes
        lane = lanes.lane_of(job, lift)
        entry = _Entry(job, lane, attempt, now if requeue else job.arrival, self.dispatches)
        self.entries[job.id] = entry
        if job.deadline is not None:
            self.lifecycle.watch(entry)
        lanes.file(entry, now, requeue=requeue, lift=lift)
        return entry

    def drop_queued(self, entry: _Entry) -> None:
        """A queued entry leaves for good (cancelled, failed or lapsed)."""
        entry.close()
        del self.entries[entry.job.id]
        self.lanes.unfile(entry)
        self.lanes.drop_lane(entry.lane, entry.job.id)

    # ------------------------------------------------------------------ lifecycle

    def park(self, job: Job, attempt: int, release_at: float) -> _Entry:
        """File a delayed job: known and ``"queued"``, in no lane until ``release_at``."""
        entry = _Entry(job, None, attempt, release_at, self.dispatches)  # type: ignore[arg-type]
        entry.park()
        self.entries[job.id] = entry
        self.lanes.level(job.priority)  # a level is known from its first job on, delayed or not
        self.lifecycle.park(entry)
        return entry

    def unpark(self, entry: _Entry) -> None:
        """Take a parked entry out (released, lapsed, cancelled or failed). O(1)."""
        entry.close()
        del self.entries[entry.job.id]
        self.lifecycle.unpark(entry)

    def lapsed(self, entry: _Entry, at: float) -> None:
        """Count a job whose ttl ran out (queued or delayed) and buffer its report."""
        job = entry.job
        self.groups.move(job.id, "failed")
        self.totals["ttl_expired"] += 1
        deadline = job.deadline if job.deadline is not None else at
        self.lifecycle.lapsed(
            job.priority,
            Expired(job=job, attempt=entry.attempt, deadline=deadline, requeued=False, cause="ttl"),
        )

    def refused(self, level: int) -> None:
        """Count a submit refused by its level's budget."""
        self.totals["refused"] += 1
        self.lifecycle.refused(level)

    # ------------------------------------------------------------------ grants

    def dispatched(self) -> int:
        """Count a grant; its number (the history's record number). O(1)."""
        self.dispatches += 1
        return self.dispatches

    def hand_over(self, entry: _Entry, worker: _Worker, t: float, charged: float) -> None:
        """Move a granted entry to its worker (its model resident there); charge its lane."""
        lane = entry.lane
        self.lanes.unfile(entry)
        if self.workers.take(entry, worker, t):
            self.swaps += 1
        lane.hold(charged)
        # s only grew: the lift's minimum re-files the lane when its old item surfaces
        # (``Level.lift_floor``), and ``s_log``, for explain, follows the settled part.

    def release(self, entry: _Entry) -> None:
        """Take a held entry off its worker and its lane's ``held`` (no state check)."""
        entry.close()
        del self.entries[entry.job.id]
        self.workers.let_go(entry)
        entry.lane.unhold(entry.charged)

    # ------------------------------------------------------------------ restore

    def restore_start(self, seq: int, now: float) -> None:
        """A restored state's sequence number and clock (``persist.load``)."""
        self.seq = seq
        self.now = now

    def restore_recent(
        self, credit: float, models: dict[str, deque[float]], levels: dict[int, deque[float]]
    ) -> None:
        """A restored state's crossing credit and recent runtimes."""
        self.lanes.restore_credit(credit)
        self.lifecycle.restore_runtimes(models, levels)

    def restore_held(self, entry: _Entry, crossing: tuple[float, float] | None) -> None:
        """File a held entry rebuilt from a snapshot on its worker and its lane."""
        self.entries[entry.job.id] = entry
        self.workers.keep(entry)
        self.lanes.restore_held(entry, crossing)
