"""Prometheus metrics for a dispatcher, read from ``stats()`` at scrape time.

Install the extra from a clone: ``pip install '.[prometheus]'`` (once released,
``prioqueue-lanes[prometheus]``). The core never imports this module; nothing here runs on
the dispatch path. Each scrape calls ``stats()`` once (O(levels + members)) and turns the
picture into metric families:

=====================================  =======  ===============  ===========================
name                                   type     labels           from
=====================================  =======  ===============  ===========================
``prioqueue_queue_depth``              gauge    level            ``LevelStats.queued``
``prioqueue_oldest_wait_seconds``      gauge    level            ``LevelStats.oldest_wait``
``prioqueue_mean_wait_seconds``        gauge    level            ``LevelStats.mean_wait``
``prioqueue_dispatched_total``         counter  level            ``LevelStats.dispatched``
``prioqueue_wait_seconds``             histo.   level            ``LevelStats.wait_buckets``
``prioqueue_reorders_total``           counter  level, cause     ``LevelStats.reorders``
``prioqueue_member_queue_depth``       gauge    member           ``MemberStats.queued``
``prioqueue_member_dispatched_total``  counter  member           ``MemberStats.dispatched``
``prioqueue_member_completed_total``   counter  member           ``MemberStats.completed``
``prioqueue_member_gpu_seconds_total`` counter  member           ``MemberStats.gpu_seconds``
``prioqueue_busy``                     gauge                     1 while a job runs
``prioqueue_groups_running``           gauge                     ``Stats.groups``
``prioqueue_resident_model_info``      info     model            ``Stats.resident_model``
``prioqueue_swaps_total``              counter                   ``Stats.swaps``
``prioqueue_completed_total``          counter                   ``Stats.completed``
``prioqueue_cancelled_total``          counter                   ``Stats.cancelled``
``prioqueue_lease_expired_total``      counter                   ``Stats.expired``
``prioqueue_failed_total``             counter                   ``Stats.failed``
=====================================  =======  ===============  ===========================

``level`` is the priority number (``"100"``, ``"0"``, ``"-100"``); ``cause`` is one of
``aging``, ``affinity``, ``tier``, ``fair_share`` (:data:`prioqueue.records.REORDER_CAUSES`).
``prioqueue_wait_seconds`` is the time from arrival to grant of each dispatch. The member
GPU-seconds are what each member's lane was charged (the measured runtimes with the default
``charge="runtime"``). ``prioqueue_resident_model_info`` has no sample while nothing is
resident.

Thread safety: the dispatcher is not thread-safe, and ``stats(now=...)`` counts as a time
reading of its own. Collect on the thread that drives the dispatcher (the gateway renders
``/metrics`` on its event loop); do not scrape it from ``start_http_server``'s thread.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterator
from typing import TypeAlias

from prioqueue.clock import SYSTEM_CLOCK

try:
    from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
    from prometheus_client.exposition import CONTENT_TYPE_LATEST
    from prometheus_client.metrics_core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        InfoMetricFamily,
        Metric,
    )
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "prioqueue.prometheus needs prometheus-client: pip install '.[prometheus]' from a clone "
        "(prioqueue-lanes[prometheus] once released)"
    ) from exc

from prioqueue.asyncio import AsyncDispatcher
from prioqueue.dispatcher import SizeOneDispatcher
from prioqueue.fleet import FleetDispatcher
from prioqueue.records import REORDER_CAUSES, Stats

__all__ = [
    "CONTENT_TYPE",
    "METRIC_NAMES",
    "PrioqueueCollector",
    "StatsSource",
    "register",
    "render",
    "unregister",
]

#: The ``Content-Type`` of :func:`render`'s output (Prometheus text format).
CONTENT_TYPE: str = CONTENT_TYPE_LATEST

#: The metric family names as the text format declares them (counters without ``_total``).
METRIC_NAMES: tuple[str, ...] = (
    "prioqueue_queue_depth",
    "prioqueue_oldest_wait_seconds",
    "prioqueue_mean_wait_seconds",
    "prioqueue_dispatched",
    "prioqueue_wait_seconds",
    "prioqueue_reorders",
    "prioqueue_member_queue_depth",
    "prioqueue_member_dispatched",
    "prioqueue_member_completed",
    "prioqueue_member_gpu_seconds",
    "prioqueue_busy",
    "prioqueue_groups_running",
    "prioqueue_resident_model_info",
    "prioqueue_swaps",
    "prioqueue_completed",
    "prioqueue_cancelled",
    "prioqueue_lease_expired",
    "prioqueue_failed",
)

StatsSource: TypeAlias = Callable[[], Stats] | AsyncDispatcher | SizeOneDispatcher | FleetDispatcher
"""What a collector reads: a zero-argument callable returning ``Stats``, an
:class:`~prioqueue.asyncio.AsyncDispatcher` (its ``stats()``), or a
:class:`~prioqueue.dispatcher.SizeOneDispatcher` or :class:`~prioqueue.fleet.FleetDispatcher`
(``stats(now=clock())``)."""


def _le(bound: float) -> str:
    """Format a bucket bound the way Prometheus clients do (``+Inf`` for infinity)."""
    return "+Inf" if bound == math.inf else repr(float(bound))


def _reader(source: StatsSource, clock: Callable[[], float]) -> Callable[[], Stats]:
    if isinstance(source, AsyncDispatcher):
        return source.stats
    if isinstance(source, (SizeOneDispatcher, FleetDispatcher)):
        dispatcher = source
        return lambda: dispatcher.stats(now=clock())
    if callable(source):
        return source
    raise TypeError(
        "source must be a callable returning Stats, an AsyncDispatcher, a "
        f"SizeOneDispatcher or a FleetDispatcher, got {type(source).__name__}"
    )


class PrioqueueCollector(Collector):
    """A custom collector that turns one ``stats()`` picture into metric families per scrape.

    Args:
        source: Where the statistics come from (see :data:`StatsSource`).
        clock: The clock for a bare ``SizeOneDispatcher`` or ``FleetDispatcher`` source
                (ignored otherwise).

    Raises:
        TypeError: ``source`` is none of the accepted kinds.

    Complexity: a scrape is one ``stats()`` call and O(levels * buckets + members) work.
    """

    def __init__(
        self, source: StatsSource, *, clock: Callable[[], float] = SYSTEM_CLOCK.monotonic
    ) -> None:
        self._read = _reader(source, clock)

    def set_source(
        self, source: StatsSource, *, clock: Callable[[], float] = SYSTEM_CLOCK.monotonic
    ) -> None:
        """Read from another source from the next scrape on.

        Raises:
            TypeError: ``source`` is none of the accepted kinds.
        """
        self._read = _reader(source, clock)

    def describe(self) -> Iterator[Metric]:
        """Yield the families without samples, so registering does not read the source."""
        return self._families(None)

    def collect(self) -> Iterator[Metric]:
        """Read ``stats()`` once and yield every metric family."""
        return self._families(self._read())

    @staticmethod
    def _families(stats: Stats | None) -> Iterator[Metric]:
        yield from _level_families(stats)
        yield from _member_families(stats)
        yield from _total_families(stats)


def _level_families(stats: Stats | None) -> list[Metric]:
    """Depth, waits, grants, the wait histogram and the reorder causes, per level."""
    by_level = ["level"]
    depth = GaugeMetricFamily(
        "prioqueue_queue_depth", "Jobs waiting, per priority level.", labels=by_level
    )
    oldest = GaugeMetricFamily(
        "prioqueue_oldest_wait_seconds",
        "Seconds the oldest waiting job of the level has waited (0 when none waits).",
        labels=by_level,
    )
    mean = GaugeMetricFamily(
        "prioqueue_mean_wait_seconds",
        "Mean seconds waited so far by the waiting jobs of the level.",
        labels=by_level,
    )
    dispatched = CounterMetricFamily(
        "prioqueue_dispatched", "Grants per priority level.", labels=by_level
    )
    waits = HistogramMetricFamily(
        "prioqueue_wait_seconds",
        "Seconds from arrival to grant of each dispatch, per priority level.",
        labels=by_level,
    )
    reorders = CounterMetricFamily(
        "prioqueue_reorders",
        "Dispatches whose winner would have been another job without one score term.",
        labels=["level", "cause"],
    )
    for number, level in ({} if stats is None else stats.levels).items():
        label = [str(number)]
        depth.add_metric(label, level.queued)
        oldest.add_metric(label, level.oldest_wait)
        mean.add_metric(label, level.mean_wait)
        dispatched.add_metric(label, level.dispatched)
        waits.add_metric(
            label,
            [(_le(bound), count) for bound, count in level.wait_buckets],
            sum_value=level.total_wait,
        )
        counts = level.reorders.as_dict()
        for cause in REORDER_CAUSES:
            reorders.add_metric([str(number), cause], counts[cause])
    return [depth, oldest, mean, dispatched, waits, reorders]


def _member_families(stats: Stats | None) -> list[Metric]:
    """Per member counts, then whether the resource is busy, the groups and the resident."""
    by_member = ["member"]
    m_depth = GaugeMetricFamily(
        "prioqueue_member_queue_depth", "Jobs waiting, per member.", labels=by_member
    )
    m_dispatched = CounterMetricFamily(
        "prioqueue_member_dispatched", "Grants per member.", labels=by_member
    )
    m_completed = CounterMetricFamily(
        "prioqueue_member_completed", "Completed jobs per member.", labels=by_member
    )
    m_seconds = CounterMetricFamily(
        "prioqueue_member_gpu_seconds",
        "GPU-seconds charged to each member's lanes (runtime or estimate by charge model).",
        labels=by_member,
    )
    busy = GaugeMetricFamily("prioqueue_busy", "1 while a job holds the resource, else 0.")
    groups = GaugeMetricFamily(
        "prioqueue_groups_running", "Groups (films) with a job queued or running."
    )
    resident = InfoMetricFamily(
        "prioqueue_resident_model", "The model believed loaded (no sample when none)."
    )
    if stats is not None:
        for name, member in stats.members.items():
            m_depth.add_metric([name], member.queued)
            m_dispatched.add_metric([name], member.dispatched)
            m_completed.add_metric([name], member.completed)
            m_seconds.add_metric([name], member.gpu_seconds)
        busy.add_metric([], 0 if stats.running is None else 1)
        groups.add_metric([], stats.groups)
        if stats.resident_model is not None:
            resident.add_metric([], {"model": stats.resident_model})
    return [m_depth, m_dispatched, m_completed, m_seconds, busy, groups, resident]


def _total_families(stats: Stats | None) -> list[Metric]:
    """The dispatcher-wide counters."""
    totals = {
        "swaps": CounterMetricFamily(
            "prioqueue_swaps", "Grants whose model differed from the resident one."
        ),
        "completed": CounterMetricFamily("prioqueue_completed", "Jobs completed."),
        "cancelled": CounterMetricFamily(
            "prioqueue_cancelled", "Jobs cancelled, queued or running."
        ),
        "expired": CounterMetricFamily("prioqueue_lease_expired", "Leases that ran out."),
        "failed": CounterMetricFamily(
            "prioqueue_failed", "Jobs dropped after their last attempt, or reported failed."
        ),
    }
    if stats is not None:
        for field, family in totals.items():
            family.add_metric([], getattr(stats, field))
    return list(totals.values())


_registered: weakref.WeakKeyDictionary[CollectorRegistry, PrioqueueCollector] = (
    weakref.WeakKeyDictionary()
)


def register(
    source: StatsSource,
    *,
    registry: CollectorRegistry = REGISTRY,
    clock: Callable[[], float] = SYSTEM_CLOCK.monotonic,
) -> PrioqueueCollector:
    """Register a collector for ``source`` in ``registry``, once.

    A second call for the same registry does not register a second collector (which would
    fail on the duplicate names): it points the collector already there at the new source
    and returns it, so re-initialising an application is harmless.

    Args:
        source: Where the statistics come from (see :data:`StatsSource`).
        registry: The registry (the process-wide default one when omitted).
        clock: The clock for a bare ``SizeOneDispatcher`` or ``FleetDispatcher`` source.

    Returns:
        The registered collector.

    Raises:
        TypeError: ``source`` is none of the accepted kinds.
        ValueError: Metrics with these names were registered by something else.
    """
    existing = _registered.get(registry)
    if existing is not None:
        existing.set_source(source, clock=clock)
        return existing
    collector = PrioqueueCollector(source, clock=clock)
    registry.register(collector)
    _registered[registry] = collector
    return collector


def unregister(registry: CollectorRegistry = REGISTRY) -> None:
    """Remove the collector :func:`register` put in ``registry`` (nothing when none)."""
    collector = _registered.pop(registry, None)
    if collector is not None:
        registry.unregister(collector)


def render(registry: CollectorRegistry = REGISTRY) -> bytes:
    """Return the registry's metrics in the Prometheus text format (see :data:`CONTENT_TYPE`).

    Args:
        registry: The registry (the process-wide default one when omitted).

    Returns:
        The exposition, as served at ``/metrics``.
    """
    return generate_latest(registry)
