"""The fake llama-swap's wire formats: llama-swap's answers as it writes them (private).

:mod:`prioqueue.gateway.fake_upstream` builds its answers from these: the loading-state
events (``sendLoadingState``), ``/running``'s entries, the 401 of ``apiKeys``, its metrics,
and the OpenAI-style bodies.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from prioqueue.clock import Clock

Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m prioqueue.gateway.fake_upstream``."""
    parser = argparse.ArgumentParser(
        prog="python -m prioqueue.gateway.fake_upstream",
        description="A fake llama-swap for trying the gateway without a GPU: OpenAI-style "
        "inference routes (chat and text completions, embeddings, images, speech; streaming "
        "chat as server-sent events), GET /v1/models, /running, /health and /unload. It does "
        "not serialise requests: put `prioqueue gateway --upstream URL` in front of it.",
        epilog="A request may steer its own handling with a 'fake' object in its JSON body, "
        'e.g. {"model": "m", "messages": [], "fake": {"seconds": 0.5, "tokens": 5, '
        '"status": 500, "bytes": 1048576}}: inference time, streamed tokens, an error status, '
        "a response body of that many bytes. GET /fake/stats answers the most inferences it ever "
        "ran at once (max_active).",
    )
    parser.add_argument(
        "--listen", default="127.0.0.1:8080", metavar="HOST:PORT", help="default 127.0.0.1:8080"
    )
    parser.add_argument(
        "--load-seconds", type=float, default=0.0, metavar="S", help="cold-load time per swap"
    )
    parser.add_argument(
        "--token-seconds", type=float, default=0.0, metavar="S", help="delay between tokens"
    )
    parser.add_argument(
        "--aborts",
        action="store_true",
        help="stop an inference when its client disconnects (default: finish it, as image "
        "servers do)",
    )
    parser.add_argument(
        "--persistent",
        action="append",
        default=[],
        metavar="MODEL",
        help="a model of a persistent group: loaded beside the others (repeatable)",
    )
    parser.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="llama-swap's apiKeys: every route but /health needs one (repeatable)",
    )
    parser.add_argument(
        "--send-loading-state",
        action="store_true",
        help="stream llama-swap's loading chunks while a streamed chat's model loads",
    )
    parser.add_argument("--quiet", action="store_true", help="log warnings only, no access log")
    return parser


_RULE = "\u2501" * 5


async def loading_chunk(send: Send, text: str) -> None:
    """One of llama-swap's loading events: a ``reasoning_content`` delta, nothing else."""
    data = json.dumps({"choices": [{"delta": {"reasoning_content": text}}]}).encode()
    await send(
        {"type": "http.response.body", "body": b"data: " + data + b"\n\n", "more_body": True}
    )


async def loading_start(send: Send, model: Any, clock: Clock) -> float:
    """Answer at once, as llama-swap does with ``sendLoadingState``; return the load's start."""
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    for text in (_RULE, "\n", f"llama-swap loading model: {model}", "\n"):
        await loading_chunk(send, text)
    return clock.monotonic()


async def loading_done(send: Send, seconds: float) -> None:
    for text in ("\n", f"Done! ({seconds:.2f}s)", "\n", _RULE, "\n", " ", "\n"):
        await loading_chunk(send, text)


async def big(send: Send, size: int, disconnected: asyncio.Event) -> bool:
    """Send ``size`` bytes in 64 KiB chunks; return True when the client went away."""
    headers = [(b"content-type", b"application/octet-stream")]
    headers.append((b"content-length", str(size).encode()))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    chunk = b"x" * 65536
    while size > 0:
        if disconnected.is_set():
            return True
        part = chunk[: min(size, len(chunk))]
        size -= len(part)
        await send({"type": "http.response.body", "body": part, "more_body": size > 0})
    return False


async def work(event: asyncio.Event, seconds: float, aborts: bool) -> bool:
    """Work ``seconds``; return True when the client left and the work stops (``aborts``)."""
    if not aborts:
        await asyncio.sleep(seconds)
        return False
    return await wait(event, seconds)


async def wait(event: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` unless ``event`` is set first; return whether it was set."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
    return event.is_set()


def completion(path: str, model: str | None) -> dict[str, Any]:
    if path == "/v1/embeddings":
        return {
            "object": "list",
            "model": model,
            "data": [{"object": "embedding", "index": 0, "embedding": [0.0, 1.0]}],
            "usage": {"prompt_tokens": 1, "total_tokens": 1},
        }
    if path == "/v1/chat/completions":
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": model or "fake",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "hello"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
    return {"id": "fake", "object": "text_completion", "model": model, "choices": [{"text": "hi"}]}


async def send_raw(
    send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes
) -> None:
    headers = [*headers, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_json(
    send: Send, status: int, value: object, *, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    headers = [(b"content-type", b"application/json"), *(extra or [])]
    await send_raw(send, status, headers, json.dumps(value).encode())


def running_entries(
    states: dict[str, str], active: int, swapping: tuple[str | None, str | None]
) -> list[dict[str, Any]]:
    """``/running``'s entries as llama-swap writes them, sorted by model id.

    ``swapping``: the models loading and loaded in the swapping group (their entry carries
    the work in progress as ``inflight``, which llama-swap does not report).
    """
    return [
        {
            "model": model,
            "state": state,
            "cmd": f"llama-server --port 9999 --model /models/{model}.gguf",
            "proxy": "http://127.0.0.1:9999",
            "ttl": 0,
            "name": "",
            "description": "",
            "inflight": active if model in swapping else 0,
        }
        for model, state in sorted(states.items())
    ]


def authorised(keys: frozenset[bytes], headers: list[tuple[bytes, bytes]]) -> bool:
    """Whether a request carries one of ``keys`` as llama-swap takes one (none: any may)."""
    if not keys:
        return True
    for name, value in headers:
        if name == b"x-api-key" and value.strip() in keys:
            return True
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() == b"basic":
                with contextlib.suppress(ValueError):
                    token = base64.b64decode(token.strip()).partition(b":")[2]
            elif scheme.lower() != b"bearer":
                continue
            if token.strip() in keys:
                return True
    return False


async def unauthorised(send: Send) -> None:
    """llama-swap's 401."""
    text = "unauthorized: invalid or missing API key"
    await send_json(
        send,
        401,
        {"error": {"code": 401, "message": text, "type": "authentication_error"}},
        extra=[(b"www-authenticate", b'Basic realm="llama-swap"')],
    )


def metrics_text(requests: int, loads: int) -> bytes:
    """A few ``llamaswap_*`` Prometheus series."""
    lines = [
        "# HELP llamaswap_requests_total Requests served (fake).",
        "# TYPE llamaswap_requests_total counter",
        f"llamaswap_requests_total {requests}",
        "# HELP llamaswap_loads_total Model loads (fake).",
        "# TYPE llamaswap_loads_total counter",
        f"llamaswap_loads_total {loads}",
    ]
    return ("\n".join(lines) + "\n").encode()
