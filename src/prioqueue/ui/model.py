"""What both services' dashboard endpoints show, read from a dispatcher.

Theory of operation
-------------------
A dashboard poll reads the dispatcher the service already holds; it never changes it (no
``now`` is passed that the dispatcher has not seen: the broker reads at its engine's time,
the gateway at its gate's). Every function here costs O(levels + lanes + workers + groups)
plus fixed bounds, never O(queued jobs):

* **Level names**: levels are numbers; :func:`level_names` gives the policy's names for
  them (its aliases: ``interactive``, ``normal``, ``batch`` by default), shown beside them.
* **Levels** come from ``stats()`` (O(levels + members + workers)). "Recent" figures (grants
  per minute, p50/p95 of the grant waits) are the change of the level's cumulative counters
  over the last :data:`WINDOW` seconds, kept by :class:`Recent` as one sample of the counters
  every :data:`SAMPLE_EVERY` seconds of polling (so at most ``WINDOW / SAMPLE_EVERY + 1``
  samples). Until a sample :data:`SAMPLE_EVERY` seconds old exists the figures are over
  everything since the service started (``window_seconds`` is None). The quantiles are those
  of the wait histogram's buckets: an upper bound, not an exact wait.
* **Lanes** (one per member and level with a job queued or held) list at most
  :data:`LANE_HEADS` of their oldest queued jobs (a scan of at most :data:`LANE_SCAN`
  entries; the running ones are in the workers' rows). "Service" is the member's share of
  the level's grants in the recent window, read from the dispatcher's bounded grant history
  (at most :data:`HISTORY_SCAN` records); its "fair share" is the equal split between the
  members active in the level (a lane backlogged now or granted in the window). Tier
  bonuses tilt the real split on purpose.
* **Workers** list what each holds (the first held job runs, the others are prefetched) and
  its recent swaps (grants whose model was not resident), from the same history scan.
* **Groups**: at most :data:`GROUP_LIMIT` (active ones first) with the core's counts; one
  dry run of at most :data:`FORECAST_LIMIT` predicted grants forecasts every listed group's
  finish (a group with queued jobs past that horizon gets no forecast: ``forecast_beyond``).

What a caller may see is the service's decision: each function takes ``visible(member)``;
another member's job is shown only as ``{"hidden": true}``, its lane and group not at all.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Callable, Mapping
from typing import Any, Final

from prioqueue._groups import split_group
from prioqueue.records import Explanation, Grant, Job, Stats
from prioqueue.views import GrantRecord

__all__ = [
    "FORECAST_EVERY",
    "FORECAST_LIMIT",
    "GROUP_LIMIT",
    "HISTORY_SCAN",
    "LANE_HEADS",
    "LANE_SCAN",
    "SAMPLE_EVERY",
    "SWAPS_PER_WORKER",
    "WINDOW",
    "ForecastCache",
    "Recent",
    "explanation",
    "groups",
    "history",
    "job",
    "lanes",
    "level_names",
    "split_group",
    "workers",
]

WINDOW: Final = 600.0
"""Seconds of recent activity behind the per-level rates and quantiles and the lane shares."""
SAMPLE_EVERY: Final = 10.0
"""Seconds between two kept samples of the levels' counters."""
LANE_HEADS: Final = 3
"""Queued jobs listed per lane (its oldest)."""
LANE_SCAN: Final = 64
"""Most entries of a lane looked at to find its queued heads (lazy deletion leaves others)."""
HISTORY_SCAN: Final = 2000
"""Most remembered grants read per poll (newest first, within :data:`WINDOW`)."""
SWAPS_PER_WORKER: Final = 8
"""Recent swaps listed per worker."""
GROUP_LIMIT: Final = 50
"""Most groups listed (active ones first)."""
FORECAST_LIMIT: Final = 500
"""Predicted grants the groups' finish forecast looks at."""
FORECAST_EVERY: Final = 10.0
"""Seconds a finish forecast is reused for before the next poll computes it again."""

Visible = Callable[[str], bool]


def level_names(aliases: Mapping[str, int]) -> dict[str, str]:
    """The policy's name of each level an alias names (the first, where several do).

    ``aliases`` maps name to level; levels come back as decimal strings (JSON keys). O(aliases).
    """
    return {str(level): name for name, level in reversed(list(aliases.items()))}


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


class ForecastCache:
    """The last groups' finish forecast, reused for :data:`FORECAST_EVERY` seconds.

    The dry run behind it is the dashboard's largest cost (O(L log L + FORECAST_LIMIT log L));
    a forecast does not need to be fresher than that. Finish times are absolute, so a reused
    forecast still counts down.
    """

    def __init__(self, every: float = FORECAST_EVERY) -> None:
        self.every = every
        self.at = -math.inf
        self.answer: dict[str, tuple[float | None, bool]] = {}

    def get(self, now: float, wanted: set[str]) -> dict[str, tuple[float | None, bool]] | None:
        """The cached answer when it is recent and covers ``wanted``, else None. O(wanted)."""
        if self.at <= now < self.at + self.every and wanted <= self.answer.keys():
            return self.answer
        return None

    def put(self, now: float, answer: dict[str, tuple[float | None, bool]]) -> None:
        """Keep ``answer``, computed at ``now``. O(1)."""
        self.at = now
        self.answer = answer


class Recent:
    """Samples of the levels' grant counters, for recent rates and wait quantiles.

    Memory: O(levels x buckets x WINDOW / SAMPLE_EVERY). Each call costs O(levels x buckets).
    """

    def __init__(self, window: float = WINDOW, every: float = SAMPLE_EVERY) -> None:
        self.window = window
        self.every = every
        self._samples: deque[tuple[float, dict[int, tuple[int, tuple[int, ...]]]]] = deque()

    def _baseline(
        self, now: float, current: dict[int, tuple[int, tuple[int, ...]]]
    ) -> tuple[float, dict[int, tuple[int, tuple[int, ...]]]] | None:
        samples = self._samples
        if samples and (
            now < samples[-1][0]
            or any(
                current.get(level, (0,))[0] < counts[0] for level, counts in samples[-1][1].items()
            )
        ):
            samples.clear()  # a restart or a restore: the counters went back
        if not samples or now - samples[-1][0] >= self.every:
            samples.append((now, current))
        while len(samples) > 1 and now - samples[1][0] >= self.window:
            samples.popleft()
        oldest = samples[0]
        return oldest if now - oldest[0] >= self.every else None

    def levels(self, stats: Stats, view_now: float) -> list[dict[str, Any]]:
        """Per level, highest first: depth, waits, recent grants and reorder causes.

        Args:
            stats: The dispatcher's ``stats()`` (taken at its own time).
            view_now: The time the caller lives in (same clock as the dispatcher's; may be
                later than ``stats.now``: waits grow by the difference).

        Returns:
            JSON-ready rows.
        """
        lag = max(0.0, view_now - stats.now)
        current = {
            number: (level.dispatched, tuple(count for _, count in level.wait_buckets))
            for number, level in stats.levels.items()
        }
        base = self._baseline(view_now, current)
        window = None if base is None else view_now - base[0]
        rows = []
        for number, level in stats.levels.items():
            dispatched, counts = current[number]
            before = (0, (0,) * len(counts)) if base is None else base[1].get(number)
            if before is None:
                before = (0, (0,) * len(counts))
            grants = dispatched - before[0]
            recent = [now - then for now, then in zip(counts, before[1])]
            bounds = [bound for bound, _ in level.wait_buckets]
            p50, open50 = _quantile(bounds, recent, 0.5)
            p95, open95 = _quantile(bounds, recent, 0.95)
            rows.append(
                {
                    "level": number,
                    "queued": level.queued,
                    "oldest_wait": _r(level.oldest_wait + lag if level.queued else 0.0),
                    "mean_wait": _r(level.mean_wait + lag if level.queued else 0.0),
                    "dispatched": level.dispatched,
                    "recent_grants": grants,
                    "grants_per_minute": (
                        None if window is None else round(grants * 60.0 / window, 3)
                    ),
                    "wait_p50": p50,
                    "wait_p95": p95,
                    "wait_open": open50 or open95,
                    "window_seconds": _r(window),
                    "reorders": dict(level.reorders.as_dict()),
                }
            )
        return rows


def _quantile(bounds: list[float], cumulative: list[int], q: float) -> tuple[float | None, bool]:
    """The upper bound of the bucket holding quantile ``q``, and whether it is the open one.

    For the open (+inf) bucket the last finite bound is returned with True ("over").
    """
    total = cumulative[-1] if cumulative else 0
    if total <= 0:
        return None, False
    for index, (bound, count) in enumerate(zip(bounds, cumulative)):
        if count >= q * total:
            if math.isinf(bound):
                return (bounds[index - 1] if index else 0.0), True
            return bound, False
    return None, False  # pragma: no cover - the last bucket holds everything


def history(d: Any, view_now: float) -> list[GrantRecord]:
    """The dispatcher's remembered grants of the recent window, newest first (bounded)."""
    return list(d.recent_grants(since=view_now - WINDOW, limit=HISTORY_SCAN))


def job(j: Job, grant: Grant | None, view_now: float, visible: Visible) -> dict[str, Any]:
    """One job as the page shows it: queued (``grant`` None) or held; another member's hidden."""
    if not visible(j.member):
        return {"hidden": True, "priority": j.priority}
    data: dict[str, Any] = {
        "id": j.id,
        "member": j.member,
        "priority": j.priority,
        "model": j.model,
        "state": "queued" if grant is None else "running",
        "waited": _r(max(0.0, view_now - j.arrival)),
    }
    if grant is not None:
        data["running_for"] = _r(max(0.0, view_now - grant.granted_at))
        lease = grant.lease
        if lease is not None:
            data["lease_seconds"] = _r(lease.seconds)
            data["lease_remaining"] = _r(max(0.0, lease.deadline - view_now))
    return data


def lanes(d: Any, view_now: float, visible: Visible, recent: list[Any]) -> list[dict[str, Any]]:
    """Each member's lane in each level with a job queued or held, highest level first."""
    grants: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for record in recent:
        grants[record.priority][record.member] += 1
    active: dict[int, set[str]] = defaultdict(set)
    shown = []
    for lane in d.member_lanes(heads=LANE_HEADS, scan=LANE_SCAN):  # by level, then member
        if lane.queued:
            active[lane.level].add(lane.member)
        if visible(lane.member):
            shown.append(lane)
    for level, granted in grants.items():
        active[level].update(granted)
    rows = []
    for lane in shown:
        heads = [  # the lane says whose and which level
            {"id": j.id, "model": j.model, "waited": _r(max(0.0, view_now - j.arrival))}
            for j in lane.heads
        ]
        level_grants = grants.get(lane.level, {})
        total = sum(level_grants.values())
        sharing = len(active[lane.level]) or 1
        rows.append(
            {
                "level": lane.level,
                "member": lane.member,
                "queued": lane.queued,
                "running": lane.running,
                "recent_grants": level_grants.get(lane.member, 0),
                "service": None
                if not total
                else round(level_grants.get(lane.member, 0) / total, 4),
                "fair_share": round(1.0 / sharing, 4),
                "jobs": heads,
            }
        )
    return rows


def workers(d: Any, view_now: float, visible: Visible, recent: list[Any]) -> list[dict[str, Any]]:
    """Each worker: resident model, running and prefetched jobs, flags and recent swaps."""
    swaps: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in recent:
        name = record.worker
        if (
            name is not None
            and record.model is not None
            and record.model != record.resident
            and len(swaps[name]) < SWAPS_PER_WORKER
        ):
            swaps[name].append(
                {"ago": _r(max(0.0, view_now - record.at)), "to": record.model,
                 "from": record.resident}
            )  # fmt: skip
    rows = []
    for view in d.worker_views():  # by name
        worker = view.info
        name = worker.name
        held = [job(j, g, view_now, visible) for j, g in zip(view.jobs, view.grants)]
        rows.append(
            {
                "name": name,
                "models": None if worker.models is None else sorted(worker.models),
                "resident": worker.resident,
                "slots": worker.slots,
                "slow": worker.slow,
                "timed_out": worker.timed_out,
                "unhealthy": False,
                "last_seen_ago": _r(max(0.0, view_now - worker.last_seen)),
                "running": held[0] if held else None,
                "prefetched": held[1:],
                "swaps": swaps.get(name, []),
            }
        )
    return rows


def groups(
    d: Any,
    t: float,
    view_now: float,
    visible: Visible,
    *,
    known: Callable[[str], bool] | None = None,
    may_cancel: Callable[[str], bool] = lambda _member: False,
    cache: ForecastCache | None = None,
) -> list[dict[str, Any]]:
    """The listed groups (films): counts, GPU-seconds and the forecast finish.

    Args:
        d: The dispatcher.
        t: The dispatcher's time (for its reads).
        view_now: The caller's time (same clock; ``t`` <= ``view_now``).
        visible: Whether the caller may see a member's groups.
        known: Whether the service still knows a group key (None: every group).
        may_cancel: Whether the caller may cancel a member's groups.
        cache: Reuse a recent forecast from here (and keep a new one), or None.

    Returns:
        JSON-ready rows, active groups first, then by label.
    """
    chosen: list[tuple[str, str, str, bool]] = []
    for key, active in d.group_listing():
        parts = split_group(key)
        if parts is None or not visible(parts[0]) or (known is not None and not known(key)):
            continue
        chosen.append((key, parts[0], parts[1], active))
    chosen.sort(key=lambda c: (not c[3], c[2], c[1]))
    chosen = chosen[:GROUP_LIMIT]
    statuses = {key: d.group_status(key, now=t, forecast=False) for key, *_ in chosen}
    wanted = {key for key, *_ in chosen if statuses[key].active}
    finish = None if cache is None else cache.get(view_now, wanted)
    if finish is None:
        finish = {
            key: (found.finish, found.beyond)
            for key, found in d.group_finishes(wanted, now=t, limit=FORECAST_LIMIT).items()
        }
        if cache is not None:
            cache.put(view_now, finish)
    rows = []
    for key, member, label, _ in chosen:
        status = statuses[key]
        end, beyond = finish.get(key, (None, False))
        rows.append(
            {
                "group": label,
                "member": member,
                "queued": status.queued,
                "running": status.running,
                "done": status.done,
                "failed": status.failed,
                "cancelled": status.cancelled,
                "gpu_seconds": _r(status.gpu_seconds),
                "mean_runtime": _r(status.mean_runtime),
                "forecast_in": None if end is None else _r(max(0.0, end - view_now)),
                "forecast_beyond": beyond,
                "can_cancel": status.active and may_cancel(member),
            }
        )
    return rows


def explanation(explained: Explanation, view_now: float, visible: Visible) -> dict[str, Any]:
    """An ``explain()`` as the job panel shows it (others' jobs without id and member)."""
    t = explained.now
    lag = max(0.0, view_now - t)

    def other(job_id: str, member: str) -> dict[str, Any]:
        return {"id": job_id, "member": member} if visible(member) else {"hidden": True}

    score = explained.score
    start = explained.estimated_start
    return {
        "state": explained.state,
        "position": explained.position,
        "ahead_complete": explained.ahead_complete,
        "waited": _r(explained.waited + (lag if explained.state == "queued" else 0.0)),
        "score": {
            "band": score.band,
            "tier_bonus": _r(score.tier_bonus),
            "swap_affinity": _r(score.swap_affinity),
            "aging": _r(score.aging),
            "effective": _r(score.effective),
        },
        "forecast_start_in": None if start is None else _r(max(0.0, start - view_now)),
        "ahead": [
            {
                **other(a.job_id, a.member),
                "priority": a.priority,
                "score": _r(a.score),
                "start_in": (
                    None
                    if a.estimated_start is None
                    else _r(max(0.0, a.estimated_start - view_now))
                ),
            }
            for a in explained.ahead
        ],
        "overtaken_by": [
            {
                **other(o.job_id, o.member),
                "priority": o.priority,
                "ago": _r(max(0.0, view_now - o.at)),
                "cause": o.cause,
                "margin": _r(o.margin),
            }
            for o in explained.overtaken_by
        ],
    }
