"""A stand-in for llama-server that llama-swap starts as a model's ``cmd`` (tests only).

Standard library only, so that it starts in a few tens of milliseconds::

    python standin.py --port ${PORT} --name qwen --load 0.3 --log /tmp/x/events.log

* Start: appends ``start NAME PID T`` to the log (T is ``time.monotonic()``, one clock for
  every process on Linux), answers ``/health`` 503 for ``--load`` seconds, then 200.
  ``--crash-at-start`` exits with status 3 before listening; ``--crash-after N`` exits in the
  middle of its (N+1)-th request.
* ``POST /v1/chat/completions``: works ``work`` seconds (the body's ``work``, else
  ``--work``), appending ``begin NAME TAG T`` and ``end NAME TAG T OUTCOME`` (``done`` or
  ``left``) to the log; the body's ``stream: true`` answers server-sent events in the shape of
  llama-server's, one chunk per ``work / 5`` seconds. A client that leaves stops the work (as
  llama-server does): checked every 10 ms while not streaming, at each write while streaming.
* ``GET /v1/models``, ``GET /props``: small JSON answers.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--load", type=float, default=0.0)
    parser.add_argument("--work", type=float, default=0.05)
    parser.add_argument("--log", required=True)
    parser.add_argument("--crash-at-start", action="store_true")
    parser.add_argument("--crash-after", type=int, default=-1)
    args = parser.parse_args()
    lock = threading.Lock()

    def log(*fields: object) -> None:
        line = " ".join(str(f) for f in fields) + "\n"
        with lock, open(args.log, "a", encoding="utf-8") as out:
            out.write(line)

    log("start", args.name, os.getpid(), time.monotonic())
    if args.crash_at_start:
        sys.exit(3)
    ready_at = time.monotonic() + args.load
    served = [0]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *a: object) -> None:  # quiet
            pass

        def _json(self, status: int, value: object) -> None:
            data = json.dumps(value).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.startswith("/health"):
                if time.monotonic() < ready_at:
                    self._json(503, {"error": {"message": "Loading model", "code": 503}})
                else:
                    self._json(200, {"status": "ok"})
            elif self.path.startswith("/v1/models"):
                self._json(200, {"object": "list", "data": [{"id": args.name}]})
            else:
                self._json(200, {"model": args.name, "path": self.path})

        def _gone(self) -> bool:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            try:
                peeked: bytes = self.connection.recv(1, socket.MSG_PEEK)
                return peeked == b""
            except OSError:
                return True

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = {}
            work = float(body.get("work", args.work))
            tag = str(body.get("tag", "-"))
            served[0] += 1
            log("begin", args.name, tag, time.monotonic())
            if served[0] - 1 == args.crash_after:
                time.sleep(work / 2)
                os._exit(4)
            if body.get("stream"):
                self._stream(work, body, tag)
                return
            outcome = self._work(work)
            # Logged before the answer is written: a client that has its answer finds the
            # request's end in the log (a test reads it right after).
            log("end", args.name, tag, time.monotonic(), outcome)
            if outcome == "done":
                self._json(200, _completion(args.name, body))

        def _work(self, work: float) -> str:
            deadline = time.monotonic() + work
            while time.monotonic() < deadline:
                if self._gone():
                    self.close_connection = True
                    return "left"
                time.sleep(0.01)
            return "done"

        def _stream(self, work: float, body: dict[str, object], tag: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for i in range(5):
                    time.sleep(work / 5)
                    chunk = {
                        "id": "chatcmpl-standin",
                        "object": "chat.completion.chunk",
                        "model": args.name,
                        "choices": [{"index": 0, "delta": {"content": f"tok{i} "}}],
                    }
                    self._chunk(f"data: {json.dumps(chunk)}\n\n".encode())
                self._chunk(b"data: [DONE]\n\n")
            except OSError:
                self.close_connection = True
                log("end", args.name, tag, time.monotonic(), "left")
                return
            log("end", args.name, tag, time.monotonic(), "done")  # before the last chunk
            try:
                self._chunk(b"")
            except OSError:
                self.close_connection = True

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


def _completion(name: str, body: dict[str, object]) -> dict[str, object]:
    return {
        "id": "chatcmpl-standin",
        "object": "chat.completion",
        "model": name,
        "asked": body.get("model"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
    }


if __name__ == "__main__":
    main()
