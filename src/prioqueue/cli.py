"""The ``prioqueue`` command: ``simulate``, ``gateway``, ``broker``, ``worker`` and ``jobs``.

Each subcommand lives in its adapter's package and is imported only when it runs, so the core
never imports an adapter and ``prioqueue --help`` works without the optional extras.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

__all__ = ["main"]

# name -> (module, help). Each module provides ``add_arguments(parser)`` and ``run(args) -> int``.
_SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "simulate": (
        "prioqueue.sim.cli",
        "replay a workload through the real dispatcher and compare policies",
    ),
    "gateway": (
        "prioqueue.gateway.cli",
        "run the priority gateway in front of llama-swap (an OpenAI-compatible upstream)",
    ),
    "broker": (
        "prioqueue.broker.cli",
        "run the job broker for a fleet of GPU workers (HTTP/JSON, journaled)",
    ),
    "worker": (
        "prioqueue.client.worker_cli",
        "run a command once per broker job (payload on stdin, result on stdout)",
    ),
    "jobs": (
        "prioqueue.client.jobs_cli",
        "submit, read, wait for and cancel broker jobs",
    ),
}

_EXTRAS = {
    "simulate": "sim",
    "gateway": "gateway",
    "broker": "broker",
    "worker": "client",
    "jobs": "client",
}
_EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names, or None.

    That is its first word that is not an option: the top-level parser's only option,
    ``--version``, takes no value.
    """
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word if word in _SUBCOMMANDS else None
    return None


def _parser(chosen: str | None) -> argparse.ArgumentParser:
    """The parser; only the ``chosen`` subcommand's module is imported for its arguments.

    Importing every adapter to list the subcommands cost each ``prioqueue jobs ...`` process
    the web stack's import (about 0.7 s on a quiet machine, seconds on a loaded one).
    """
    parser = argparse.ArgumentParser(
        prog="prioqueue",  # also under ``python -m prioqueue``
        description=(
            "Priority, fair-share and lease policy for one GPU that runs one job at a time."
        ),
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in _SUBCOMMANDS.items():
        subparser = sub.add_parser(name, help=help_text, description=help_text)
        subparser.set_defaults(command_module=module_name)
        if name != chosen:
            continue
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:  # an optional extra is missing
            subparser.set_defaults(_missing=str(exc))
            continue
        module.add_arguments(subparser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit status.

    Exit status: 0 on success, 1 when the command failed, 2 on bad usage, 141 (128 +
    SIGPIPE, as a shell reports it) when the reader of standard output went away
    (``prioqueue simulate --list-scenarios | head``): no traceback is printed then.
    """
    words = sys.argv[1:] if argv is None else list(argv)
    parser = _parser(_chosen(words))
    args = parser.parse_args(words)
    if args.version:
        import prioqueue

        print(f"prioqueue-lanes {prioqueue.__version__}")
        return 0
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    missing = getattr(args, "_missing", None)
    if missing is not None:
        extra = _EXTRAS[args.command]
        print(
            f"prioqueue {args.command} needs the optional extra '{extra}': from a clone, "
            f"pip install '.[{extra}]' (prioqueue-lanes[{extra}] once released) ({missing})",
            file=sys.stderr,
        )
        return 1
    module = importlib.import_module(args.command_module)
    try:
        code: int = module.run(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader closed the pipe (``| head``). Point stdout at devnull so the interpreter's
        # own flush at exit does not raise again, and exit as a SIGPIPE'd process would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return _EXIT_BROKEN_PIPE
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
