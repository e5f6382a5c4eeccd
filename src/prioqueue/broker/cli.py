"""``prioqueue broker``: run the broker under uvicorn until SIGTERM or SIGINT.

It needs ``--config FILE`` (without one it would have no API keys, so every request would be
a 401, and would write ``prioqueue-broker.db`` wherever it was started): it refuses to start
without one (exit 2). It binds its socket first (a port in use is one line, exit 1), then
recovers from the store, and only once it accepts requests prints "listening"; a store it
cannot open is one "cannot start" line (exit 1), no traceback. Connections get the
gateway's limits (``broker._server``).

On SIGTERM or SIGINT it stops accepting connections, finishes the requests in flight, commits
what is pending, writes a snapshot, closes the store (a leader hands over at once) and exits 0.

The broker acknowledges an operation only after its journal entry is committed, so stopping
it in any way (SIGKILL included) loses nothing acknowledged: the next start recovers from the
store. With several replicas on one PostgreSQL, one leads and the others answer 503 with the
leader's address until they take over.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from prioqueue._service import cli as service
from prioqueue.errors import ConfigError

__all__ = ["add_arguments", "run", "store_problem"]

_COMMAND = "prioqueue broker"
_MISSING = service.missing_modules(("fastapi", "uvicorn"))
if _MISSING:  # the extra: `prioqueue --help` says when it is missing
    raise ImportError(f"No module named {_MISSING[0]!r}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the broker's options to its subcommand parser.

    Args:
        parser: The ``broker`` subparser.
    """
    parser.add_argument(
        "--config", metavar="FILE", help="TOML configuration (see examples/broker.toml)"
    )
    parser.add_argument("--listen", metavar="HOST:PORT", help="address to listen on (overrides)")
    parser.add_argument("--store", metavar="URL", help="store URL (overrides the file's)")
    service.add_server_options(parser)
    parser.add_argument("--check", action="store_true", help="validate the configuration and exit")
    parser.add_argument(
        "--openapi", action="store_true", help="print the OpenAPI description (JSON) and exit"
    )


def store_problem(store: str) -> str | None:
    """Why the broker could not open ``store``, found without opening it; None when it can.

    An SQLite file's directory must exist; a PostgreSQL store needs psycopg (the
    ``postgres`` extra). The store itself is not touched (``--check`` changes nothing).

    Args:
        store: The store URL (already validated by the configuration).

    Returns:
        A message naming the problem and its fix, or None.
    """
    import os

    if store.startswith("sqlite:"):
        from prioqueue.store import sqlite_path

        path = os.path.abspath(sqlite_path(store))
        directory = os.path.dirname(path)
        if not os.path.isdir(directory):
            return (
                f"store {store}: the directory {directory} does not exist (create it, or fix "
                "the path: sqlite:///relative.db is relative, sqlite:////absolute.db absolute)"
            )
        return None
    if store.startswith(("postgresql:", "postgres:")) and service.missing_modules(("psycopg",)):
        return (
            f"store {store}: PostgreSQL needs psycopg, which is not installed "
            "(install the 'postgres' extra, from a checkout: pip install '.[postgres]')"
        )
    return None


NO_CONFIG = (
    "prioqueue broker: no configuration: pass --config FILE (examples/broker.toml documents "
    "every key). Without one the broker would have no API keys (every request a 401) and "
    "would write prioqueue-broker.db in the current directory; for a throwaway demo use "
    "--config examples/broker.toml --store memory://"
)


def _server_class() -> Any:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server: starts the broker first, says "listening" once it serves.

        A broker that cannot start (a corrupt or locked store) is one line on stderr and
        no uvicorn traceback; it exits 0 after a graceful SIGTERM/SIGINT (no re-raised
        signal).
        """

        def capture_signals(self) -> Any:  # no re-raising the signal after shutdown: exit 0
            return service.shutdown_signals(self.handle_exit)

        def handle_exit(self, sig: int, frame: Any) -> None:
            # Answer the long polls now, or the graceful shutdown would wait for them.
            broker = getattr(getattr(self.config.app, "state", None), "broker", None)
            if broker is not None:
                broker.begin_stop()
            super().handle_exit(sig, frame)

        async def startup(self, sockets: Any = None) -> None:
            app: Any = self.config.app
            try:
                await app.state.broker.start()
            except Exception as exc:  # one line, then exit 1 (started stays False)
                print(f"prioqueue broker: cannot start: {exc}", file=sys.stderr, flush=True)
                self.should_exit = True
                return
            app.state.broker_started = True  # the lifespan only stops it
            from prioqueue._service.serving import tune_collector

            tune_collector()  # what it recovered is never scanned again; collections rarer
            await super().startup(sockets=sockets)
            if self.started and sockets:
                service.say_listening(_COMMAND, sockets[0], f"store {app.state.config.store}")

    return Server


def run(args: argparse.Namespace) -> int:
    """Run the broker; returns the exit status (0 after a clean shutdown, 2 on bad config).

    Args:
        args: The parsed options of :func:`add_arguments`.

    Returns:
        The exit status.
    """
    from prioqueue.broker.config import load_config

    if args.config is None and not args.openapi:
        print(NO_CONFIG, file=sys.stderr)
        return 2
    config = service.configured(
        _COMMAND, load_config, args.config, listen=args.listen, store=args.store
    )
    if config is None:
        return 2
    if args.check:
        problem = store_problem(config.store)
        if problem is not None:
            print(f"prioqueue broker: {problem}", file=sys.stderr)
            return 2
        print(f"configuration OK: listen {config.listen}, store {config.store}")
        return 0
    from prioqueue.broker.app import create_app

    if args.openapi:
        import json

        from prioqueue.broker.journal import MemoryJournal

        print(json.dumps(create_app(config, MemoryJournal()).openapi(), indent=2))
        return 0
    try:
        app = create_app(config)
    except ConfigError as exc:
        print(f"prioqueue broker: {exc}", file=sys.stderr)
        return 2
    from prioqueue.broker._server import uvicorn_config

    sock = service.bound(_COMMAND, config.host, config.port)
    if sock is None:
        return 1
    server = _server_class()(
        uvicorn_config(
            app,
            config.connections,
            config.retry_after_seconds,
            log_level=args.log_level,
            access_log=not args.no_access_log,
        )
    )
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0 if server.started else 1
