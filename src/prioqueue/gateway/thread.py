"""Serve an ASGI app under uvicorn in a background thread, on a loopback port (private).

Used by the fake llama-swap's users (tests, benchmarks, examples): import
:class:`ServerThread` and :func:`bind_loopback` from :mod:`prioqueue.gateway.fake_upstream`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

from prioqueue.clock import SYSTEM_CLOCK

__all__ = ["ServerThread", "bind_loopback"]


def bind_loopback(port: int = 0, host: str = "127.0.0.1") -> socket.socket:
    """Return a listening TCP socket on ``host:port`` (port 0: a free one)."""
    # IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY on accepted sockets only when the
    # listening socket says so (proto 0 would cost a 40 ms delayed ACK per response).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


class ServerThread:
    """Run an ASGI app under uvicorn in a background thread, on a loopback port.

    Use as a context manager; :attr:`url` is the base URL once it has started, and
    :attr:`loop` the server's event loop (for ``call_soon_threadsafe``).

    Args:
        app: The ASGI application.
        port: The port (0: a free one).
        log_level: uvicorn's log level.
        limits: Serve with the gateway's hardened HTTP protocol and these limits (header
            timeout and sizes), as ``prioqueue gateway`` does; None: plain uvicorn.
    """

    def __init__(
        self, app: Any, *, port: int = 0, log_level: str = "warning", limits: Any = None
    ) -> None:
        import uvicorn

        self.sock = bind_loopback(port)
        self.port: int = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        if limits is not None:
            from prioqueue.gateway._server import uvicorn_config

            config = uvicorn_config(app, limits, log_level=log_level)
        else:
            config = uvicorn.Config(
                app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=2, backlog=2048
            )
        self.server = uvicorn.Server(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, name=f"uvicorn:{self.port}", daemon=True)

    def _run(self) -> None:
        async def serve() -> None:
            self.loop = asyncio.get_running_loop()
            await self.server.serve(sockets=[self.sock])

        asyncio.run(serve())

    def start(self, timeout: float = 10.0) -> ServerThread:
        """Start the server and wait until it accepts connections."""
        self.thread.start()
        deadline = SYSTEM_CLOCK.monotonic() + timeout  # waits for another thread: real time
        while not self.server.started:
            if SYSTEM_CLOCK.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"server on port {self.port} did not start")
            SYSTEM_CLOCK.sleep(0.005)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the server to exit and wait for its thread."""
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
