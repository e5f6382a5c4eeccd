"""Snapshots off the event loop (issue 21, Medium 6, the store's half).

The store encodes a snapshot in its writer thread piece by piece (so the loop runs between
pieces; the stall figure is in benchmarks/bench_broker_reads.py), and the broker's snapshot
shares its payloads instead of copying them on the loop. Issue 30: the text is kept in chunks
of about a MiB that the database joins (``encode_chunks``), so Python never joins or binds
the whole text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prioqueue.broker import parse_config
from prioqueue.broker.engine import BrokerEngine
from prioqueue.store import Snapshot, Store
from prioqueue.store.base import encode_chunks, encode_in_pieces

_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=30,
)


@given(_json, st.integers(min_value=0, max_value=5))
def test_pieces_give_the_same_text_as_one_dumps(value: Any, depth: int) -> None:
    assert encode_in_pieces(value, depth) == json.dumps(
        value, allow_nan=False, separators=(",", ":")
    )


def test_pieces_keep_dumps_rules() -> None:
    assert encode_in_pieces({1: [True, None]}) == '{"1":[true,null]}'  # non-str keys as dumps
    assert encode_in_pieces({"t": (1, 2)}) == '{"t":[1,2]}'
    with pytest.raises(ValueError, match="JSON compliant"):
        encode_in_pieces({"a": [float("nan")]})
    with pytest.raises(TypeError):
        encode_in_pieces({"a": [object()]})


def test_the_broker_snapshot_shares_payloads_instead_of_copying_them() -> None:
    engine = BrokerEngine(parse_config({}))
    big = {"prompt": "x" * 10_000, "steps": [1, 2, 3]}
    engine.submit(1.0, member="a", tier="free", priority=0, payload=big)
    engine.submit(2.0, member="a", tier="free", priority=0, payload=[1])
    record = engine.jobs["job-1"]
    state = engine.snapshot()
    assert state["jobs"][0]["payload"] is record.payload  # before issue 21: a deep copy
    engine.pop(3.0, worker="w")
    assert state["jobs"][0]["state"] == "queued"  # the record's fields were copied, though
    again = BrokerEngine.restore(json.loads(encode_in_pieces(state)), parse_config({}))
    assert again.jobs["job-1"].payload == big
    assert again.jobs["job-1"].state == "queued"


@given(_json, st.integers(min_value=0, max_value=5), st.integers(min_value=1, max_value=40))
def test_chunks_join_to_the_same_text(value: Any, depth: int, size: int) -> None:
    chunks = encode_chunks(value, depth, size)
    assert "".join(chunks) == json.dumps(value, allow_nan=False, separators=(",", ":"))
    assert all(chunks)


def test_a_snapshot_of_many_chunks_is_joined_in_order_by_the_database(
    make_store: Callable[[], Store],
) -> None:
    """Hundreds of chunks (the store's size made small): the stored text is theirs, in order."""
    import prioqueue.store._encode as base

    state = {"jobs": [{"id": f"job-{i}", "payload": "é" * (i % 7) + str(i)} for i in range(700)]}
    store = make_store()
    epoch = store.claim()
    size, base.CHUNK_CHARS = base.CHUNK_CHARS, 64
    try:
        assert len(encode_chunks(state)) > 300
        store.append([], epoch=epoch, snapshot=Snapshot(seq=0, taken_at=1.0, state=state))
        again = Snapshot(seq=0, taken_at=2.0, state={**state, "again": True})
        store.append([], epoch=epoch, snapshot=again)  # the parts table is reused, emptied
    finally:
        base.CHUNK_CHARS = size
    recovered = store.recover().snapshot
    assert recovered is not None
    assert recovered.state == {**state, "again": True}
    store.close()


def test_long_lists_and_dicts_are_split_at_any_depth() -> None:
    """The fleet's queued jobs are three levels down: a long list is split wherever it is."""
    import prioqueue.store._encode as encode

    value = {"fleet": {"queued": [{"id": i, "p": [i] * 3} for i in range(200)]}, "n": {"k": 1}}
    pieces: list[str] = []
    encode._pieces(value, 1, pieces)
    assert len(pieces) > 200  # before: the list was one dumps call below depth 3
    text = json.dumps(value, allow_nan=False, separators=(",", ":"))
    assert "".join(pieces) == text == encode_in_pieces(value, 0)
    assert "".join(encode_chunks(value, 0, 100)) == text
    many = {str(i): i for i in range(100)}
    assert encode_in_pieces({"a": [many]}, 0) == json.dumps({"a": [many]}, separators=(",", ":"))


def test_release_frees_a_snapshot_in_slices_and_changes_nothing_shared() -> None:
    import weakref

    from prioqueue.store._encode import release

    class Payload:
        pass

    payloads = [Payload() for _ in range(300)]
    refs = [weakref.ref(p) for p in payloads]
    shared = [1, 2, 3]
    state = {"jobs": [{"payload": p, "shared": shared} for p in payloads], "n": {"k": [1]}}
    del payloads
    box: list[Any] = [state]
    del state
    release(box)
    assert box == []
    assert all(ref() is None for ref in refs)
    assert shared == [1, 2, 3]
