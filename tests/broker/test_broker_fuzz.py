"""Nothing a client sends crashes the broker or corrupts its journal.

Hypothesis sends random requests (any route, method, header and JSON body, valid or not,
with real keys and bad ones) to the app in memory. Every answer must be a documented status
below 500 with a JSON error naming what was wrong, and replaying the journal of what the
broker acknowledged into a fresh engine must rebuild exactly its state.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from .broker_helpers import BOB, IMAGE, KEYS, SUBMITTER, WORKER, api, run

ADMIN = {"Authorization": "Bearer sk-root"}
FUZZ_KEYS = {**KEYS, "sk-root": {"role": "submitter", "member": "root", "admin": True}}

json_value = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip
ids = st.sampled_from(["job-1", "job-2", "job-3", "nope", "job-0", "job-99999999999999999999"])
fields = st.fixed_dictionaries(
    {},
    optional={
        "priority": st.one_of(st.integers(-(10**9), 10**9), st.text(max_size=8), json_value),
        "model": st.one_of(st.sampled_from(["sdxl", "flux"]), json_value),
        "estimate": st.one_of(st.floats(), json_value),
        "group": st.one_of(st.sampled_from(["film", "other"]), json_value),
        "image": st.one_of(
            st.just(IMAGE),
            json_value,
            st.dictionaries(
                st.sampled_from(["width", "height", "steps", "sampler", "loras"]), json_value
            ),
        ),
        "payload": json_value,
        "models": st.one_of(st.just(["sdxl"]), json_value),
        "resident": json_value,
        "slots": st.one_of(st.integers(-3, 20), json_value),
        "slow": json_value,
        "worker": st.one_of(st.sampled_from(["gpu-1", "gpu-2"]), json_value),
        "attempt": st.one_of(st.integers(-1, 3), json_value),
        "result": json_value,
    },
)
request = st.tuples(
    st.sampled_from(["GET", "POST", "DELETE", "PUT"]),
    st.one_of(
        st.just("/v1/jobs"),
        ids.map(lambda i: f"/v1/jobs/{i}"),
        st.tuples(ids, st.sampled_from(["complete", "fail"])).map(
            lambda t: f"/v1/jobs/{t[0]}/{t[1]}"
        ),
        st.tuples(
            st.sampled_from(["gpu-1", "gpu-2", "%00", "x" * 300]),
            st.sampled_from(["pop", "heartbeat"]),
        ).map(lambda t: f"/v1/workers/{t[0]}/{t[1]}"),
        st.tuples(
            st.sampled_from(["film", "other", "%00"]),
            st.sampled_from(["", "?running=cancel", "?member=bob", "?member=alice&running=x"]),
        ).map(lambda t: f"/v1/groups/{t[0]}{t[1]}"),
        st.sampled_from(["/v1/status", "/metrics", "/v1/nothing"]),
    ),
    st.sampled_from(
        [
            SUBMITTER,
            BOB,
            ADMIN,
            WORKER,
            {},
            {"Authorization": "Bearer x"},
            {"Authorization": "Bearer"},
        ]
    ),
    st.one_of(fields.map(lambda d: json.dumps(d).encode()), st.binary(max_size=40)),
    st.dictionaries(
        st.sampled_from(["Idempotency-Key", "X-LlamaSwap-Priority"]),
        st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40),
        max_size=2,
    ),
)


@settings(max_examples=30)
@given(requests=st.lists(request, min_size=1, max_size=15))
def test_random_requests_never_crash_or_corrupt(requests: list[Any]) -> None:
    async def scenario() -> None:
        async with api(keys=FUZZ_KEYS) as a:
            for method, path, auth, body, extra in requests:
                headers = {**auth, **extra, "content-type": "application/json"}
                r = await a.client.request(method, path, content=body, headers=headers)
                assert r.status_code < 500, (method, path, body, r.status_code, r.text)
                if r.status_code >= 400:
                    assert r.json()["error"], r.text
                a.clock.advance(7.0)
            assert a.replays()

    run(scenario())
