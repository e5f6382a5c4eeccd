"""Leader election and fencing on a real PostgreSQL (each test in its own schema)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import IO, Any, TypeVar

import pytest

from prioqueue import SizeOneDispatcher
from prioqueue.store import (
    DurableDispatcher,
    Elector,
    Fenced,
    PostgresStore,
    dispatcher_factory,
    open_store,
)

from .pg import POSTGRES_URL

T = TypeVar("T")
FACTORY = dispatcher_factory(SizeOneDispatcher)
FAST_LEASE = 2.0
HANG = 60.0
"""Every wait here is bounded by this: it means "hung", never "slow" (a busy machine, a load of
4-7 on two cores, must not fail a test). How fast a takeover is belongs to
benchmarks/bench_broker.py (its failover figure)."""
PATIENT_LEASE = 2 * HANG
"""The lease of electors whose takeover must not come from expiry: longer than any wait here,
so a takeover inside ``HANG`` cannot be the lease running out."""


def fast(schema: str, name: str, address: str | None = None) -> Elector:
    """An elector with a 2 s lease, so hang tests stay short."""
    return Elector(
        POSTGRES_URL,
        schema=schema,
        name=name,
        address=address,
        lease=FAST_LEASE,
        renew_interval=0.5,
        poll_interval=0.05,
    )


def patient(schema: str, name: str, address: str | None = None) -> Elector:
    """An elector whose lease outlasts every wait (a takeover inside ``HANG`` is not expiry)."""
    return Elector(
        POSTGRES_URL,
        schema=schema,
        name=name,
        address=address,
        lease=PATIENT_LEASE,
        renew_interval=5.0,
        poll_interval=0.05,
    )


async def leading(schema: str, name: str) -> tuple[Elector, int]:
    """A ``fast`` elector, started, once it leads; with its epoch."""
    elector = fast(schema, name)
    await elector.start()
    return elector, await elector.wait_leader()


CHILD = Path(__file__).with_name("leader_child.py")


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(main())


async def until(predicate: Callable[[], bool], timeout: float) -> float:
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"not true within {timeout} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


def test_one_leader_and_a_standby_that_knows_where_it_is(pg_schema: str) -> None:
    async def main() -> None:
        # A 4 s lease renewed every second (each renewal may take a second on a busy machine).
        a, b = (
            Elector(POSTGRES_URL, schema=pg_schema, name=name, address=address, lease=4.0,
                    renew_interval=1.0, poll_interval=0.05)
            for name, address in (("a", "http://a:1"), ("b", "http://b:2"))
        )  # fmt: skip
        await a.start()
        epoch = await a.wait_leader()
        assert a.is_leader
        assert a.epoch == epoch == 1
        await b.start()
        await until(lambda: b.leader_name == "a", HANG)  # b has looked
        await asyncio.sleep(4.5)  # more than a lease: a renews, b stays a standby
        assert a.is_leader
        assert not b.is_leader
        assert b.epoch is None
        assert b.leader_address == "http://a:1"
        assert b.leader_name == "a"
        await a.aclose()
        await b.aclose()

    run(main)


def test_a_leader_that_closes_hands_over_at_once(pg_schema: str) -> None:
    async def main() -> None:
        a, b = patient(pg_schema, "a", "http://a:1"), patient(pg_schema, "b", "http://b:2")
        await a.start()
        assert await a.wait_leader() == 1
        await b.start()
        await until(lambda: b.leader_name == "a", HANG)
        # A clean hand-over: the leader closes, the standby takes over at once (within HANG,
        # half the lease: not by expiry).
        await a.aclose()
        assert await asyncio.wait_for(b.wait_leader(), HANG) == 2
        assert b.leader_address == "http://b:2"
        await b.aclose()

    run(main)


def test_a_hung_leader_is_replaced_and_fenced(pg_schema: str) -> None:
    """The old leader stops (its elector no longer runs) while holding the lock and a store."""

    async def main() -> None:
        a, epoch_a = await leading(pg_schema, "a")
        store_a = open_store(POSTGRES_URL, schema=pg_schema)
        durable_a = await DurableDispatcher.open(store_a, FACTORY, epoch=epoch_a)
        await durable_a.call("submit", job_id="acked", member="ann")
        # "SIGSTOP": the elector's loop stops; its session (and the advisory lock) stays.
        assert a._task is not None
        a._task.cancel()
        b = fast(pg_schema, "b")
        await b.start()
        epoch_b = await asyncio.wait_for(b.wait_leader(), HANG)
        assert epoch_b == epoch_a + 1
        assert not a.is_leader  # its own clock says its lease ran out
        store_b = open_store(POSTGRES_URL, schema=pg_schema)
        durable_b = await DurableDispatcher.open(store_b, FACTORY, epoch=epoch_b)
        assert await durable_b.read(lambda d: d.job_ids()) == ["acked"]
        # "SIGCONT": the old leader's next append is refused and changes nothing.
        with pytest.raises(Fenced) as info:
            await durable_a.call("submit", job_id="lost", member="ann")
        assert (info.value.epoch, info.value.current) == (epoch_a, epoch_b)
        await durable_b.call("submit", job_id="new", member="bob")
        events = store_b.recover().events
        assert [e.args["job_id"] for e in events] == ["acked", "new"]
        assert (
            store_b._execute("SELECT count(*) FROM prioqueue_journal WHERE epoch = %s", (epoch_a,))[
                0
            ][0]
            == 1
        )
        await durable_a.aclose()
        await durable_b.aclose()
        store_a.close()
        store_b.close()
        await a.aclose()
        await b.aclose()

    run(main)


def test_a_deposed_leader_steps_down_when_it_renews(pg_schema: str) -> None:
    async def main() -> None:
        a, epoch = await leading(pg_schema, "a")
        store = PostgresStore(POSTGRES_URL, schema=pg_schema)
        assert store.claim() == epoch + 1  # someone else took the store
        await asyncio.wait_for(a.wait_step_down(), HANG)
        assert not a.is_leader
        assert a.epoch is None
        # It keeps campaigning: with nobody renewing the new term, it leads again.
        assert await asyncio.wait_for(a.wait_leader(), HANG) == epoch + 2
        a.step_down()
        assert not a.is_leader
        await a.aclose()
        store.close()

    run(main)


def test_a_leader_that_loses_its_connection_steps_down_and_campaigns_again(
    pg_schema: str,
) -> None:
    async def main() -> None:
        a = fast(pg_schema, "a")
        await a.start()
        with pytest.raises(RuntimeError, match="already started"):
            await a.start()
        epoch = await a.wait_leader()
        store = PostgresStore(POSTGRES_URL, schema=pg_schema)
        store._execute("SELECT pg_terminate_backend(%s)", (a._conn.info.backend_pid,))
        await asyncio.wait_for(a.wait_step_down(), HANG)
        # Its session died, so its lock is free: it reconnects and wins a new term.
        assert await asyncio.wait_for(a.wait_leader(), HANG) == epoch + 1
        await a.aclose()
        store.close()

    run(main)


def test_a_leader_that_steps_down_hands_over_without_waiting_for_its_lease(
    pg_schema: str,
) -> None:
    async def main() -> None:
        a, b = patient(pg_schema, "a"), patient(pg_schema, "b")
        await a.start()
        epoch = await a.wait_leader()
        await b.start()
        await until(lambda: b.leader_name == "a", HANG)  # b campaigns: it has read the row
        a.step_down()  # e.g. its append was fenced
        assert not a.is_leader
        # Within HANG, half the lease: not by expiry.
        await until(lambda: a.is_leader or b.is_leader, HANG)
        assert a.is_leader != b.is_leader
        assert (a.epoch or b.epoch) == epoch + 1
        await a.aclose()
        await b.aclose()

    run(main)


def test_elector_options_are_checked() -> None:
    with pytest.raises(ValueError, match="non-empty PostgreSQL URL"):
        Elector("")
    with pytest.raises(ValueError, match="lease must be"):
        Elector(POSTGRES_URL, lease=0)
    with pytest.raises(ValueError, match="at most half the lease"):
        Elector(POSTGRES_URL, lease=2, renew_interval=1.5)

    async def main() -> None:
        e = Elector(POSTGRES_URL)
        with pytest.raises(Exception, match="not started"):
            await e.wait_leader()

    run(main)


# ---------------------------------------------------------------------- real processes


class Child:
    """A leader_child.py process and the lines it printed."""

    def __init__(self, schema: str, name: str, lease: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), POSTGRES_URL, schema, name, str(lease)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PGAPPNAME": schema},
        )
        self.lines: list[str] = []

    @property
    def out(self) -> IO[str]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    def wait_line(self, prefix: str, timeout: float = HANG) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.out.readline()
            if not line:
                break
            self.lines.append(line.strip())
            if line.startswith(prefix):
                return line.strip()
        raise AssertionError(f"no {prefix!r} line; got {self.lines[-5:]}")

    def acked(self) -> list[str]:
        return [line.split()[1] for line in self.lines if line.startswith("ACK ")]

    def finish(self, timeout: float = HANG) -> int:
        rest, _ = self.proc.communicate(timeout=timeout)
        self.lines.extend(line.strip() for line in rest.splitlines())
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def test_a_standby_serves_after_the_leaders_sigkill_without_waiting_for_its_lease(
    pg_schema: str,
) -> None:
    # The old leader's lease outlasts every wait: the takeover comes from its session ending
    # (the lock freed), not from expiry. How fast (5 s with the defaults) is a benchmark's.
    child = Child(pg_schema, "old", PATIENT_LEASE)
    try:
        child.wait_line("LEADER")
        child.wait_line("ACK")

        async def main() -> None:
            b = patient(pg_schema, "new")
            await b.start()
            await until(lambda: b.leader_name == "old", HANG)
            os.kill(child.proc.pid, signal.SIGKILL)
            epoch = await asyncio.wait_for(b.wait_leader(), HANG)
            store = open_store(POSTGRES_URL, schema=pg_schema)
            durable = await DurableDispatcher.open(store, FACTORY, epoch=epoch)
            await durable.call("submit", job_id="after", member="new")
            child.finish()
            held = await durable.read(lambda d: set(d.job_ids()))
            assert set(child.acked()) <= held  # every acknowledged submit survived
            await durable.aclose()
            store.close()
            await b.aclose()

        run(main)
    finally:
        child.kill()


def test_a_sigstopped_leader_is_replaced_then_fenced_when_it_resumes(pg_schema: str) -> None:
    lease = 2.0
    child = Child(pg_schema, "old", lease)
    try:
        child.wait_line("LEADER")
        child.wait_line("ACK")
        child.wait_line("ACK")

        async def main() -> None:
            b = Elector(POSTGRES_URL, schema=pg_schema, name="new", lease=lease, renew_interval=0.5)
            await b.start()
            await until(lambda: b.leader_name == "old", HANG)
            os.kill(child.proc.pid, signal.SIGSTOP)
            epoch = await asyncio.wait_for(b.wait_leader(), HANG)  # by expiry
            store = open_store(POSTGRES_URL, schema=pg_schema)
            durable = await DurableDispatcher.open(store, FACTORY, epoch=epoch)
            await durable.call("submit", job_id="after", member="new")
            os.kill(child.proc.pid, signal.SIGCONT)
            code = await asyncio.to_thread(child.finish)
            # Fenced (3), or its session was ended while stopped mid-append (4): either way
            # it stopped without appending.
            assert code in (3, 4), child.lines[-5:]
            said = "FENCED" if code == 3 else "FATAL"
            assert any(line.startswith(said) for line in child.lines), child.lines[-5:]
            held = await durable.read(lambda d: set(d.job_ids()))
            assert set(child.acked()) <= held  # nothing acknowledged by the old leader lost
            # The resumed leader appended nothing after the takeover.
            # The resumed leader appended nothing after the takeover: every row of its epoch
            # comes before the new leader's first.
            old_rows = store._execute(
                "SELECT count(*), max(seq) FROM prioqueue_journal WHERE epoch < %s", (epoch,)
            )[0]
            first_new = store._execute(
                "SELECT min(seq) FROM prioqueue_journal WHERE epoch = %s", (epoch,)
            )[0][0]
            assert old_rows[0] >= len(child.acked())
            assert old_rows[1] < first_new
            await durable.aclose()
            store.close()
            await b.aclose()

        run(main)
    finally:
        if child.proc.poll() is None:
            os.kill(child.proc.pid, signal.SIGCONT)
        child.kill()
