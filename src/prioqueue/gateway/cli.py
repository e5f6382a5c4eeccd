"""``prioqueue gateway``: run the gateway under uvicorn until SIGTERM or SIGINT.

Start: the configuration is validated, the extras checked (without the ``gateway`` extra the
command prints the install line and exits 1), the port bound (a port in use is one line on
stderr and exit 1), and only then is "listening" printed. ``--check`` stops before binding
and also says whether ``/metrics`` is available (the ``prometheus`` extra). ``--record FILE``
appends every queued request to FILE as a trace for ``prioqueue simulate --trace FILE``.

Shutdown: on the first SIGTERM/SIGINT the gateway stops accepting connections, fails every
queued request with 503 (``Retry-After``), lets running requests finish for at most
``limits.shutdown_grace_seconds`` and exits with status 0. A second SIGINT exits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
from typing import TYPE_CHECKING, Any

from prioqueue._service import cli as service

if TYPE_CHECKING:
    from prioqueue.gateway.settings import GatewayConfig

__all__ = ["INSTALL", "add_arguments", "missing_extras", "run"]

INSTALL = "pip install '.[gateway,prometheus]'"
"""The install line from a clone (``prioqueue-lanes[gateway,prometheus]`` once released)."""

_GATEWAY_MODULES = ("aiohttp", "uvicorn", "yarl")
_COMMAND = "prioqueue gateway"


def missing_extras() -> tuple[list[str], bool]:
    """Return the gateway extra's missing modules and whether prometheus-client is there."""
    prometheus = not service.missing_modules(("prometheus_client",))
    return service.missing_modules(_GATEWAY_MODULES), prometheus


def _upstreams(config: GatewayConfig) -> str:
    """``upstream URL``, or ``upstreams NAME=URL, ...`` for a fleet."""
    if not config.upstreams:
        return f"upstream {config.upstream}"
    return "upstreams " + ", ".join(f"{u.name}={u.url}" for u in config.upstreams)


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
    service.add_server_options(parser)
    parser.add_argument(
        "--record",
        metavar="FILE",
        help="append every queued request, once it leaves, to FILE as a trace that "
        "`prioqueue simulate --trace FILE` replays (JSON Lines)",
    )
    parser.add_argument(
        "--record-load",
        metavar="MODEL=SECONDS",
        action="append",
        default=[],
        help="a model's known cold-load time, written into the trace and taken out of the "
        "duration of a swap whose load the gateway cannot measure (repeatable)",
    )
    parser.add_argument(
        "--record-default-load",
        metavar="SECONDS",
        type=float,
        default=0.0,
        help="the trace's cold-load time of models with no known or measured load (default 0: "
        "their loads stay inside the recorded durations, so a replay charges them once)",
    )
    parser.add_argument(
        "--check", action="store_true", help="validate the configuration and the extras, exit"
    )


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
            return service.shutdown_signals(self.handle_exit)

    return GatewayServer


def _record_loads(values: list[str]) -> dict[str, float]:
    """Parse ``--record-load MODEL=SECONDS`` values.

    Raises:
        ValueError: A value is not ``MODEL=SECONDS`` with SECONDS a number >= 0.
    """
    loads: dict[str, float] = {}
    for value in values:
        model, sep, seconds = value.rpartition("=")
        try:
            number = float(seconds)
        except ValueError:
            number = -1.0
        if not sep or not model or not number >= 0 or number == float("inf"):
            raise ValueError(f"--record-load wants MODEL=SECONDS (seconds >= 0), got {value!r}")
        loads[model] = number
    return loads


def _open_recorder(
    path: str, *, load_seconds: dict[str, float] | None = None, default_load: float = 0.0
) -> Any:
    """Open the simulator's trace recorder on ``path`` (the file is appended to).

    The header says ``default_load`` (0 unless given): a swap whose load the gateway could
    not measure keeps that load inside its duration, so a replay must not add another.
    """
    try:
        from prioqueue.sim.recorder import (  # type: ignore[import-not-found, unused-ignore]
            TraceRecorder,
        )
    except ImportError:
        raise ImportError(
            "recording needs prioqueue.sim.recorder (the simulator's trace recorder), which "
            "this installation lacks"
        ) from None
    return TraceRecorder(path, load_seconds=load_seconds, default_load=default_load)


GC_THRESHOLDS = (50_000, 20, 100)
"""The collector's thresholds in the gateway process (Python's defaults: 700, 10, 10).

Thousands of waiting clients are millions of live objects, and every collection of the older
generations walks all of them; with 10,000 connections the default thresholds cost the gateway
about half its CPU (``bench_gateway.py``: 2.0 ms of CPU per request at 10,000 clients, 0.9-1.2
ms with these). Set, with what exists at start frozen, by the broker's helper
(``_service.serving.tune_collector``)."""


def _raise_file_limit() -> None:
    """Allow as many open sockets as the hard limit does (thousands of waiting clients)."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not on Windows
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = 65536 if hard == resource.RLIM_INFINITY else hard
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def _recorder(args: argparse.Namespace, config: GatewayConfig) -> tuple[Any, dict[str, float]]:
    """The trace recorder of ``--record`` (None without it) and the ``--record-load`` times.

    The trace's header names the known loads, ``config.recording_loads`` (the configuration's
    ``load_seconds`` with ``--record-load`` over them), as ``Gateway.record_loads`` does.

    Raises:
        ImportError: The simulator's recorder is missing.
        OSError: The file cannot be opened.
        ValueError: A ``--record-load`` value is not ``MODEL=SECONDS``.
    """
    if not args.record:
        return None, {}
    loads = _record_loads(args.record_load)
    recorder = _open_recorder(
        args.record,
        load_seconds=config.recording_loads(loads),
        default_load=args.record_default_load,
    )
    return recorder, loads


def run(args: argparse.Namespace) -> int:
    """Run the gateway; returns the exit status.

    0 after a clean shutdown (or a passing ``--check``), 1 when an extra is missing or the
    port cannot be bound, 2 on a bad configuration.

    Args:
        args: The parsed options of :func:`add_arguments`.

    Returns:
        The exit status.
    """
    from prioqueue.gateway.config import load_config

    config = service.configured(
        _COMMAND, load_config, args.config, upstream=args.upstream, listen=args.listen
    )
    if config is None:
        return 2
    missing, prometheus = missing_extras()
    if missing:
        print(
            f"prioqueue gateway needs the 'gateway' extra (missing: {', '.join(missing)}); "
            f"from a clone: {INSTALL}",
            file=sys.stderr,
        )
        return 1
    if args.check:
        print(f"configuration OK: listen {config.listen}, {_upstreams(config)}")
        if not prometheus:
            print(f"note: /metrics is off without the 'prometheus' extra ({INSTALL})")
        return 0
    sock = service.bound(_COMMAND, config.host, config.port)
    if sock is None:
        return 1
    try:
        recorder, loads = _recorder(args, config)
    except (ImportError, OSError, ValueError) as exc:
        sock.close()
        print(f"prioqueue gateway: --record {args.record}: {exc}", file=sys.stderr)
        return 1
    return _serve(args, config, sock, recorder, loads)


def _serve(
    args: argparse.Namespace,
    config: GatewayConfig,
    sock: socket.socket,
    recorder: Any,
    loads: dict[str, float],
) -> int:
    """Serve on ``sock`` until a signal; returns the exit status (0, or 1 if it never started)."""
    from prioqueue.gateway._server import uvicorn_config
    from prioqueue.gateway.app import Gateway

    _raise_file_limit()
    gateway = Gateway(config, recorder=recorder, record_loads=loads)
    from prioqueue._service.serving import tune_collector

    untune = tune_collector(GC_THRESHOLDS)  # the app is built: what exists now is frozen
    uv_config = uvicorn_config(
        gateway,
        config.limits,
        log_level=args.log_level,
        access_log=not args.no_access_log,
    )
    server = _server_class()(uv_config, gateway)
    # From here a SIGTERM means a clean shutdown, even before uvicorn has started.
    previous: dict[int, Any] = {}
    with contextlib.suppress(ValueError):  # not the main thread: uvicorn's own handling
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, server.handle_exit)
    service.say_listening(_COMMAND, sock, _upstreams(config))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        for number, handler in previous.items():
            signal.signal(number, handler)
        if recorder is not None:
            recorder.close()
        untune()  # as it was (run in-process, e.g. by a test)
    return 0 if server.started else 1
