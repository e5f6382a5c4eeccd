"""The Prometheus collector: names, labels and values from a real dispatcher, read at scrape."""

from __future__ import annotations

import asyncio
import re

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from prioqueue.asyncio import AsyncDispatcher
from prioqueue.dispatcher import SizeOneDispatcher
from prioqueue.fleet import FleetDispatcher
from prioqueue.prometheus import (
    CONTENT_TYPE,
    METRIC_NAMES,
    PrioqueueCollector,
    register,
    render,
    unregister,
)
from prioqueue.records import REORDER_CAUSES


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def busy_dispatcher(clock: Clock) -> SizeOneDispatcher:
    """A dispatcher after some activity: two levels, three members, a swap, a reorder."""
    d = SizeOneDispatcher(lease_for=lambda job: 50.0, wait_buckets=(1.0, 10.0))
    d.submit("a", member="alice", priority=0, model="m1", now=clock())
    assert d.dispatch(clock()) is not None
    d.submit("b", member="bob", priority=100, model="m2", now=clock())
    d.submit("c", member="carol", priority=-100, now=clock())
    d.submit("c2", member="carol", priority=-100, now=clock())
    clock.t += 4.0
    d.complete("a", now=clock())  # alice: 4 GPU-seconds
    grant = d.dispatch(clock())
    assert grant is not None
    assert grant.job.id == "b"  # waited 4 s, swap m1 -> m2
    clock.t += 60.0
    d.expire(clock())  # b's lease ran out: requeued
    clock.t += 1.0
    return d


def parse(text: str) -> dict[str, list[Sample]]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(samples: list[Sample], name: str, **labels: str) -> float:
    matches = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(matches) == 1, (name, labels, samples)
    return matches[0]


def test_metrics_from_a_real_dispatcher() -> None:
    clock = Clock()
    d = busy_dispatcher(clock)
    registry = CollectorRegistry()
    registry.register(PrioqueueCollector(d, clock=clock))
    families = parse(render(registry).decode())
    stats = d.stats(now=clock())

    depth = families["prioqueue_queue_depth"]
    assert value(depth, "prioqueue_queue_depth", level="100") == 1  # b, requeued
    assert value(depth, "prioqueue_queue_depth", level="-100") == 2
    assert value(depth, "prioqueue_queue_depth", level="0") == 0
    oldest = families["prioqueue_oldest_wait_seconds"]
    assert value(oldest, "prioqueue_oldest_wait_seconds", level="-100") == pytest.approx(65.0)
    dispatched = families["prioqueue_dispatched"]
    assert value(dispatched, "prioqueue_dispatched_total", level="0") == 1
    assert value(dispatched, "prioqueue_dispatched_total", level="100") == 1

    waits = families["prioqueue_wait_seconds"]
    assert value(waits, "prioqueue_wait_seconds_bucket", level="100", le="1.0") == 0
    assert value(waits, "prioqueue_wait_seconds_bucket", level="100", le="10.0") == 1
    assert value(waits, "prioqueue_wait_seconds_bucket", level="100", le="+Inf") == 1
    assert value(waits, "prioqueue_wait_seconds_count", level="100") == 1
    assert value(waits, "prioqueue_wait_seconds_sum", level="100") == pytest.approx(4.0)
    assert value(waits, "prioqueue_wait_seconds_bucket", level="0", le="1.0") == 1

    reorders = families["prioqueue_reorders"]
    for number, level in stats.levels.items():
        counts = level.reorders.as_dict()
        for cause in REORDER_CAUSES:
            got = value(reorders, "prioqueue_reorders_total", level=str(number), cause=cause)
            assert got == counts[cause]

    gpu = families["prioqueue_member_gpu_seconds"]
    assert value(gpu, "prioqueue_member_gpu_seconds_total", member="alice") == pytest.approx(4.0)
    assert value(gpu, "prioqueue_member_gpu_seconds_total", member="bob") == 0.0
    m_depth = families["prioqueue_member_queue_depth"]
    assert value(m_depth, "prioqueue_member_queue_depth", member="carol") == 2
    completed = families["prioqueue_member_completed"]
    assert value(completed, "prioqueue_member_completed_total", member="alice") == 1

    assert value(families["prioqueue_busy"], "prioqueue_busy") == 0
    resident = families["prioqueue_resident_model_info"]
    assert value(resident, "prioqueue_resident_model_info", model="m2") == 1
    assert value(families["prioqueue_swaps"], "prioqueue_swaps_total") == stats.swaps == 2
    assert value(families["prioqueue_completed"], "prioqueue_completed_total") == 1
    assert value(families["prioqueue_cancelled"], "prioqueue_cancelled_total") == 0
    assert value(families["prioqueue_lease_expired"], "prioqueue_lease_expired_total") == 1
    assert value(families["prioqueue_failed"], "prioqueue_failed_total") == 0
    assert set(families) == set(METRIC_NAMES)


def test_naming_conventions() -> None:
    clock = Clock()
    registry = CollectorRegistry()
    registry.register(PrioqueueCollector(busy_dispatcher(clock), clock=clock))
    families = list(text_string_to_metric_families(render(registry).decode()))
    assert families
    for family in families:
        assert re.fullmatch(r"prioqueue_[a-z_]+", family.name), family.name
        assert family.documentation
        if family.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)
        if "wait" in family.name or "gpu" in family.name:
            assert family.name.endswith("_seconds"), family.name
        for sample in family.samples:
            assert "total" not in sample.name.removesuffix("_total")


def test_reads_stats_at_scrape_time_only() -> None:
    clock = Clock()
    d = SizeOneDispatcher()
    calls = 0

    def source() -> object:
        nonlocal calls
        calls += 1
        return d.stats(now=clock())

    registry = CollectorRegistry()
    registry.register(PrioqueueCollector(source))  # type: ignore[arg-type]
    assert calls == 0  # describe() does not read the source
    d.submit("a", member="m", now=clock())
    assert calls == 0
    families = parse(render(registry).decode())
    assert calls == 1
    assert value(families["prioqueue_queue_depth"], "prioqueue_queue_depth", level="0") == 1
    assert families["prioqueue_resident_model_info"] == []


def test_async_dispatcher_source() -> None:
    async def main() -> None:
        gate = AsyncDispatcher(clock=Clock())
        registry = CollectorRegistry()
        register(gate, registry=registry)
        async with gate.turn("a", member="m", model="llama"):
            families = parse(render(registry).decode())
        assert value(families["prioqueue_busy"], "prioqueue_busy") == 1
        resident = families["prioqueue_resident_model_info"]
        assert value(resident, "prioqueue_resident_model_info", model="llama") == 1

    asyncio.run(main())


def test_register_twice_reuses_the_collector_and_rebinds_it() -> None:
    clock = Clock()
    first, second = SizeOneDispatcher(), SizeOneDispatcher()
    second.submit("x", member="m", priority=100, now=clock())
    registry = CollectorRegistry()
    one = register(first, registry=registry, clock=clock)
    two = register(second, registry=registry, clock=clock)
    assert one is two
    families = parse(render(registry).decode())
    assert value(families["prioqueue_queue_depth"], "prioqueue_queue_depth", level="100") == 1
    unregister(registry)
    unregister(registry)  # nothing left: no error
    assert render(registry) == b""
    # Registering after unregistering works, and someone else's collector still clashes.
    register(first, registry=registry, clock=clock)
    unregister(registry)
    registry.register(PrioqueueCollector(first, clock=clock))
    with pytest.raises(ValueError, match="Duplicated"):
        register(first, registry=registry, clock=clock)


def test_register_a_fleet_dispatcher() -> None:
    # A FleetDispatcher is read like a SizeOneDispatcher: stats(now=clock()) at each scrape.
    clock = Clock()
    fleet = FleetDispatcher(lease_for=lambda job, worker: 50.0)
    fleet.join("gpu-a", models=["m1"], now=clock())
    fleet.submit("x", member="m", priority=100, model="m1", now=clock())
    fleet.submit("y", member="m", priority=-100, model="m1", now=clock())
    assert fleet.pop("gpu-a", now=clock()) is not None
    registry = CollectorRegistry()
    register(fleet, registry=registry, clock=clock)
    families = parse(render(registry).decode())
    assert value(families["prioqueue_queue_depth"], "prioqueue_queue_depth", level="-100") == 1
    assert value(families["prioqueue_busy"], "prioqueue_busy") == 1
    unregister(registry)


def test_bad_source() -> None:
    with pytest.raises(TypeError, match="source must be"):
        PrioqueueCollector(42)  # type: ignore[arg-type]


def test_content_type() -> None:
    assert CONTENT_TYPE.startswith("text/plain")
