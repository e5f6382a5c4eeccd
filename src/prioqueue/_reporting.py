"""The diagnostic and persistence side of both dispatchers (private).

``forecast``, ``explain``, ``stats``, ``snapshot`` and ``restore`` read the state and never
change it; their bodies are in ``_observe`` and ``_persist``. ``_check`` asserts every
invariant of docs/design/dispatcher.md and docs/design/fleet.md (for tests).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from prioqueue import _lifecycle, _observe, _persist
from prioqueue._core import _Core
from prioqueue._groups import restore_groups
from prioqueue._lanes import QUEUED, RUNNING
from prioqueue.records import AheadJob, Explanation, Stats
from prioqueue.scoring import ScoreBreakdown, Scorer

__all__: list[str] = []  # private module


class _Reporting(_Core):
    """Forecasts, explanations, statistics, snapshots and the invariant check (private)."""

    # ------------------------------------------------------------------ diagnostics

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
        self._fire(now)
        return _observe.forecast(self, self._tick(now), limit)

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
        self._fire(now)
        entry = self._entry(job_id)
        for name, value in (("ahead_limit", ahead_limit), ("overtakes_limit", overtakes_limit)):
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 0
            ):
                raise ValueError(f"{name} must be an int >= 0 or None, got {value!r}")
        t = self._tick(now)
        job = entry.job
        limit = job.max_attempts or self._max_attempts
        if entry.state == _lifecycle.PARKED:
            return Explanation(
                job=job,
                state="queued",
                now=t,
                waited=max(0.0, t - job.arrival),
                score=ScoreBreakdown(job.priority, job.tier_bonus, 0.0, 0.0),
                lane_start=entry.queued_at,
                position=0,
                ahead=(),
                estimated_start=entry.queued_at,
                overtaken_by=(),
                not_before=entry.queued_at,
                deadline=job.deadline,
                attempt=entry.attempt,
                max_attempts=limit,
            )
        explanation = _observe.explain(self, entry, t, ahead_limit, overtakes_limit)
        return attrs.evolve(
            explanation, deadline=job.deadline, attempt=entry.attempt, max_attempts=limit
        )

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
        self._fire(now)
        stats = _observe.stats(self, self._tick(now))
        levels = stats.levels
        if self._level_life or self._parked:
            levels = dict(levels)
            for number, level in levels.items():
                expired, refused = self._level_life.get(number, (0, 0))
                levels[number] = attrs.evolve(
                    level,
                    ttl_expired=expired,
                    refused=refused,
                    delayed=self._parked.get(number, 0),
                )
        totals = self._totals
        return attrs.evolve(
            stats,
            levels=levels,
            groups=self._groups.active,
            ttl_expired=totals["ttl_expired"],
            refused=totals["refused"],
            retried=totals["retried"],
            delayed=sum(self._parked.values()),
        )

    def snapshot(self, *, now: float) -> dict[str, Any]:
        """Return the state as JSON-serialisable data, for ``restore``.

        It holds every queued job (in lane order), each lane's virtual start, every held job
        with its worker and lease, the workers (without their ``accepts`` filters), and every
        group's counts and live jobs. Counters behind ``stats`` and the grant history are not
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
        self._fire(now)
        state = _persist.dump(self, self._tick(now))
        state["groups"] = self._groups.dump()
        return state

    @classmethod
    def _restored(
        cls,
        state: Mapping[str, Any],
        scorer: Scorer | None,
        now: float | None,
        require_lease: bool,
        options: dict[str, Any],
    ) -> Any:
        if not isinstance(state, Mapping):
            raise ValueError(f"invalid snapshot: expected a mapping, got {type(state).__name__}")
        try:
            options.setdefault("fair_share", bool(state["fair_share"]))
            if "crossing_share" in state:
                options.setdefault("crossing_share", state["crossing_share"])
        except KeyError as exc:
            raise ValueError(f"invalid snapshot: missing {exc}") from None
        # The constructor's own errors (ConfigError, TypeError) are not the snapshot's fault.
        dispatcher = cls(scorer, **options)
        _persist.load(dispatcher, state, now, require_lease=require_lease)
        restore_groups(dispatcher._groups, state.get("groups"), dispatcher._entries)
        return dispatcher

    # ------------------------------------------------------------------ invariants

    def _check(self) -> None:
        """Assert every internal invariant (for tests; O(n))."""
        queued = [e for e in self._entries.values() if e.state == QUEUED]
        held = [e for e in self._entries.values() if e.state == RUNNING]
        assert len(held) == self._held
        assert sorted(id(e) for e in held) == sorted(
            id(e) for w in self._workers.values() for e in w.held
        )
        for worker in self._workers.values():
            assert all(e.worker is worker for e in worker.held)
        assert self._live == sum(not w.timed_out for w in self._workers.values())
        parked = [e for e in self._entries.values() if e.state == _lifecycle.PARKED]
        assert len(queued) + len(parked) == len(self)
        assert sum(self._parked.values()) == len(parked)
        assert all(v > 0 for v in self._parked.values())
        timers = {id(item[4]) for item in self._timers}
        for entry in parked:
            assert id(entry) in timers  # every delayed job has its release timer
            assert entry.job.deadline is None or entry.queued_at < math.inf
        for entry in queued:
            if entry.job.deadline is not None:
                assert id(entry) in timers  # every queued job with a ttl has its lapse timer
        if self._timers:
            assert self._next_timer <= min(item[0] for item in self._timers)
        backlogged = 0
        running: dict[str, int] = {}
        for entry in held:
            running[entry.job.member] = running.get(entry.job.member, 0) + 1
        for name, member in self._members.items():
            assert member.running == running.get(name, 0), name
        for lane in self._lanes.values():
            live = [e for e in lane.jobs if e.state == QUEUED]
            assert len(live) == lane.live, (lane.member, lane.level)
            assert all(self._entries.get(e.job.id) is e for e in live)
            assert [e.pos for e in live] == sorted(e.pos for e in live)
            for model, fifo in lane.by_model.items():
                assert [e for e in fifo if e.state == QUEUED] == [
                    e for e in live if e.job.model == model
                ]
            assert lane.holding == sum(e.lane is lane for e in held)
            backlogged += lane.live > 0
            if self._fair_share:
                assert lane.settled <= self._now
                if not lane.holding:
                    assert lane.s == lane.settled
        assert backlogged == self._backlogged
        assert all(e.state == RUNNING and e in held for e in self._crossings)
        assert sum(level.queued for level in self._levels.values()) == len(queued)
        assert sum(m.queued for m in self._members.values()) == len(queued)
        for entry in queued:
            assert entry.lane.live > 0
        self._groups._check(self._entries)
