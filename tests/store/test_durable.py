"""DurableDispatcher on real stores: group commit, reads after commit, crash-only, recovery."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

import pytest

from manual_time import ManualClock, run, turns
from prioqueue import DuplicateJob, SizeOneDispatcher, UnknownJob
from prioqueue._journaled import journaled
from prioqueue.records import Job
from prioqueue.store import (
    CommitFailed,
    CorruptStore,
    DurableDispatcher,
    Event,
    Fenced,
    PostgresStore,
    Snapshot,
    Store,
    StoreError,
    StoreFatal,
    WallClock,
    dispatcher_factory,
)

from .pg import POSTGRES_URL

T = TypeVar("T")
MakeStore = Callable[[], Store]


async def recovered_entries(store: Store) -> list[str]:
    """The ids of the jobs a dispatcher recovered from ``store`` holds (closed again)."""
    again = await DurableDispatcher.open(store, FACTORY)
    entries: list[str] = await again.read(lambda d: d.job_ids())
    await again.aclose()
    return entries


def lease_60(job: Job) -> float:
    return 60.0


FACTORY = dispatcher_factory(SizeOneDispatcher, lease_for=lease_60)


Durable = DurableDispatcher[Any]


def serve(
    make_store: MakeStore,
    main: Callable[[Durable, Spy], Coroutine[Any, Any, None]],
    *,
    gate: bool = False,
    **options: Any,
) -> None:
    """Run ``main`` on a durable dispatcher over a spied store (``gate``: appends held)."""

    async def scenario() -> None:
        store = make_store()
        spy = Spy(store)
        if gate:
            spy.gate = threading.Event()
        durable = await DurableDispatcher.open(store, FACTORY, **options)
        await main(durable, spy)
        await durable.aclose()
        store.close()

    run(scenario)


class Spy:
    """Wraps a real store's append: counts batches, can hold or fail them."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.batches: list[list[int]] = []
        self.snapshots: list[int] = []
        self.gate: threading.Event | None = None
        self.fail: Exception | None = None
        self._append = store.append
        store.append = self.append  # type: ignore[method-assign]

    def release(self) -> None:
        """Let the held appends through."""
        assert self.gate is not None
        self.gate.set()

    def append(
        self, events: Sequence[Event], *, epoch: int, snapshot: Snapshot | None = None
    ) -> None:
        if self.gate is not None:
            self.gate.wait(60)  # a test that forgets to release fails instead of hanging
        if self.fail is not None:
            raise self.fail
        self._append(events, epoch=epoch, snapshot=snapshot)
        self.batches.append([e.seq for e in events])
        if snapshot is not None:
            self.snapshots.append(snapshot.seq)


async def workload(durable: DurableDispatcher[SizeOneDispatcher], clock: ManualClock) -> None:
    """Submit, dispatch, complete, cancel and expire, with time moving."""
    await asyncio.gather(
        *(
            durable.call("submit", job_id=f"j{i}", member=f"m{i % 3}", priority=i % 2 * 100)
            for i in range(12)
        )
    )
    for step in range(5):
        clock.t += 7.5
        grant = await durable.call("dispatch")
        assert grant is not None
        clock.t += 3.0
        if step == 2:
            clock.t += 100.0  # past the lease: expire requeues it
            expired = await durable.call("expire")
            assert [e.job.id for e in expired] == [grant.job.id]
        else:
            await durable.call("complete", job_id=grant.job.id)
    await durable.call("cancel", job_id="j11")
    await durable.call("set_resident_model", model="m1")


def test_state_survives_a_restart(make_store: MakeStore) -> None:
    clock = ManualClock()

    async def main() -> None:
        store = make_store()
        durable = await DurableDispatcher.open(store, FACTORY, clock=clock)
        await workload(durable, clock)
        live = durable.dispatcher.snapshot(now=clock.t)
        running = durable.dispatcher.running
        await durable.aclose(snapshot=False)
        store.close()

        store = make_store()
        recovery = store.recover()
        assert recovery.snapshot is None
        assert recovery.last_seq == durable.committed_seq
        again = await DurableDispatcher.open(store, FACTORY, clock=clock)
        assert again.epoch == durable.epoch + 1
        assert again.dispatcher.snapshot(now=clock.t) == live
        assert again.dispatcher.running == running
        # The next event continues the numbering.
        await again.call("submit", job_id="new", member="ann")
        assert again.committed_seq == recovery.last_seq + 1
        await again.aclose()
        store.close()

    run(main)


def test_snapshots_are_taken_every_n_events_and_recovery_uses_them(
    make_store: MakeStore,
) -> None:
    clock = ManualClock()

    async def main() -> None:
        store = make_store()
        spy = Spy(store)
        durable = await DurableDispatcher.open(store, FACTORY, clock=clock, snapshot_every=5)
        for i in range(12):
            clock.t += 1.0
            await durable.call("submit", job_id=f"j{i}", member="ann")
        assert spy.snapshots == [5, 10]
        recovery = store.recover()
        assert recovery.snapshot is not None
        assert recovery.snapshot.seq == 10
        assert [e.seq for e in recovery.events] == [11, 12]
        live = durable.dispatcher.snapshot(now=clock.t)
        await durable.aclose()  # a final snapshot
        assert spy.snapshots == [5, 10, 12]
        assert store.recover().events == ()
        store.close()
        store = make_store()
        again = await DurableDispatcher.open(store, FACTORY, clock=clock)
        assert again.dispatcher.snapshot(now=clock.t) == live
        await again.aclose()
        store.close()

    run(main)


class SteppedLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock a test moves forward by hand (``step``)."""

    skipped = 0.0

    def time(self) -> float:
        return super().time() + self.skipped

    def step(self, seconds: float) -> None:
        self.skipped += seconds


def run_stepped(main: Callable[[SteppedLoop], Coroutine[Any, Any, T]]) -> T:
    loop = SteppedLoop()
    try:
        return loop.run_until_complete(main(loop))
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


def test_snapshots_are_taken_every_t_seconds(make_store: MakeStore) -> None:
    async def main(loop: SteppedLoop) -> None:
        store = make_store()
        spy = Spy(store)
        durable = await DurableDispatcher.open(store, FACTORY, snapshot_interval=300)
        await durable.call("submit", job_id="a", member="ann")
        assert spy.snapshots == []
        loop.step(299)
        await durable.call("submit", job_id="b", member="ann")
        assert spy.snapshots == []
        loop.step(1)  # the interval is on the event loop's clock
        await durable.call("submit", job_id="c", member="ann")
        assert spy.snapshots == [3]
        await durable.snapshot()  # forced, nothing new: a snapshot-only batch
        assert spy.snapshots == [3, 3]
        await durable.aclose()
        store.close()

    run_stepped(main)


def test_calls_in_one_loop_turn_share_one_commit(make_store: MakeStore) -> None:
    async def main(durable: Durable, spy: Spy) -> None:
        tickets = await asyncio.gather(
            *(durable.call("submit", job_id=f"j{i}", member="ann") for i in range(100))
        )
        assert [t.job.id for t in tickets] == [f"j{i}" for i in range(100)]
        assert spy.batches == [list(range(1, 101))]

    serve(make_store, main)


def test_no_result_or_read_before_the_commit(make_store: MakeStore) -> None:
    async def main(durable: Durable, spy: Spy) -> None:
        call = asyncio.ensure_future(durable.call("submit", job_id="a", member="ann"))
        await turns()  # applied, its batch in flight (held at the gate)
        assert "a" in durable.dispatcher  # applied in memory...
        assert not call.done()  # ...but not answered
        read = asyncio.ensure_future(durable.read(lambda d: d.job_ids()))
        dup = asyncio.ensure_future(durable.call("submit", job_id="a", member="ann"))
        later = asyncio.ensure_future(durable.call("submit", job_id="b", member="ann"))
        await turns()
        assert not read.done()
        assert not dup.done()  # even an error waits: it reveals uncommitted state
        assert not later.done()
        assert durable.committed_seq == 0
        spy.release()
        assert (await call).job.id == "a"
        assert await read == ["a"]  # the writer that came after the reader waited for it
        with pytest.raises(DuplicateJob):
            await dup
        assert (await later).job.id == "b"
        assert durable.committed_seq == durable.applied_seq == 2

    serve(make_store, main, gate=True)


def test_a_failed_call_is_not_journaled_and_changes_nothing(make_store: MakeStore) -> None:
    async def main(durable: Durable, spy: Spy) -> None:
        await durable.call("submit", job_id="a", member="ann")
        before = durable.dispatcher.snapshot(now=durable.now())
        with pytest.raises(DuplicateJob):
            await durable.call("submit", job_id="a", member="bob")
        with pytest.raises(UnknownJob):
            await durable.call("cancel", job_id="zzz")
        with pytest.raises(ValueError, match="unknown tier"):
            await durable.call("submit", job_id="b", member="bob", tier="gold")
        with pytest.raises(ValueError, match="must be JSON data"):
            await durable.call("submit", job_id="c", member="bob", payload={1, 2})
        with pytest.raises(ValueError, match="do not pass now"):
            await durable.call("submit", job_id="d", member="bob", now=1.0)
        with pytest.raises(ValueError, match="not a journaled operation"):
            await durable.call("snapshot")
        # Nothing to grant and nothing to expire: answered, not journaled.
        assert await durable.call("expire") == []
        assert durable.committed_seq == 1
        assert durable.dispatcher.snapshot(now=durable.now())["queued"] == before["queued"]
        assert [e.op for e in spy.store.recover().events] == ["submit"]

    serve(make_store, main)


def test_a_failed_commit_is_fatal_and_nothing_is_served_after_it(
    make_store: MakeStore,
) -> None:
    fatal: list[StoreFatal] = []

    async def main() -> None:
        store = make_store()
        spy = Spy(store)
        durable = await DurableDispatcher.open(store, FACTORY, on_fatal=fatal.append)
        await durable.call("submit", job_id="a", member="ann")
        spy.fail = StoreError("disk full")
        with pytest.raises(CommitFailed, match="must stop and recover") as info:
            await asyncio.gather(
                durable.call("submit", job_id="b", member="ann"),
                durable.call("submit", job_id="c", member="ann"),
            )
        assert isinstance(info.value.__cause__, StoreError)
        assert fatal == [info.value]
        assert durable.fatal is info.value
        with pytest.raises(CommitFailed):
            await durable.read(len)
        with pytest.raises(CommitFailed):
            await durable.call("submit", job_id="d", member="ann")
        await durable.aclose()
        store.close()
        # The store has what was acknowledged, and nothing else.
        store = make_store()
        assert await recovered_entries(store) == ["a"]
        store.close()

    run(main)


def test_a_store_taken_over_fences_the_old_writer(make_store: MakeStore) -> None:
    async def main(durable: Durable, spy: Spy) -> None:
        await durable.call("submit", job_id="a", member="ann")
        spy.store.claim()  # what a new leader does
        with pytest.raises(Fenced):
            await durable.call("submit", job_id="b", member="ann")
        assert isinstance(durable.fatal, Fenced)
        await durable.aclose()
        assert [e.args["job_id"] for e in spy.store.recover().events] == ["a"]

    serve(make_store, main)


def test_time_never_goes_backwards_across_restarts(make_store: MakeStore) -> None:
    clock = ManualClock(5_000.0)

    async def main() -> None:
        store = make_store()
        durable = await DurableDispatcher.open(store, FACTORY, clock=clock)
        await durable.call("submit", job_id="a", member="ann")
        grant = await durable.call("dispatch")
        await durable.aclose(snapshot=False)
        store.close()
        clock.t = 10.0  # the wall clock stepped back while the broker was down
        store = make_store()
        again = await DurableDispatcher.open(store, FACTORY, clock=clock)
        assert again.now() == 5_000.0
        await again.call("submit", job_id="b", member="ann")  # accepted: now is clamped
        clock.t = 5_070.0  # the lease ran on while the broker was down
        expired = await again.call("expire")
        assert [e.job.id for e in expired] == [grant.job.id]
        await again.aclose()
        store.close()

    run(main)


def test_wall_clock_clamps() -> None:
    values = iter([5.0, 3.0, 7.0, 8.0])  # raise_floor reads the clock once (the gap check)
    clock = WallClock(4.0, source=lambda: next(values))
    assert clock.floor == 4.0
    assert [clock(), clock(), clock()] == [5.0, 5.0, 7.0]
    clock.raise_floor(None)
    clock.raise_floor(100.0)
    assert clock.floor == 100.0
    with pytest.raises(ValueError, match="finite"):
        WallClock(float("inf"))
    with pytest.raises(TypeError, match="callable"):
        WallClock(source=3.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"snapshot_every": 0}, "snapshot_every"),
        ({"snapshot_interval": 0}, "snapshot_interval"),
        ({"epoch": 0}, "epoch"),
    ],
)
def test_open_validates_its_options(
    make_store: MakeStore, options: dict[str, Any], message: str
) -> None:
    async def main() -> None:
        store = make_store()
        with pytest.raises(ValueError, match=message):
            await DurableDispatcher.open(store, FACTORY, **options)
        store.close()

    run(main)


def test_a_closed_wrapper_refuses_calls(make_store: MakeStore) -> None:
    async def main(durable: Durable, spy: Spy) -> None:
        await durable.aclose()
        await durable.aclose()
        with pytest.raises(StoreFatal, match="closed"):
            await durable.call("submit", job_id="a", member="ann")
        with pytest.raises(TypeError, match="callable"):
            await durable.read(3)  # type: ignore[arg-type]

    serve(make_store, main)


def test_a_method_the_object_lacks_is_refused(make_store: MakeStore) -> None:
    async def main(durable: Durable, spy: Spy) -> None:
        with pytest.raises(ValueError, match="has no method 'join'"):
            await durable.call("join", worker="w")

    serve(make_store, main)


def test_any_error_of_the_append_is_fatal(make_store: MakeStore) -> None:
    async def main(durable: Durable, spy: Spy) -> None:
        spy.fail = KeyError("surprise")
        with pytest.raises(CommitFailed, match="surprise"):
            await durable.call("submit", job_id="a", member="ann")

    serve(make_store, main)


def test_a_store_that_does_not_recover_is_not_opened(make_store: MakeStore) -> None:
    async def main() -> None:
        store = make_store()
        epoch = store.claim()
        store.append([Event(2, "submit", {"job_id": "a", "member": "ann"}, 1.0)], epoch=epoch)
        with pytest.raises(CorruptStore, match="event 1 is missing"):
            await DurableDispatcher.open(store, FACTORY)
        store.close()

    run(main)


class Tally:
    """A tiny state object of a service: the wrapper journals any object's methods."""

    fail_snapshots = False
    """Class-wide: snapshots are taken from the writer's replica, not the live object."""

    def __init__(self, state: Mapping[str, Any] | None = None) -> None:
        self.total = 0 if state is None else int(state["total"])

    @journaled
    def add(self, amount: int, *, now: float) -> int:
        if amount <= 0:
            raise ValueError(f"amount must be > 0, got {amount}")
        self.total += amount
        return self.total

    def snapshot(self, *, now: float) -> dict[str, Any]:
        if self.fail_snapshots:
            raise TypeError("cannot snapshot now")
        return {"total": self.total}


def test_any_object_can_be_journaled_and_a_failed_snapshot_is_not_fatal(
    make_store: MakeStore,
) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        reported: list[dict[str, Any]] = []
        loop.set_exception_handler(lambda _loop, context: reported.append(context))
        store = make_store()
        spy = Spy(store)
        durable = await DurableDispatcher.open(
            store, Tally, ops=frozenset({"add"}), snapshot_every=2
        )
        assert durable.store is store
        assert durable.fatal is None
        assert await durable.call("add", amount=2) == 2
        with pytest.raises(ValueError, match="amount must be > 0"):
            await durable.call("add", amount=0)
        Tally.fail_snapshots = True
        try:
            assert await durable.call("add", amount=3) == 5
            await durable.sync()
            await asyncio.sleep(0)  # the writer's report is one callback away
        finally:
            Tally.fail_snapshots = False
        assert spy.snapshots == []  # skipped, reported, and the journal keeps everything
        assert "snapshots stopped for this process" in reported[0]["message"]
        await durable.snapshot()  # stopped for this process: nothing written, nothing fatal
        assert spy.snapshots == []
        assert await durable.call("add", amount=1) == 6
        await durable.aclose()
        store.close()
        store = make_store()
        spy = Spy(store)
        again = await DurableDispatcher.open(store, Tally, ops=frozenset({"add"}))
        assert await again.read(lambda t: t.total) == 6
        await again.aclose()  # the next start snapshots again
        assert spy.snapshots == [3]
        store.close()

    run(main)


class Ledger:
    """A class the store has never heard of: its declarations alone say what is journaled."""

    def __init__(self, state: Mapping[str, Any] | None = None) -> None:
        self.entries: list[list[Any]] = [] if state is None else list(state["entries"])
        self.owed = 0 if state is None else int(state["owed"])

    @journaled
    def deposit(self, who: str, amount: int, *, now: float) -> int:
        self.entries.append([who, amount, now])
        self.owed += amount
        return self.owed

    @journaled(skip_when_empty=True)
    def settle(self, *, now: float) -> list[int]:
        paid = [amount for _, amount, _ in self.entries] if self.owed else []
        self.owed = 0
        return paid

    def peek(self) -> int:  # not declared: never journaled
        return self.owed

    def snapshot(self, *, now: float) -> dict[str, Any]:
        return {"entries": [list(e) for e in self.entries], "owed": self.owed}


def test_a_class_declaring_journaled_methods_is_journaled_and_replayed(
    make_store: MakeStore,
) -> None:
    clock = ManualClock(50.0)

    async def main() -> None:
        store = make_store()
        durable = await DurableDispatcher.open(store, Ledger, clock=clock, snapshot_every=100)
        assert await durable.call("deposit", who="ann", amount=3) == 3
        clock.t = 51.0
        assert await durable.call("deposit", who="bob", amount=4) == 7
        assert await durable.call("settle") == [3, 4]
        assert await durable.call("settle") == []  # skip_when_empty: answered, not journaled
        with pytest.raises(ValueError, match="'peek' is not a journaled operation of Ledger"):
            await durable.call("peek")
        with pytest.raises(ValueError, match="Ledger has no method 'withdraw'"):
            await durable.call("withdraw", amount=1)
        await durable.aclose(snapshot=False)
        store.close()

        store = make_store()
        assert [e.op for e in store.recover().events] == ["deposit", "deposit", "settle"]
        again = await DurableDispatcher.open(store, Ledger, clock=clock)
        state = await again.read(lambda ledger: ledger.snapshot(now=0.0))
        assert state == {"entries": [["ann", 3, 50.0], ["bob", 4, 51.0]], "owed": 0}
        await again.aclose(snapshot=False)
        store.append([Event(4, "peek", {}, None)], epoch=store.claim())
        with pytest.raises(CorruptStore, match="Ledger has no method 'peek' declared @journaled"):
            await DurableDispatcher.open(store, Ledger)
        store.close()

    run(main)


def test_ops_and_skip_when_empty_only_narrow_the_declaration(make_store: MakeStore) -> None:
    async def main() -> None:
        store = make_store()
        durable = await DurableDispatcher.open(
            store, Ledger, ops={"settle", "peek"}, skip_when_empty={"settle", "peek"}
        )
        with pytest.raises(ValueError, match="'deposit' is not a journaled operation"):
            await durable.call("deposit", who="ann", amount=1)
        with pytest.raises(ValueError, match="'peek' is not a journaled operation"):
            await durable.call("peek")
        assert await durable.call("settle") == []  # still skipped: declared so
        assert durable.applied_seq == 0
        await durable.aclose()
        store.close()

    run(main)


def test_an_override_without_the_mark_is_not_journaled(make_store: MakeStore) -> None:
    class Quiet(Ledger):
        def deposit(self, who: str, amount: int, *, now: float) -> int:
            return super().deposit(who, amount, now=now)

    async def main() -> None:
        store = make_store()
        durable = await DurableDispatcher.open(store, Quiet)
        with pytest.raises(ValueError, match="not a journaled operation"):
            await durable.call("deposit", who="ann", amount=1)
        assert await durable.call("settle") == []
        await durable.aclose(snapshot=False)
        store.close()

    run(main)


def test_a_read_waits_for_the_batch_behind_the_one_in_flight(make_store: MakeStore) -> None:
    async def main(durable: Durable, spy: Spy) -> None:
        first = asyncio.ensure_future(durable.call("submit", job_id="a", member="ann"))
        await turns()  # the first batch is in flight (held at the gate)
        second = asyncio.ensure_future(durable.call("submit", job_id="b", member="ann"))
        await asyncio.sleep(0)
        read = asyncio.ensure_future(durable.read(len))
        await turns()
        assert durable.applied_seq == 2
        assert not read.done()
        spy.release()
        await first
        await second
        assert await read == 2
        assert spy.batches == [[1], [2]]

    serve(make_store, main, gate=True)


def test_arguments_reach_the_dispatcher_as_replay_will_see_them(make_store: MakeStore) -> None:
    seen: list[dict[str, Any]] = []

    class Recorder(Tally):
        @journaled
        def put(self, *, now: float, **kwargs: Any) -> None:
            seen.append(kwargs)

    async def main() -> None:
        store = make_store()
        durable = await DurableDispatcher.open(store, Recorder, ops=frozenset({"put"}))
        await durable.call("put", a=1, b=2.5, c="x", d=None, e=True)  # plain scalars
        await durable.call("put", t=(1, 2), m={"k": (3,)})  # a tuple comes back as a list
        with pytest.raises(ValueError, match="JSON data"):
            await durable.call("put", x=float("nan"))
        with pytest.raises(ValueError, match="JSON data"):
            await durable.call("put", x=[float("inf")])
        await durable.aclose(snapshot=False)
        store.close()
        assert seen == [
            {"a": 1, "b": 2.5, "c": "x", "d": None, "e": True},
            {"t": [1, 2], "m": {"k": [3]}},
        ]
        replayed = [e.args for e in make_store().recover().events]
        assert [{k: v for k, v in a.items() if k != "now"} for a in replayed] == seen

    run(main)


def test_a_lost_postgres_connection_is_fatal_and_loses_nothing_acknowledged(
    pg_schema: str,
) -> None:
    fatal: list[StoreFatal] = []

    async def main() -> None:
        store = PostgresStore(POSTGRES_URL, schema=pg_schema)
        durable = await DurableDispatcher.open(store, FACTORY, on_fatal=fatal.append)
        await durable.call("submit", job_id="acked", member="ann")
        killer = PostgresStore(POSTGRES_URL, schema=pg_schema)
        killer._execute("SELECT pg_terminate_backend(%s)", (store.backend_pid(),))
        with pytest.raises(CommitFailed, match="must stop and recover"):
            await durable.call("submit", job_id="lost", member="ann")
        assert len(fatal) == 1
        await durable.aclose()
        store.close()
        assert await recovered_entries(killer) == ["acked"]
        killer.close()

    run(main)


def test_an_on_fatal_callback_that_raises_is_reported(make_store: MakeStore) -> None:
    def explode(exc: StoreFatal) -> None:
        raise RuntimeError("callback broke")

    async def main() -> None:
        reported: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _l, c: reported.append(c))
        store = make_store()
        spy = Spy(store)
        durable = await DurableDispatcher.open(store, FACTORY, on_fatal=explode)
        spy.fail = StoreError("disk full")
        with pytest.raises(CommitFailed):
            await durable.call("submit", job_id="a", member="ann")
        assert reported[0]["message"] == "prioqueue.store: on_fatal raised"
        await durable.aclose()
        store.close()

    run(main)


def test_calls_of_one_turn_share_a_batch_even_when_the_writer_wakes_mid_turn(
    make_store: MakeStore,
) -> None:
    async def main(durable: Durable, spy: Spy) -> None:
        loop = asyncio.get_running_loop()
        tasks: dict[str, asyncio.Future[Any]] = {}

        def start(job: str) -> None:
            tasks[job] = asyncio.ensure_future(durable.call("submit", job_id=job, member="m"))

        # Next turn: B is scheduled, then A applies (waking the writer), then C is scheduled;
        # so in the turn after, B's step, the writer's and C's are ready in that order.
        loop.call_soon(start, "b")
        start("a")
        loop.call_soon(start, "c")
        await turns(1)  # the callbacks ran: every task exists
        await asyncio.gather(*tasks.values())
        seq = {t.result().job.id: t.result().job.seq for t in tasks.values()}
        batch_of = {s: i for i, batch in enumerate(spy.batches) for s in batch}
        assert batch_of[seq["b"]] == batch_of[seq["c"]], spy.batches

    serve(make_store, main)
