"""``POST /v1/jobs`` by the lean route (``SubmitRoute``) answers as the FastAPI route does.

Every case sends the same requests to two brokers in memory, one serving submits with the
lean route (the default) and one through FastAPI (``create_app(lean_submit=False)``), and
asserts the same status, body (byte for byte), headers and journal. A few cases also pin the
documented answer itself, so the two cannot drift together.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from prioqueue.broker import MemoryJournal, create_app, parse_config
from prioqueue.broker._submit_route import SubmitRoute

from .broker_helpers import IMAGE, KEYS, SUBMITTER, WORKER, Clock, run

JSON = {**SUBMITTER, "content-type": "application/json"}
COMPARED = (
    "content-type",
    "content-length",
    "www-authenticate",
    "retry-after",
    "x-prioqueue-leader",
    "connection",
)

Request = tuple[dict[str, str], bytes]  # headers, body (always POST /v1/jobs)


def _body(value: Any) -> bytes:
    return json.dumps(value).encode()


@contextlib.asynccontextmanager
async def _client(lean: bool, serving: bool, **config: Any) -> AsyncIterator[Any]:
    clock = Clock()
    journal = MemoryJournal(clock)
    data = {"store": "memory://", "keys": KEYS, **config}
    app = create_app(parse_config(data), journal, lean_submit=lean)
    layers: list[object] = [m.cls for m in app.user_middleware]
    assert (SubmitRoute in layers) is lean
    transport = httpx.ASGITransport(app)
    async with contextlib.AsyncExitStack() as stack:
        if serving:
            await stack.enter_async_context(app.router.lifespan_context(app))
        client = await stack.enter_async_context(
            httpx.AsyncClient(transport=transport, base_url="http://broker")
        )
        yield client, journal


async def _answers(
    lean: bool, requests: list[Request], serving: bool = True, **config: Any
) -> tuple[list[tuple[int, dict[str, str], bytes]], list[tuple[str, Any]]]:
    out = []
    async with _client(lean, serving, **config) as (client, journal):
        for headers, content in requests:
            r = await client.post("/v1/jobs", headers=headers, content=content)
            kept = {name: r.headers[name] for name in COMPARED if name in r.headers}
            out.append((r.status_code, kept, r.content))
        entries = [(entry.op, entry.args) for entry in journal.entries]
    return out, entries


def _same(requests: list[Request], serving: bool = True, **config: Any) -> list[Any]:
    lean = run(_answers(True, requests, serving, **config))
    reference = run(_answers(False, requests, serving, **config))
    assert lean == reference
    return [(status, json.loads(body) if body else None) for status, _, body in lean[0]]


CASES: dict[str, list[Request]] = {
    "plain": [(JSON, b"{}"), (JSON, _body({"payload": {"a": [1, 2]}, "model": "m"}))],
    "all fields": [
        (
            JSON,
            _body(
                {
                    "priority": "interactive",
                    "model": "sdxl",
                    "estimate": 2.5,
                    "group": "f1",
                    "image": IMAGE,
                    "payload": [1],
                    "ttl": 60.0,
                    "not_before": 1.0,
                    "max_attempts": 3,
                    "backoff": {"kind": "linear", "base": 1.0},
                }
            ),
        )
    ],
    "no key": [({"content-type": "application/json"}, b"{}")],
    "not bearer": [({"Authorization": "Basic sk-alice"}, b"{}")],
    "unknown key": [({"Authorization": "Bearer nope"}, b"{}")],
    "worker key": [({**WORKER, "content-type": "application/json"}, b"{}")],
    "two keys, first counts": [
        ([("Authorization", "Bearer nope"), ("Authorization", "Bearer sk-alice")], b"{}")  # type: ignore[list-item]
    ],
    "bad JSON": [(JSON, b'{"payload": ')],
    "bad JSON before the key": [({"content-type": "application/json"}, b"{,}")],
    "not UTF-8": [(JSON, b"\xff\xfe\xfd\x00")],
    "not UTF-8 in a string": [(JSON, b'{"payload": "\xff"}')],
    "empty body": [(JSON, b"")],
    "array": [(JSON, b"[]")],
    "null": [(JSON, b"null")],
    "string": [(JSON, b'"x"')],
    "unknown field": [(JSON, _body({"prio": 1}))],
    "strict types": [(JSON, _body({"estimate": "2", "priority": True, "max_attempts": 1.5}))],
    "NaN payload": [(JSON, b'{"payload": NaN}')],
    "deep payload": [(JSON, b'{"payload": ' + b"[" * 70 + b"]" * 70 + b"}")],
    "bad group": [(JSON, _body({"group": "a/b"}))],
    "bad image": [(JSON, _body({"image": {"width": -1}}))],
    "bad backoff": [(JSON, _body({"backoff": {"kind": "random"}}))],
    "needs": [
        (JSON, _body({"model": "sdxl", "needs": {"pixels": 1 << 20, "features": ["lora"]}})),
        (JSON, _body({"needs": {"models": ["sdxl", "flux_1"], "steps": 30, "text": "a cat"}})),
        (JSON, _body({"needs": {}})),
    ],
    "bad needs": [
        (JSON, _body({"needs": {"pixels": -1}})),
        (JSON, _body({"needs": {"features": ["lora", "hypernetwork"]}})),
        (JSON, _body({"needs": {"pixel": 4}})),
        (JSON, _body({"needs": {"steps": "30", "nsfw": 1}})),
        (JSON, _body({"needs": ["lora"]})),
        (JSON, _body({"model": "sdxl", "needs": {"models": ["flux_1"]}})),
    ],
    "header priority": [({**JSON, "X-LlamaSwap-Priority": "batch"}, b"{}")],
    "body priority wins": [({**JSON, "X-LlamaSwap-Priority": "batch"}, b'{"priority": 7}')],
    "unknown alias": [(JSON, _body({"priority": "urgent"}))],
    "typo'd alias": [(JSON, _body({"priority": "interactiv"}))],
    "alias case and spaces": [(JSON, _body({"priority": " Batch "}))],
    "number as a string": [(JSON, _body({"priority": "-7"}))],
    "100k-character priority": [(JSON, _body({"priority": "9" * 100_000}))],
    "unparseable header still means 0": [({**JSON, "X-LlamaSwap-Priority": "interactiv"}, b"{}")],
    "gzip body": [({**JSON, "content-encoding": "gzip"}, b"\x1f\x8b\x08\x00")],
    "br body without a type": [({**SUBMITTER, "content-encoding": "br"}, b"{}")],
    "identity encoding": [({**JSON, "content-encoding": "identity"}, b"{}")],
    "level out of range": [(JSON, _body({"priority": -(10**6)}))],
    "over the ceiling": [({"Authorization": "Bearer sk-bob"}, _body({"priority": 90}))],
    "long priority header": [({**JSON, "X-LlamaSwap-Priority": "9" * 65}, b"{}")],
    "bad headers and body": [
        ({**JSON, "Idempotency-Key": "", "X-LlamaSwap-Priority": "x" * 70}, b'{"ttl": -1}')
    ],
    "long idempotency key": [({**JSON, "Idempotency-Key": "k" * 201}, b"{}")],
    "idempotent replay": [
        ({**JSON, "Idempotency-Key": "shot-1"}, b'{"payload": 1}'),
        ({**JSON, "Idempotency-Key": "shot-1"}, b'{"payload": 1}'),
        ({**JSON, "Idempotency-Key": "shot-1"}, b'{"payload": 2}'),
        ({**JSON, "Idempotency-Key": "shot-2"}, b'{"payload": 2}'),
    ],
    "no Content-Type": [(SUBMITTER, b'{"payload": 1}')],
    "text/plain": [({**SUBMITTER, "content-type": "text/plain"}, b"{}")],
    "form type": [({**SUBMITTER, "content-type": "application/x-www-form-urlencoded"}, b"{}")],
    "+json type": [({**SUBMITTER, "content-type": "application/vnd.film+json"}, b"{}")],
    "text +json type": [({**SUBMITTER, "content-type": "text/film+json"}, b"{}")],
    "charset": [({**SUBMITTER, "content-type": "application/json; charset=utf-8"}, b"{}")],
    "XML": [({**SUBMITTER, "content-type": "application/xml"}, b"<job/>")],
    "multipart": [({**SUBMITTER, "content-type": "multipart/form-data; boundary=x"}, b"--x--")],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_lean_route_answers_as_the_fastapi_route(name: str) -> None:
    _same(CASES[name])


def test_the_documented_answers() -> None:
    """The answers themselves (both routes gave them, per the test above)."""
    answers = _same(
        [
            (JSON, b"{}"),
            ({**JSON, "Idempotency-Key": "k"}, b"{}"),
            ({**JSON, "Idempotency-Key": "k"}, b"{}"),
            ({"content-type": "application/json"}, b"{}"),
            ({**WORKER, "content-type": "application/json"}, b"{}"),
            (JSON, b'{"a": '),
            (JSON, b""),
            (JSON, _body({"prio": 1})),
            ({**SUBMITTER, "content-type": "application/xml"}, b"<job/>"),
            (JSON, _body({"priority": "interactiv"})),
            (JSON, _body({"priority": "x" * 100_000})),
            ({**JSON, "content-encoding": "gzip"}, b"\x1f\x8b\x08\x00"),
            ({**JSON, "X-LlamaSwap-Priority": "interactiv"}, b"{}"),
        ]
    )
    assert answers[0] == (201, {"id": "job-1"})
    assert answers[1] == (201, {"id": "job-2"})
    assert answers[2] == (200, {"id": "job-2"})  # an idempotent replay
    assert answers[3][0] == 401
    assert answers[3][1]["field"] == "Authorization"
    assert answers[4][0] == 403
    assert "needs submitter" in answers[4][1]["error"]
    assert answers[5][0] == 422
    assert answers[5][1]["field"] == "body"
    assert "not valid JSON at character" in answers[5][1]["error"]
    assert answers[6] == (422, {"error": "body: Field required", "field": "body"})
    assert answers[7][0] == 422
    assert answers[7][1]["field"] == "prio"
    assert answers[8][0] == 415
    assert answers[8][1]["field"] == "Content-Type"
    for typo in answers[9:11]:  # a stated priority: strict, the aliases listed
        assert typo[0] == 422
        assert typo[1]["field"] == "priority"
        assert "interactive (100), normal (0), batch (-100)" in typo[1]["error"]
        assert "send an integer" in typo[1]["error"]
    assert len(answers[10][1]["error"]) < 300  # the 100k characters are not echoed
    assert answers[11][0] == 415
    assert answers[11][1]["field"] == "Content-Encoding"
    assert "uncompressed" in answers[11][1]["error"]
    assert answers[12][0] == 201  # the header's rule: unparseable means the default


def test_the_body_limit_holds_for_the_lean_route() -> None:
    big = _body({"payload": "x" * 4096})
    answers = _same([(JSON, big), (JSON, b"{}")], max_body_bytes=2048)
    assert answers[0][0] == 413
    assert answers[0][1]["field"] == "body"
    assert answers[1] == (201, {"id": "job-1"})


def test_queue_limits_answer_429_with_retry_after() -> None:
    answers = _same([(JSON, b"{}"), (JSON, b"{}")], max_queued=1)
    assert answers[1][0] == 429


def test_queued_bytes_limit() -> None:
    answers = _same(
        [(JSON, _body({"payload": "x" * 600})) for _ in range(3)], max_queued_bytes=1000
    )
    assert answers[0][0] == 201
    assert answers[2][0] in (413, 429)


def test_a_broker_that_does_not_serve_answers_503() -> None:
    answers = _same([(JSON, b"{}")], serving=False)
    assert answers[0][0] == 503
    assert answers[0][1]["leader"] is None


def test_other_methods_and_paths_are_fastapis() -> None:
    async def other(lean: bool) -> list[tuple[int, bytes]]:
        async with _client(lean, True) as (client, _):
            answers = [
                await client.get("/v1/jobs", headers=SUBMITTER),
                await client.post("/v1/jobs/", headers=JSON, content=b"{}"),
                await client.post("/v1/jobs/batch", headers=JSON, content=b'{"jobs": [{}]}'),
            ]
            return [(r.status_code, r.content) for r in answers]

    lean, reference = run(other(True)), run(other(False))
    assert lean == reference
    assert lean[0][0] == 405
    assert lean[2][0] == 201


def test_a_root_path_is_stripped_as_the_router_does() -> None:
    async def mounted() -> int:
        data = {"store": "memory://", "keys": KEYS}
        app = create_app(parse_config(data), MemoryJournal(Clock()))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app, root_path="/broker")
            async with httpx.AsyncClient(transport=transport, base_url="http://b") as client:
                r = await client.post("/broker/v1/jobs", headers=JSON, content=b"{}")
                return r.status_code

    assert run(mounted()) == 201


def test_the_batch_route_keeps_the_same_priority_and_encoding_rules() -> None:
    async def batch() -> list[tuple[int, Any]]:
        async with _client(True, True) as (client, journal):
            answers = []
            for headers, body in [
                (JSON, {"jobs": [{"priority": "batch"}, {"priority": "interactiv"}]}),
                ({**JSON, "X-LlamaSwap-Priority": "interactiv"}, {"jobs": [{}]}),
                ({**JSON, "content-encoding": "gzip"}, {"jobs": [{}]}),
                (JSON, {"jobs": [{"needs": {"features": ["lora"]}}, {}]}),
                (JSON, {"jobs": [{}, {"needs": {"features": ["loras"]}}]}),
            ]:
                r = await client.post("/v1/jobs/batch", headers=headers, content=_body(body))
                answers.append((r.status_code, r.json()))
            assert [entry.op for entry in journal.entries] == ["submit_many"] * 2
            jobs = journal.entries[1].args["jobs"]
            assert jobs[0]["needs"]["features"] == ["lora"]
            assert jobs[1].get("needs") is None
            return answers

    typo, header, gzip, needs, bad_needs = run(batch())
    assert typo[0] == 422
    assert typo[1]["field"] == "jobs.1.priority"
    assert typo[1]["error"].startswith("jobs[1]: priority 'interactiv'")
    assert header[0] == 201
    assert gzip[0] == 415
    assert gzip[1]["field"] == "Content-Encoding"
    assert needs[0] == 201
    assert bad_needs[0] == 422
    assert "jobs.1.needs.features" in json.dumps(bad_needs[1])
    assert "allowed: img2img" in json.dumps(bad_needs[1])


@pytest.mark.parametrize("lean", [True, False])
def test_a_v1_job_needing_lora_never_goes_to_a_worker_without_lora(lean: bool) -> None:
    no_lora = {"capabilities": {"features": ["img2img", "controlnet"]}}
    lora = {"capabilities": {"features": ["lora"], "max_pixels": 1 << 20}}

    async def main() -> None:
        async with _client(lean, True) as (client, journal):
            needs = {"pixels": 1 << 20, "features": ["lora"]}
            r = await client.post("/v1/jobs", headers=JSON, content=_body({"needs": needs}))
            assert r.status_code == 201, r.text
            job_id = r.json()["id"]
            for _ in range(2):
                r = await client.post("/v1/workers/gpu-1/pop", json=no_lora, headers=WORKER)
                assert r.status_code == 204
                assert r.headers["X-Prioqueue-Idle"] == "lora=1"
            r = await client.post("/v1/workers/gpu-2/pop", json=lora, headers=WORKER)
            assert r.status_code == 200, r.text
            assert r.json()["id"] == job_id
            submits = [e.args for e in journal.entries if e.op == "submit"]
            assert submits[0]["needs"]["features"] == ["lora"]

    run(main())
