"""Snapshots off the event loop (issue 21, Medium 6, the store's half).

The store encodes a snapshot in its writer thread piece by piece (so the loop runs between
pieces; the stall figure is in benchmarks/bench_broker_reads.py), and the broker's snapshot
shares its payloads instead of copying them on the loop.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prioqueue.broker import parse_config
from prioqueue.broker.engine import BrokerEngine
from prioqueue.store._base import encode_in_pieces

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
