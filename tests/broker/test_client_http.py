"""The client's transport against small real HTTP servers on 127.0.0.1 (issue 30).

Each server answers from a script (status, headers, body per request) and records what it
received: the client's retries keep a floor between them whatever ``Retry-After`` says, no
raw error of an answer it cannot read escapes (``BrokerError`` instead), it follows a leader
only to a URL the user gave (the key never reaches another host), and a cancel whose answer
was lost reports the success it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from prioqueue.client import AsyncBroker, Broker, BrokerError, BrokerUnavailable
from prioqueue.client._http import RETRY_AFTER_CAP, RETRY_AFTER_FLOOR, Endpoint, retry_after

Answer = tuple[int, dict[str, str], bytes] | None  # None: drop the connection unanswered


class Scripted:
    """A server on 127.0.0.1 answering each request with ``script(method, path, n)``."""

    def __init__(self, script: Callable[[str, str, int], Answer]) -> None:
        self.script = script
        self.seen: list[tuple[str, str, str | None]] = []  # method, path, Authorization
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                if length:
                    self.rfile.read(length)
                with outer._lock:
                    outer.seen.append((self.command, self.path, self.headers.get("authorization")))
                    n = len(outer.seen)
                answer = outer.script(self.command, self.path, n)
                if answer is None:
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(2)
                    return
                status, headers, body = answer
                self.send_response(status)
                for name, value in {"content-type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # http.server names its handlers so
                self._handle()

            def do_POST(self) -> None:
                self._handle()

            def do_DELETE(self) -> None:
                self._handle()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Scripted:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(10)


def _json(status: int, body: Any, **headers: str) -> Answer:
    return status, headers, json.dumps(body).encode()


@contextlib.contextmanager
def _always(answer: Answer) -> Iterator[Scripted]:
    with Scripted(lambda _m, _p, _n: answer) as server:
        yield server


# ---------------------------------------------------------------- Retry-After


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "-inf", "1e400", "Wed, 21 Oct 2015"])
def test_a_retry_after_of_zero_negative_or_nan_keeps_a_pause_between_retries(value: str) -> None:
    full = _json(429, {"error": "the queue is full", "field": None}, **{"Retry-After": value})
    with _always(full) as server, Broker(server.url, "sk-a", retry_timeout=1.5) as broker:
        with pytest.raises(BrokerUnavailable) as caught:
            broker.submit({"n": 1})
        assert caught.value.status == 429
    # 1.5 s of retries at >= 0.1 s (stamina's first wait) or RETRY_AFTER_FLOOR apart: a few
    # requests, not the thousand of a retry without pause.
    assert 2 <= len(server.seen) <= 16, len(server.seen)


def test_retry_after_is_bounded_and_never_raises() -> None:
    assert retry_after("0") == RETRY_AFTER_FLOOR
    assert retry_after("-3") == RETRY_AFTER_FLOOR
    assert retry_after("2") == 2.0
    assert retry_after("86400") == RETRY_AFTER_CAP
    for unreadable in (None, "nan", "inf", "soon", "Wed, 21 Oct 2015 07:28:00 GMT", "9" * 400):
        assert retry_after(unreadable) is None


# ---------------------------------------------------------------- unreadable answers


UNREADABLE: dict[str, tuple[Answer, Callable[[Broker], Any]]] = {
    "a submit's 201 not JSON": ((201, {}, b"<html>ok</html>"), lambda b: b.submit(1)),
    "a submit's 201 without an id": (_json(201, {"job": "x"}), lambda b: b.submit(1)),
    "a submit's id not a string": (_json(201, {"id": 7}), lambda b: b.submit(1)),
    "a submit's answer a list": (_json(201, ["id"]), lambda b: b.submit(1)),
    "a batch's ids not a list": (_json(201, {"ids": "job-1"}), lambda b: b.submit_many([{}])),
    "a job that is a list": (_json(200, [1, 2]), lambda b: b.get("job-1")),
    "a job that is not JSON": ((200, {}, b"\xff\xfe"), lambda b: b.get("job-1")),
    "a status that is null": (_json(200, None), lambda b: b.status()),
    "an error that is not JSON": ((400, {}, b"bad"), lambda b: b.get("job-1")),
    "a broken gzip body": ((200, {"content-encoding": "gzip"}, b"not gzip"), lambda b: b.status()),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
def test_an_answer_the_client_cannot_read_is_a_broker_error(case: str) -> None:
    answer, call = UNREADABLE[case]
    with (
        _always(answer) as server,
        Broker(server.url, "sk-a", retry_timeout=2) as broker,
        pytest.raises(BrokerError) as caught,
    ):
        call(broker)
    assert str(caught.value)  # a message, never a bare KeyError or JSONDecodeError


def test_the_async_client_reads_answers_the_same_way() -> None:
    async def scenario(url: str) -> None:
        async with AsyncBroker(url, "sk-a", retry_timeout=2) as broker:
            with pytest.raises(BrokerError, match="not an object with 'id'"):
                await broker.submit(1)

    with _always(_json(201, {"nope": 1})) as server:
        asyncio.run(scenario(server.url))


# ---------------------------------------------------------------- the leader


def _standby(leader: str) -> Answer:
    return _json(503, {"error": "standby", "leader": leader}, **{"X-Prioqueue-Leader": leader})


def test_a_leader_not_listed_is_not_followed_and_never_gets_the_key() -> None:
    with (
        _always(_json(201, {"id": "job-1"})) as stranger,
        _always(_standby(stranger.url)) as standby,
    ):
        with (
            Broker(standby.url, "sk-secret", retry_timeout=1.0) as broker,
            pytest.raises(BrokerUnavailable),
        ):
            broker.submit(1)
        assert stranger.seen == []
        assert len(standby.seen) >= 1


def test_a_listed_leader_is_followed() -> None:
    with _always(_json(201, {"id": "job-1"})) as leader:
        with _always(_standby(leader.url + "/")) as standby:  # another spelling of it
            with Broker([standby.url, leader.url], "sk-a", retry_timeout=10) as broker:
                assert broker.submit(1) == "job-1"
                assert broker.status() == {"id": "job-1"}  # stays with the leader
            assert len(standby.seen) == 1
        assert [m for m, _, _ in leader.seen] == ["POST", "GET"]
        assert {key for _, _, key in leader.seen} == {"Bearer sk-a"}


def test_an_endpoint_never_moves_from_https_to_http_nor_to_an_unlisted_host() -> None:
    endpoint = Endpoint(["https://a.example:8443", "https://b.example"])
    for leader, moved_to in [
        ("http://a.example:8443", "https://b.example"),  # another scheme: not listed
        ("https://evil.example", "https://a.example:8443"),  # rotates from b back to a
        ("https://B.example:443/", "https://b.example"),  # the same origin: followed
        ("garbage", "https://a.example:8443"),  # unreadable: as one not listed
    ]:
        asked = endpoint.current
        request = httpx.Request("GET", asked + "/v1/status")
        response = httpx.Response(503, headers={"X-Prioqueue-Leader": leader}, request=request)
        endpoint.follow(response, asked)
        assert endpoint.current == moved_to, leader


# ---------------------------------------------------------------- cancel


def test_a_cancel_whose_answer_was_lost_reports_success() -> None:
    cancelled = {"id": "job-1", "state": "cancelled"}

    def script(method: str, _path: str, n: int) -> Answer:
        if method == "DELETE" and n == 1:
            return None  # it worked, but its answer is lost on the way
        if method == "DELETE":
            return _json(409, {"error": "job 'job-1' is already cancelled", "field": "id"})
        return _json(200, cancelled)

    with Scripted(script) as server, Broker(server.url, "sk-a", retry_timeout=10) as broker:
        assert broker.cancel("job-1") == cancelled
    assert [m for m, _, _ in server.seen] == ["DELETE", "DELETE", "GET"]


def test_a_cancel_of_a_finished_job_is_still_a_409() -> None:
    def script(method: str, _path: str, n: int) -> Answer:
        if method == "DELETE" and n == 1:
            return None
        if method == "DELETE":
            return _json(409, {"error": "job 'job-1' is already done", "field": "id"})
        return _json(200, {"id": "job-1", "state": "done"})

    with (
        Scripted(script) as server,
        Broker(server.url, "sk-a", retry_timeout=10) as broker,
        pytest.raises(BrokerError) as caught,
    ):
        broker.cancel("job-1")
    assert caught.value.status == 409

    # Not retried: the job was cancelled before this call, and the 409 says so.
    refused = _json(409, {"error": "job 'job-1' is already cancelled", "field": "id"})
    with (
        _always(refused) as server,
        Broker(server.url, "sk-a") as broker,
        pytest.raises(BrokerError),
    ):
        broker.cancel("job-1")
    assert [m for m, _, _ in server.seen] == ["DELETE"]


def test_the_async_cancel_reports_a_lost_answer_as_success() -> None:
    def script(method: str, _path: str, n: int) -> Answer:
        if method == "DELETE":
            return None if n == 1 else _json(409, {"error": "already cancelled"})
        return _json(200, {"id": "job-1", "state": "cancelled"})

    async def scenario(url: str) -> None:
        async with AsyncBroker(url, "sk-a", retry_timeout=10) as broker:
            assert (await broker.cancel("job-1"))["state"] == "cancelled"

    with Scripted(script) as server:
        asyncio.run(scenario(server.url))
