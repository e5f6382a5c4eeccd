"""Reads that do not stall writers (issue 21, High 2), on real stores.

A read computes its answer at once and holds it until everything it could have seen is
committed; writers never wait for readers; one commit releases every caller it holds.
"""

from __future__ import annotations

import asyncio

from manual_time import turns as _turns
from prioqueue.store import Event, SQLiteStore

from .test_durable import Durable, MakeStore, Spy, serve


def test_a_waiting_reader_does_not_hold_back_writers(make_store: MakeStore) -> None:
    async def main(durable: Durable, spy: Spy) -> None:
        first = asyncio.ensure_future(durable.call("submit", job_id="a", member="ann"))
        await _turns()  # applied, its commit held at the gate
        read = asyncio.ensure_future(durable.read(lambda d: d.job_ids()))
        later = asyncio.ensure_future(durable.call("submit", job_id="b", member="bob"))
        await _turns()
        # Before issue 21 a waiting reader made every new writer wait for the commit first.
        assert durable.applied_seq == 2
        assert "b" in durable.dispatcher
        assert not read.done()  # the answer waits for the disk...
        assert not later.done()
        spy.release()
        assert await read == ["a"]  # ...and is what was true when it was read
        await first
        await later
        assert durable.committed_seq == 2

    serve(make_store, main, gate=True)


def test_one_commit_releases_every_reader_and_writer_it_holds(make_store: MakeStore) -> None:
    async def main(durable: Durable, spy: Spy) -> None:
        blocker = asyncio.ensure_future(durable.call("submit", job_id="x", member="ann"))
        await _turns()  # batch 1 in flight (held)
        calls = [
            asyncio.ensure_future(durable.call("submit", job_id=f"j{i}", member=f"m{i}"))
            for i in range(50)
        ]
        reads = [asyncio.ensure_future(durable.read(len)) for _ in range(50)]
        await _turns()
        spy.release()
        await blocker
        results = await asyncio.gather(*calls, *reads)
        assert spy.batches == [[1], list(range(2, 52))]  # one commit for all fifty
        assert results[50:] == [51] * 50

    serve(make_store, main, gate=True)


def test_read_settled_still_runs_when_nothing_is_pending(make_store: MakeStore) -> None:
    async def main(durable: Durable, _spy: Spy) -> None:
        await durable.call("submit", job_id="a", member="ann")
        assert await durable.read_settled(lambda d: d.job_ids()) == ["a"]

    serve(make_store, main)


def test_sqlite_appends_a_large_batch_in_chunks(tmp_path: object) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    store = SQLiteStore(tmp_path / "big.db")
    epoch = store.claim()
    events = [
        Event(seq=i, op="submit", args={"job_id": f"j{i}", "member": "m", "now": float(i)}, now=i)
        for i in range(1, 2502)  # more than one chunk of 999 parameters / 5 columns
    ]
    store.append(events, epoch=epoch)
    store.append([Event(seq=2502, op="expire", args={"now": 2502.0}, now=2502.0)], epoch=epoch)
    recovered = store.recover()
    assert [e.seq for e in recovered.events] == list(range(1, 2503))
    assert recovered.events[1233].args == events[1233].args
    store.close()
