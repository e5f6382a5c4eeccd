"""``prioqueue gateway``: run the gateway under uvicorn until SIGTERM or SIGINT.

Shutdown: on the first SIGTERM/SIGINT the gateway stops accepting connections, fails every
queued request with 503 (``Retry-After``), lets running requests finish for at most
``limits.shutdown_grace_seconds`` and exits with status 0. A second SIGINT exits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import sys
from typing import Any

from prioqueue._errors import ConfigError

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the gateway's options to its subcommand parser.

    Args:
        parser: The ``gateway`` subparser.
    """
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="TOML configuration (see examples/gateway.toml); without one, anonymous access "
        "is allowed",
    )
    parser.add_argument("--upstream", metavar="URL", help="upstream base URL (overrides the file)")
    parser.add_argument("--listen", metavar="HOST:PORT", help="address to listen on (overrides)")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level (default: info)",
    )
    parser.add_argument("--no-access-log", action="store_true", help="do not log every request")
    parser.add_argument("--check", action="store_true", help="validate the configuration and exit")


def _server_class() -> Any:
    import uvicorn

    from prioqueue.gateway.app import Gateway

    class GatewayServer(uvicorn.Server):
        """uvicorn's server, failing queued requests at the first signal and exiting 0."""

        def __init__(self, config: uvicorn.Config, gateway: Gateway) -> None:
            super().__init__(config)
            self.gateway = gateway
            self.loop: asyncio.AbstractEventLoop | None = None

        async def startup(self, sockets: Any = None) -> None:
            self.loop = asyncio.get_running_loop()
            await super().startup(sockets=sockets)

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True
            if self.loop is not None and not self.loop.is_closed():
                self.loop.call_soon_threadsafe(self.gateway.begin_shutdown)

        def capture_signals(self) -> Any:  # no re-raising the signal after shutdown: exit 0
            import contextlib

            @contextlib.contextmanager
            def capture() -> Any:
                handled = (signal.SIGINT, signal.SIGTERM)
                previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
                try:
                    yield
                finally:
                    for sig, handler in previous.items():
                        signal.signal(sig, handler)

            return capture()

    return GatewayServer


def run(args: argparse.Namespace) -> int:
    """Run the gateway; returns the exit status (0 after a clean shutdown, 2 on bad config).

    Args:
        args: The parsed options of :func:`add_arguments`.

    Returns:
        The exit status.
    """
    from prioqueue.gateway.config import load_config

    try:
        config = load_config(args.config, upstream=args.upstream, listen=args.listen)
    except ConfigError as exc:
        print(f"prioqueue gateway: {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"configuration OK: listen {config.listen}, upstream {config.upstream}")
        return 0
    import uvicorn

    from prioqueue.gateway.app import Gateway

    gateway = Gateway(config)
    uv_config = uvicorn.Config(
        gateway,
        host=config.host,
        port=config.port,
        lifespan="on",
        log_level=args.log_level,
        access_log=not args.no_access_log,
        timeout_graceful_shutdown=math.ceil(config.limits.shutdown_grace_seconds),
        backlog=2048,
    )
    server = _server_class()(uv_config, gateway)
    print(
        f"prioqueue gateway: listening on http://{config.listen}, upstream {config.upstream}",
        file=sys.stderr,
        flush=True,
    )
    server.run()
    return 0 if server.started else 1
