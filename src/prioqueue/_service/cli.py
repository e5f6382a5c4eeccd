"""What ``prioqueue gateway`` and ``prioqueue broker`` share on the command line.

Both run an HTTP service under uvicorn: the same ``--log-level`` and ``--no-access-log``
options, the same check for an optional extra's modules (without importing them), the same
start (a bad configuration is one line and exit 2, a port that cannot be bound one line and
exit 1, "listening" said once it is true) and the same signal handling while uvicorn serves
(a SIGTERM or SIGINT asks for a graceful shutdown, and the signal is not raised again
afterwards, so the process exits 0). Only the standard library and prioqueue's core are
imported here; uvicorn is imported by the commands when they start.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import signal
import socket
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from prioqueue._service.server import BindError, bind
from prioqueue.errors import ConfigError

__all__ = [
    "add_server_options",
    "bound",
    "configured",
    "missing_modules",
    "say_listening",
    "shutdown_signals",
]

_T = TypeVar("_T")


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--log-level`` and ``--no-access-log`` (uvicorn's logging) to ``parser``.

    Args:
        parser: The subcommand's parser.
    """
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level (default: info)",
    )
    parser.add_argument("--no-access-log", action="store_true", help="do not log every request")


def _importable(name: str) -> bool:
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def missing_modules(names: Iterable[str]) -> list[str]:
    """The modules of ``names`` that cannot be imported, found without importing them.

    Args:
        names: Top-level module names (an extra's dependencies).

    Returns:
        The missing ones, in the order given.
    """
    return [name for name in names if not _importable(name)]


@contextlib.contextmanager
def shutdown_signals(handle_exit: Callable[[int, Any], None]) -> Iterator[None]:
    """Route SIGINT and SIGTERM to ``handle_exit`` inside the block; restore them after.

    Unlike uvicorn's own ``capture_signals``, the signal is not raised again when the block
    ends, so a graceful shutdown exits with status 0.

    Args:
        handle_exit: The server's ``handle_exit(signal number, frame)``.
    """
    handled = (signal.SIGINT, signal.SIGTERM)
    previous = {sig: signal.signal(sig, handle_exit) for sig in handled}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def configured(command: str, load: Callable[..., _T], *args: Any, **kwargs: Any) -> _T | None:
    """``load(*args, **kwargs)``, or None after printing its :class:`ConfigError` on stderr.

    Args:
        command: The command's name, the line's prefix (``"prioqueue broker"``).
        load: The service's ``load_config``.
        *args: Its positional arguments.
        **kwargs: Its keyword arguments.

    Returns:
        The configuration, or None when it is invalid (the caller exits 2).
    """
    try:
        return load(*args, **kwargs)
    except ConfigError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return None


def bound(command: str, host: str, port: int) -> socket.socket | None:
    """The listening socket on ``host:port``, or None after printing why not on stderr.

    Args:
        command: The command's name, the line's prefix.
        host: The address.
        port: The port (0: any free one).

    Returns:
        The socket (see :func:`prioqueue._service.server.bind`), or None (the caller exits 1).
    """
    try:
        return bind(host, port)
    except BindError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return None


def say_listening(command: str, sock: socket.socket, detail: str) -> None:
    """Print ``COMMAND: listening on http://HOST:PORT, DETAIL`` on stderr (IPv6 in brackets).

    Args:
        command: The command's name.
        sock: The listening socket.
        detail: What the service serves (its upstreams, its store).
    """
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    print(f"{command}: listening on http://{shown}:{port}, {detail}", file=sys.stderr, flush=True)
