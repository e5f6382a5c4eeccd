"""``GET /metrics``: the broker's own families plus the dispatcher's (``prioqueue.prometheus``).

Rendered from a private registry at each scrape, on the event loop (the engine is not
thread-safe). Broker families:

==================================  =======  ======  ==========================================
name                                type     labels  from
==================================  =======  ======  ==========================================
``prioqueue_broker_leader``         gauge            1 while this replica leads and serves
``prioqueue_broker_jobs``           gauge    state   job records by state (finished ones kept
                                                     for ``result_ttl_seconds``)
``prioqueue_broker_workers``        gauge            workers that ever popped
``prioqueue_broker_ops_total``      counter  op      submitted, done, failed, cancelled, expired
``prioqueue_broker_recovered``      gauge            the journal's sequence number at the last start
``prioqueue_broker_long_polls``     gauge    kind    requests in a long poll now (``pop``, ``job``)
``prioqueue_broker_wakeups_total``  counter          long polls woken (each by what concerns it)
==================================  =======  ======  ==========================================
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prioqueue.prometheus import PrioqueueCollector
from prioqueue.records import Stats

if TYPE_CHECKING:
    from prioqueue.broker.service import Broker

__all__ = ["render"]


class _BrokerCollector(Collector):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        engine = self.broker.engine
        yield GaugeMetricFamily(
            "prioqueue_broker_leader", "1 while this replica leads", value=int(engine is not None)
        )
        yield GaugeMetricFamily(
            "prioqueue_broker_recovered",
            "The journal's sequence number at the last start",
            value=self.broker.recovered_entries,
        )
        changes = self.broker.changes
        polls = GaugeMetricFamily(
            "prioqueue_broker_long_polls", "Requests in a long poll now", labels=["kind"]
        )
        polls.add_metric(["pop"], sum(changes.waiting.values()))
        polls.add_metric(["job"], sum(len(futures) for futures in changes.jobs.values()))
        yield polls
        yield CounterMetricFamily(
            "prioqueue_broker_wakeups", "Long polls woken so far", value=changes.woken
        )
        if engine is None:
            return
        status = engine.status()
        jobs = GaugeMetricFamily("prioqueue_broker_jobs", "Job records by state", labels=["state"])
        for state, count in status["jobs"].items():
            jobs.add_metric([state], count)
        yield jobs
        yield GaugeMetricFamily(
            "prioqueue_broker_workers", "Workers that ever popped", value=status["workers"]
        )
        ops = CounterMetricFamily("prioqueue_broker_ops", "Job outcomes so far", labels=["op"])
        for op, count in status["totals"].items():
            ops.add_metric([op], count)
        yield ops


def render(broker: Broker) -> tuple[bytes, str]:
    """The Prometheus exposition of ``broker`` and its dispatcher.

    Args:
        broker: The broker.

    Returns:
        ``(body, content type)``.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_BrokerCollector(broker))
    engine = broker.engine
    if engine is not None and math.isfinite(engine.now):  # -inf before the first operation
        stats = engine.fleet.stats(now=engine.now)
        if isinstance(stats, Stats):
            registry.register(PrioqueueCollector(lambda: stats))
    return generate_latest(registry), CONTENT_TYPE_LATEST
