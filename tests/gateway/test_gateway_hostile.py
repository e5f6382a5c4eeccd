"""Hostile input and slow peers: header limits, slow clients, bad bodies, a silent upstream."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from urllib.parse import urlsplit

import httpx
import pytest

from prioqueue.gateway.app import BadRequest, extract_model
from prioqueue.gateway.fake_upstream import FakeLlamaSwap, ServerThread

from .gateway_helpers import CHAT, StackFactory, chat, run, status, wait_for


def _connect(url: str) -> socket.socket:
    address = urlsplit(url)
    assert address.port is not None
    # A generous bound that means "hung" (a read past it raises): never a speed check.
    return socket.create_connection((address.hostname, address.port), timeout=60)


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk


def _request(path: str, body: bytes, extra: str = "") -> bytes:
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


@pytest.mark.parametrize(
    "extra",
    [
        "X-Big: " + "a" * 9000 + "\r\n",  # one header over max_header_bytes
        "".join(f"X-H{i}: {'b' * 500}\r\n" for i in range(70)),  # all headers over 32 KiB
        "".join(f"X-N{i}: 1\r\n" for i in range(150)),  # more than max_header_count
    ],
)
def test_header_limits_answer_431(make_stack: StackFactory, extra: str) -> None:
    stack = make_stack()
    with _connect(stack.url) as sock:
        sock.sendall(_request(CHAT, json.dumps(chat()).encode(), extra))
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 431 ")
    assert stack.fake.requests == 0


def test_idle_and_slow_header_connections_are_closed(make_stack: StackFactory) -> None:
    stack = make_stack({"limits": {"header_timeout": 0.5}})
    with _connect(stack.url) as idle, _connect(stack.url) as slow:
        slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        # Closed without a word (nothing else closes a connection that sent no full head).
        assert _read_all(idle) == b""
        assert _read_all(slow) == b""
    with httpx.Client(base_url=stack.url, timeout=10) as client:  # normal requests still work
        assert client.post(CHAT, json=chat()).status_code == 200


def test_a_body_that_never_arrives_is_408(make_stack: StackFactory) -> None:
    stack = make_stack({"limits": {"body_timeout": 0.5}})
    with _connect(stack.url) as sock:
        whole = _request(CHAT, json.dumps(chat()).encode())
        sock.sendall(whole[:-10])  # the headers and most of the body, never the rest
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert stack.fake.requests == 0


def test_queued_bodies_are_capped_in_bytes(make_stack: StackFactory) -> None:
    stack = make_stack({"limits": {"max_queued_body_bytes": 3000}})
    pad = "x" * 2000

    async def go() -> None:
        async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
            holder = asyncio.ensure_future(client.post(CHAT, json=chat(hold="gpu")))
            await wait_for(lambda: stack.fake.active == 1)
            first = asyncio.ensure_future(client.post(CHAT, json={**chat(), "pad": pad}))
            await wait_for(lambda: stack.gateway.queued_body_bytes > 2000)
            second = await client.post(CHAT, json={**chat(), "pad": pad})
            assert second.status_code == 429
            assert "retry-after" in second.headers
            assert "bytes" in second.json()["error"]["message"]
            stack.fake.release("gpu")
            assert (await holder).status_code == 200
            assert (await first).status_code == 200
            assert stack.gateway.queued_body_bytes == 0

    run(go())


def test_a_slow_reader_does_not_hold_the_gpu(make_stack: StackFactory) -> None:
    stack = make_stack({"limits": {"drain_seconds": 0.5}})
    body = json.dumps(chat(bytes=32 * 1024 * 1024)).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a reader that reads nothing
    address = urlsplit(stack.url)
    sock.connect((address.hostname or "", address.port or 0))
    try:
        sock.sendall(_request(CHAT, body))

        async def go() -> None:
            async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
                await wait_for(lambda: len(stack.fake.served) == 1)

                async def freed() -> bool:
                    return (await status(client))["running"] is None

                # Freed by the drain limit (the lease is 900 s; the outcome below says why).
                await wait_for(freed, timeout=60)
                assert (await client.post(CHAT, json=chat())).status_code == 200

        run(go())
    finally:
        sock.close()
    outcomes = [record["outcome"] for record in stack.gateway.history.values()]
    assert any(outcome.startswith("cut: the client took nothing") for outcome in outcomes)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"model": "", "messages": []}', "must not be empty"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deep"),
        (b'{"model": "a", "messages": [], "model": "b"}', "more than once"),
    ],
)
def test_bodies_llama_swap_would_misread_are_400(
    make_stack: StackFactory, body: bytes, message: str
) -> None:
    stack = make_stack()
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        response = client.post(CHAT, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400
    assert message in response.json()["error"]["message"]
    assert stack.fake.requests == 0


def test_passthrough_failures_are_one_line_502s(make_stack: StackFactory) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    stack = make_stack(upstream=dead)
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        response = client.get("/v1/models")
    assert response.status_code == 502
    assert response.json()["error"]["message"].endswith(": Connection refused")


def test_a_passthrough_upstream_that_never_answers_is_504(make_stack: StackFactory) -> None:
    import threading

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections (the kernel does), never answers
    try:
        stack = make_stack(
            {"limits": {"first_byte_timeout": 0.3}},
            upstream=f"http://127.0.0.1:{silent.getsockname()[1]}",
        )
        with httpx.Client(base_url=stack.url, timeout=10) as client:
            response = client.get("/v1/models")
        assert response.status_code == 504
        assert "no response within 0.3 s" in response.json()["error"]["message"]
    finally:
        threading.Thread(target=silent.close).start()


def test_model_from_a_bodiless_request() -> None:
    from prioqueue.gateway.body import model_from_url

    assert model_from_url("/props", b"model=qwen&x=1") == "qwen"
    assert model_from_url("/props", b"model=") is None
    assert model_from_url("/props", b"") is None
    assert model_from_url("/upstream/flux/sdapi/v1/txt2img", b"") == "flux"


def test_extract_model_reads_forms_and_opaque_bodies() -> None:
    assert extract_model(b"model=whisper&x=1", b"application/x-www-form-urlencoded") == "whisper"
    assert extract_model(b"\x00\x01", b"application/octet-stream") is None
    assert extract_model(b"plain text", b"") is None
    assert extract_model(b'{"a": {"model": 1}, "model": "m"}', b"application/json") == "m"
    with pytest.raises(BadRequest, match="more than once"):
        extract_model(b'{"x": {"model": "a", "model": "b"}}', b"application/json")
    with pytest.raises(BadRequest, match="not UTF-8"):
        extract_model(b"model=\xff", b"application/x-www-form-urlencoded")


def test_a_stream_cut_by_its_lease_says_so(
    make_stack: StackFactory, caplog: pytest.LogCaptureFixture
) -> None:
    # A lease of 3 s (the stream would take 10): its first token surely comes inside it.
    stack = make_stack({"limits": {"lease_seconds": 3.0}}, token_seconds=0.1)
    caplog.set_level(logging.WARNING, logger="prioqueue.gateway")
    request = {**chat(tokens=100), "stream": True}
    with (
        httpx.Client(base_url=stack.url, timeout=10) as client,
        client.stream("POST", CHAT, json=request) as response,
    ):
        assert response.status_code == 200
        text = "".join(response.iter_text())
    last = text.strip().split("\n\n")[-1]
    assert last.startswith("event: error")
    assert "lease of 3 s ran out" in last
    assert "tok0" in text
    job = response.headers["x-prioqueue-job"]
    assert any(job in r.getMessage() and "lease" in r.getMessage() for r in caplog.records)


def test_an_upstream_that_never_answers_is_504_and_frees_the_gpu(
    make_stack: StackFactory,
) -> None:
    # An upstream that stops what it was asked when the gateway hangs up (`aborts`); one
    # that goes on keeps the GPU busy until it says it is idle (test_gateway_busy.py).
    config = {"aborts": True, "limits": {"first_byte_timeout": 0.5, "lease_seconds": 60}}
    stack = make_stack(config, aborts=True)
    with httpx.Client(base_url=stack.url, timeout=60) as client:
        silent = client.post(CHAT, json=chat(hold="never"))
        assert silent.status_code == 504  # by the first-byte timeout (the lease is 60 s)
        assert "no response within 0.5 s" in silent.json()["error"]["message"]
        assert client.get("/prioqueue/status").json()["running"] is None
        assert client.post(CHAT, json=chat()).status_code == 200


def test_the_breaker_fails_fast_while_the_upstream_is_down(make_stack: StackFactory) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{probe.getsockname()[1]}"
    limits = {"breaker_failures": 2, "breaker_cooldown_seconds": 30}
    stack = make_stack({"limits": limits}, upstream=dead)
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        for _ in range(2):
            failed = client.post(CHAT, json=chat())
            assert failed.status_code == 502
            message = failed.json()["error"]["message"]
            assert message.startswith("upstream unreachable: cannot connect to 127.0.0.1:")
            assert message.endswith(": Connection refused")
            assert "(" not in message  # no repr
            assert "\n" not in message  # one line
        fast = client.post(CHAT, json=chat())
        assert fast.status_code == 503
        assert "failing fast" in fast.json()["error"]["message"]
        assert 0 < int(fast.headers["retry-after"]) <= 30
        assert client.get("/v1/models").status_code == 503
        upstream = client.get("/prioqueue/status").json()["upstream"]
        assert (upstream["state"], upstream["opened"]) == ("open", 1)
        metrics = client.get("/metrics").text
        assert "prioqueue_gateway_upstream_breaker_open 1.0" in metrics
        assert 'prioqueue_gateway_requests_total{route="gated",status="503"} 1.0' in metrics


def test_the_breaker_closes_after_the_cooldown_when_the_upstream_answers() -> None:
    from prioqueue.gateway._health import Breaker

    now = [0.0]
    breaker = Breaker(2, 10.0, lambda: now[0])
    breaker.failure("down")
    assert breaker.state == "closed"
    breaker.failure("down")
    assert (breaker.state, breaker.retry_in()) == ("open", 10.0)
    now[0] = 10.0
    assert breaker.state == "half-open"
    breaker.failure("still down")  # one more failure re-opens it at once
    assert breaker.state == "open"
    assert breaker.opened == 2
    now[0] = 25.0
    breaker.success()
    assert breaker.state == "closed"
    assert breaker.as_dict()["consecutive_failures"] == 0


def test_http_series_in_metrics(make_stack: StackFactory) -> None:
    stack = make_stack()
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        assert client.post(CHAT, json=chat()).status_code == 200
        assert client.get("/v1/models").status_code == 200
        assert (
            client.post(
                CHAT, content=b"{", headers={"Content-Type": "application/json"}
            ).status_code
            == 400
        )
        text = client.get("/metrics").text
    assert 'prioqueue_gateway_requests_total{route="gated",status="200"} 1.0' in text
    assert 'prioqueue_gateway_requests_total{route="gated",status="400"} 1.0' in text
    assert 'prioqueue_gateway_requests_total{route="passthrough",status="200"} 1.0' in text
    assert "prioqueue_gateway_upstream_first_byte_seconds_count 2.0" in text
    assert "prioqueue_gateway_queued_body_bytes 0.0" in text


def test_server_thread_without_limits_still_serves() -> None:
    with ServerThread(FakeLlamaSwap()) as server:
        assert httpx.get(server.url + "/health", timeout=5).text == "OK"
