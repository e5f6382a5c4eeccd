"""A fake llama-swap: a real HTTP server for tests, benchmarks and trying the gateway out.

It speaks enough of the OpenAI API (chat completions, completions, embeddings, images, audio;
streaming chat as server-sent events) and of llama-swap's for the gateway and the official
``openai`` client, in the shapes the real llama-swap answers (``tests/gateway/real`` checks the
same cases against it):

* ``GET /running``: every loaded model, sorted by id, each ``{"model", "state", "cmd",
  "proxy", "ttl", "name", "description"}`` (plus ``inflight``, the fake's count of work in
  progress). ``persistent`` models (a llama-swap group with ``persistent: true``) stay
  loaded beside the one the others swap.
* ``/upstream/<model>/...``: the path's model, whatever the body says; a bare
  ``GET /upstream/<model>`` is 301 to ``/upstream/<model>/``.
* ``api_keys`` (llama-swap's ``apiKeys``): every route but ``/health`` needs one of them, as
  ``Authorization: Bearer``, ``Basic`` (the password) or ``X-API-Key``; else 401 with
  ``WWW-Authenticate: Basic realm="llama-swap"``.
* ``send_loading_state`` (``sendLoadingState: true``): a streamed chat completion that needs
  a load is answered at once, with llama-swap's loading chunks (``reasoning_content``
  deltas) during the load and the model's chunks after.
* ``GET /metrics``: a few ``llamaswap_*`` Prometheus series; ``POST /unload``.

It does *not* serialise requests itself: it counts the inferences in progress and records
the most it ever saw (``max_active``, also answered by ``GET /fake/stats``), so a test can
assert that the gateway never let two through at once.

Like an image server (A1111, ComfyUI), it keeps running an inference whose client went away
(``aborts=False``, the default): the work goes on to its end and counts in ``active`` until
then; ``GET /running`` reports it (``"inflight"``, and ``"state": "starting"`` while loading).
With ``aborts=True`` it stops at the disconnect, as llama-server behind llama-swap does.
``running_status`` and ``running_delay`` make ``/running`` fail or answer late (a flapping or
slow health endpoint).

A request can steer its own handling with an extra ``"fake"`` object in its JSON body (the
gateway forwards bodies untouched; with the ``openai`` client use ``extra_body``)::

    {"model": "m", "messages": [...], "fake": {"seconds": 0.5, "status": 500, "hold": "h1",
                                               "tokens": 5, "tag": "job-7"}}

``seconds`` is the time spent on the inference, ``status`` an error status to answer with,
``bytes`` the size of a plain (``application/octet-stream``) response body sent in 64 KiB
chunks instead of the usual JSON, ``hold`` the name of a gate the request waits at until
:meth:`FakeLlamaSwap.release` opens it, ``tokens`` the number of streamed tokens and ``tag``
a label recorded in :attr:`served`.
Switching models costs ``load_seconds`` (the cold load).

Run it by hand with ``python -m prioqueue.gateway.fake_upstream --listen 127.0.0.1:8080``.

It is one concern, past the 500-line gauge on purpose: the fake server and :class:`Served`,
the record of each inference that only the fake writes (its wire helpers are in
``_fake_wire``).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import attrs

from prioqueue.clock import SYSTEM_CLOCK, Clock
from prioqueue.gateway import _fake_wire as wire
from prioqueue.gateway._fake_wire import parser
from prioqueue.gateway.thread import ServerThread, bind_loopback

__all__ = ["FakeLlamaSwap", "Served", "ServerThread", "bind_loopback", "main"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@attrs.define
class Served:
    """One inference the fake saw.

    Attributes:
        model: The body's ``model``.
        tag: ``fake.tag`` from the body, or the gateway's ``X-Prioqueue-Job`` header.
        path: The request path.
        started: The upstream clock's ``monotonic()`` when the inference began (after any
            cold load).
        finished: When it ended, or None while running.
        cancelled: True when the client went away before the end.
        cold_load: True when serving it switched models.
        headers: The request headers (lower-case names).
    """

    model: str | None
    tag: str | None
    path: str
    started: float
    finished: float | None = None
    cancelled: bool = False
    cold_load: bool = False
    headers: dict[str, str] = attrs.field(factory=dict)


_INFERENCE = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/images/generations",
    "/v1/audio/speech",
)


class FakeLlamaSwap:
    """The ASGI application. Thread-safe to inspect; every counter is read-only from outside.

    Args:
        load_seconds: Cold-load time when the model changes.
        token_seconds: Delay between streamed tokens.
        models: The models ``GET /v1/models`` lists.
        aborts: Stop an inference when its client disconnects (default: finish it anyway).
        persistent: Models that stay loaded once loaded (a persistent llama-swap group).
        api_keys: llama-swap's ``apiKeys``: when given, every route but ``/health`` needs one.
        send_loading_state: Stream llama-swap's loading chunks during a streamed load.
        clock: The clock that stamps what it served (default
            :data:`~prioqueue.clock.SYSTEM_CLOCK`).

    Attributes:
        active: Inferences in progress (GPU work, including those whose client left).
        max_active: The most inferences ever in progress at once.
        running_status: The status ``GET /running`` answers (200; set 500 to fail polls).
        running_delay: Seconds ``GET /running`` waits before answering.
        running_polls: ``GET /running`` requests seen.
    """

    def __init__(
        self,
        *,
        load_seconds: float = 0.0,
        token_seconds: float = 0.0,
        models: tuple[str, ...] = ("model-a", "model-b"),
        aborts: bool = False,
        persistent: tuple[str, ...] = (),
        api_keys: tuple[str, ...] = (),
        send_loading_state: bool = False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.clock = clock
        self.aborts = aborts
        self.persistent = frozenset(persistent)
        self.api_keys = frozenset(k.encode("latin-1") for k in api_keys)
        self.send_loading_state = send_loading_state
        self.loaded_beside: set[str] = set()
        self.refused = 0
        self.running_status = 200
        self.running_delay = 0.0
        self.running_polls = 0
        self.loading: str | None = None
        self.load_seconds = load_seconds
        self.token_seconds = token_seconds
        self.models = models
        self.loaded: str | None = None
        self.active = 0
        self.max_active = 0
        self.loads = 0
        self.requests = 0
        self.served: list[Served] = []
        self._lock = threading.Lock()
        self._gates: dict[str, threading.Event] = {}

    def release(self, name: str) -> None:
        """Open the gate ``name``: requests holding at it go on (from any thread)."""
        self._gate(name).set()

    def _gate(self, name: str) -> threading.Event:
        with self._lock:
            return self._gates.setdefault(name, threading.Event())

    def report(self) -> list[dict[str, Any]]:
        """What ``GET /running`` lists: each loaded (or loading) model, sorted by id."""
        with self._lock:
            active = self.active
        states: dict[str, str] = dict.fromkeys(self.loaded_beside, "ready")
        if self.loaded is not None:
            states[self.loaded] = "ready"
        if self.loading is not None:
            states[self.loading] = "starting"
        if not states and active:
            states["unknown"] = "ready"
        return wire.running_entries(states, active, (self.loading, self.loaded))

    def is_loaded(self, model: Any) -> bool:
        """Whether serving ``model`` needs no load."""
        return model == self.loaded or model in self.loaded_beside

    def order(self) -> list[str | None]:
        """Return the tags of the inferences in the order they started."""
        with self._lock:
            return [entry.tag for entry in self.served]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI request (lifespan events are acknowledged)."""
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        self.requests += 1
        path: str = scope["path"]
        method: str = scope["method"]
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        keys = self.api_keys
        if (
            path != "/health"
            and not path.startswith("/fake/")
            and not wire.authorised(keys, scope["headers"])
        ):
            self.refused += 1
            await wire.unauthorised(send)
            return
        pinned = None
        if path.startswith("/upstream/"):
            pinned, slash, rest = path[len("/upstream/") :].partition("/")
            if not slash and method in ("GET", "HEAD"):  # a bare /upstream/<model>
                location = f"/upstream/{pinned}/".encode()
                await wire.send_raw(send, 301, [(b"location", location)], b"")
                return
            path = "/" + rest
        await self._route(scope, (method, path, pinned), bytes(body), receive, send)

    async def _route(
        self,
        scope: Scope,
        where: tuple[str, str, str | None],
        body: bytes,
        receive: Receive,
        send: Send,
    ) -> None:
        method, path, pinned = where
        if method == "POST" and path in _INFERENCE:
            await self._inference(scope, body, receive, send, pinned)
        elif pinned is not None:
            await wire.send_json(send, 200, {"model": pinned, "path": path})
        elif path == "/metrics":
            text = wire.metrics_text(self.requests, self.loads)
            await wire.send_raw(send, 200, [(b"content-type", b"text/plain; version=0.0.4")], text)
        elif path == "/v1/models":
            data = [{"id": model, "object": "model", "owned_by": "fake"} for model in self.models]
            await wire.send_json(send, 200, {"object": "list", "data": data})
        elif path == "/running":
            self.running_polls += 1
            if self.running_delay:
                await asyncio.sleep(self.running_delay)
            if self.running_status != 200:
                await wire.send_json(send, self.running_status, {"error": "fake /running failure"})
            else:
                await wire.send_json(send, 200, {"running": self.report()})
        elif path == "/fake/stats":
            stats = {"active": self.active, "max_active": self.max_active}
            stats.update(requests=self.requests, loads=self.loads)
            await wire.send_json(send, 200, stats)
        elif path == "/unload":
            self.loaded = None
            self.loaded_beside.clear()
            await wire.send_json(send, 200, {"unloaded": True})
        elif path == "/health":
            await wire.send_raw(send, 200, [(b"content-type", b"text/plain")], b"OK")
        elif path == "/echo":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            echo = {
                "method": method,
                "path": path,
                "query": scope.get("query_string", b"").decode("latin-1"),
                "headers": headers,
                "body": body.decode("utf-8", "replace"),
            }
            await wire.send_json(send, 200, echo, extra=[(b"x-fake", b"echo")])
        else:
            await wire.send_json(
                send, 404, {"error": f"no route {path}"}, extra=[(b"x-fake", b"404")]
            )

    async def _inference(
        self, scope: Scope, body: bytes, receive: Receive, send: Send, pinned: str | None = None
    ) -> None:
        try:
            request = json.loads(body)
            if not isinstance(request, dict):
                raise TypeError("not an object")
        except (ValueError, TypeError):
            await wire.send_json(send, 400, {"error": {"message": "invalid JSON"}})
            return
        fake = request.get("fake") or {}
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        model = request.get("model") if pinned is None else pinned
        entry = Served(
            model=model,
            tag=fake.get("tag") or headers.get("x-prioqueue-job"),
            path=scope["path"],
            started=self.clock.monotonic(),
            headers=headers,
        )
        disconnected = asyncio.Event()

        async def watch() -> None:
            message = await receive()
            if message["type"] == "http.disconnect":
                disconnected.set()

        watcher = asyncio.ensure_future(watch())
        with self._lock:
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        working = [True]

        def done() -> None:
            # The GPU work is over (before the last bytes go out, as a real server's is).
            if working[0]:
                working[0] = False
                entry.finished = self.clock.monotonic()
                with self._lock:
                    self.active -= 1

        try:
            loading_state = await self._cold(model, request, entry, disconnected, send)
            if loading_state is False:
                return
            entry.started = self.clock.monotonic()
            with self._lock:
                self.served.append(entry)
            if await self._work(fake, disconnected):
                entry.cancelled = True
                return
            status = int(fake.get("status", 200))
            size = int(fake.get("bytes", 0))
            if disconnected.is_set():
                entry.cancelled = True  # the client left; the work was done all the same
            elif size > 0:
                done()
                entry.cancelled = await wire.big(send, size, disconnected)
            elif status != 200:
                done()
                await wire.send_json(send, status, {"error": {"message": f"fake error {status}"}})
            elif request.get("stream"):
                entry.cancelled = await self._stream(
                    send, model, int(fake.get("tokens", 3)), disconnected, done, loading_state
                )
            else:
                done()
                await wire.send_json(
                    send, 200, wire.completion(scope["path"], model), extra=[(b"x-fake", b"1")]
                )
        finally:
            done()
            watcher.cancel()

    async def _work(self, fake: dict[str, Any], disconnected: asyncio.Event) -> bool:
        """The request's work: its ``hold`` gate, then its ``seconds``; True when it stopped."""
        hold = fake.get("hold")
        if hold is not None:
            gate = self._gate(str(hold))
            while not gate.is_set():
                if await wire.work(disconnected, 0.002, self.aborts):
                    return True
        seconds = float(fake.get("seconds", 0.0))
        return bool(seconds) and await wire.work(disconnected, seconds, self.aborts)

    async def _cold(
        self,
        model: Any,
        request: dict[str, Any],
        entry: Served,
        disconnected: asyncio.Event,
        send: Send,
    ) -> float | bool | None:
        """Load ``model`` if needed.

        Returns:
            False when the client left during the load, else the start of the loading state
            streamed (None: none was).
        """
        if self.is_loaded(model):
            return None
        loading_state = None
        if self.send_loading_state and request.get("stream"):
            loading_state = await wire.loading_start(send, model, self.clock)
        if await self._load(model, entry, disconnected, loading_state, send):
            return False
        return loading_state

    async def _load(
        self,
        model: Any,
        entry: Served,
        disconnected: asyncio.Event,
        loading_state: float | None = None,
        send: Send | None = None,
    ) -> bool:
        """Swap to ``model`` (a cold load); True when the client left and it stopped.

        A persistent model is loaded beside the others; any other replaces the swapping one.
        With ``loading_state`` (the load's start) llama-swap's loading chunks are streamed.
        """
        entry.cold_load = True
        self.loads += 1
        if model not in self.persistent:
            self.loaded = None
        if self.load_seconds:
            self.loading = model
            try:
                if loading_state is not None:
                    ticks = max(1, round(self.load_seconds / 0.1))
                    for _ in range(ticks):
                        if await wire.work(disconnected, self.load_seconds / ticks, self.aborts):
                            entry.cancelled = True
                            return True
                        assert send is not None
                        await wire.loading_chunk(send, ".")
                elif await wire.work(disconnected, self.load_seconds, self.aborts):
                    entry.cancelled = True
                    return True
            finally:
                self.loading = None
        if loading_state is not None:
            assert send is not None
            await wire.loading_done(send, self.clock.monotonic() - loading_state)
        if model in self.persistent:
            self.loaded_beside.add(model)
        else:
            self.loaded = model
        return False

    async def _stream(
        self,
        send: Send,
        model: str | None,
        tokens: int,
        disconnected: asyncio.Event,
        done: Callable[[], None],
        loading_state: float | None = None,
    ) -> bool:
        """Stream ``tokens`` chat chunks as SSE; return True when the client went away.

        Without ``aborts`` the tokens are still generated after the client left (not sent).
        With ``loading_state`` the response began with llama-swap's loading chunks.
        """
        if loading_state is None:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"x-fake", b"1")],
                }
            )
        for index in range(tokens):
            if self.token_seconds and await wire.work(
                disconnected, self.token_seconds, self.aborts
            ):
                return True
            if disconnected.is_set():
                if self.aborts:
                    return True
                continue
            chunk = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": model or "fake",
                "choices": [
                    {"index": 0, "delta": {"content": f"tok{index} "}, "finish_reason": None}
                ],
            }
            data = b"data: " + json.dumps(chunk).encode() + b"\n\n"
            await send({"type": "http.response.body", "body": data, "more_body": True})
        finish = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": model or "fake",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
        tail = b"data: " + json.dumps(finish).encode() + b"\n\ndata: [DONE]\n\n"
        done()
        if disconnected.is_set():
            return True
        await send({"type": "http.response.body", "body": tail, "more_body": False})
        return False


def main(argv: list[str] | None = None) -> int:  # pragma: no cover - run as a script
    """Run the fake llama-swap in the foreground: ``--listen HOST:PORT --load-seconds S``."""
    import uvicorn

    args = parser().parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    app = FakeLlamaSwap(
        load_seconds=args.load_seconds,
        token_seconds=args.token_seconds,
        aborts=args.aborts,
        persistent=tuple(args.persistent),
        api_keys=tuple(args.api_key),
        send_loading_state=args.send_loading_state,
    )
    uvicorn.run(
        app,
        host=host or "127.0.0.1",
        port=int(port),
        log_level="warning" if args.quiet else "info",
        access_log=not args.quiet,
        backlog=4096,
    )
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
