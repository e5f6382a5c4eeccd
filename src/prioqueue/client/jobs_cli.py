"""``prioqueue jobs submit|get|wait|cancel|group``: the submitter's command line.

The broker's URL and key come from ``--broker``/``--key`` or ``PRIOQUEUE_BROKER_URL`` and
``PRIOQUEUE_KEY``. Each command prints its answer on stdout: as JSON (``--json``, the default
when stdout is not a terminal), or for a person (``--human``, the default on a terminal):
times as local ISO-8601 with how long ago (or how soon), seconds as durations.

Exit status:

====  ==================================================================================
0     success (``wait``: the job is ``done``)
1     the broker refused the request (its error on stderr) or could not be reached
2     bad usage
3     ``wait``: the job ``failed``
4     ``wait``: the job was ``cancelled``
5     ``wait``: the job ``expired``
6     ``wait``: ``--timeout`` ran out first (the job is printed as it stands)
====  ==================================================================================
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from prioqueue.client._cli import add_broker_options
from prioqueue.client._human import render
from prioqueue.client.broker import Broker, Deadline
from prioqueue.client.errors import BrokerError, WaitTimeout
from prioqueue.clock import SYSTEM_CLOCK
from prioqueue.jobfields import CliFlag, fields_in

__all__ = ["EXIT_CODES", "add_arguments", "run"]

EXIT_CODES = {"done": 0, "failed": 3, "cancelled": 4, "expired": 5, "timeout": 6}
"""``jobs wait``'s exit status per outcome."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``jobs`` subcommands to its parser.

    Args:
        parser: The ``jobs`` subparser.
    """
    add_broker_options(parser, role="submitter", several=False)
    parser.add_argument(
        "--retry-timeout", type=float, default=30.0, help="seconds to retry an unreachable broker"
    )
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    submit = sub.add_parser("submit", help="queue a job (or a batch) and print its id")
    submit.add_argument("--payload", help="the payload, JSON ('-': read it from stdin)")
    for name, flag in _FLAGGED:
        _add_flag(submit, name, flag)
    unflagged = ", ".join(f.name for f in fields_in("client") if f.cli is None)
    submit.add_argument(
        "--field",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help=f"another body field ({unflagged}), repeatable",
    )
    submit.add_argument(
        "--batch", metavar="FILE", help="a JSON list of submit bodies ('-': stdin): all or none"
    )
    submit.add_argument("--idempotency-key", help="reuse to make a retried submit safe")
    get = sub.add_parser("get", help="print a job")
    get.add_argument("id")
    wait = sub.add_parser("wait", help="wait for a job to end; print it (exit status: outcome)")
    wait.add_argument("id")
    wait.add_argument("--timeout", type=float, help="seconds to wait at most (default: forever)")
    cancel = sub.add_parser("cancel", help="cancel a job and print it")
    cancel.add_argument("id")
    group = sub.add_parser("group", help="print a group's counts and forecast (or cancel it)")
    group.add_argument("id")
    group.add_argument("--member", help="another member's group (observer/admin keys)")
    group.add_argument("--cancel", action="store_true", help="cancel its queued jobs")
    group.add_argument(
        "--running", choices=("keep", "cancel"), default="keep", help="with --cancel"
    )
    for action in (submit, get, wait, cancel, group):
        _add_format(action)


_FLAGGED = tuple((f.name, f.cli) for f in fields_in("client", "cli") if f.cli is not None)
"""The fields ``submit`` has a flag for (``prioqueue.jobfields``), in declaration order."""


def _add_flag(parser: argparse.ArgumentParser, name: str, flag: CliFlag) -> None:
    option = f"--{flag.flag or name.replace('_', '-')}"
    more: dict[str, Any] = {"dest": name, "help": flag.help, "metavar": flag.metavar}
    if flag.kind == "number":
        more["type"] = float
    elif flag.kind == "pairs":
        more["action"] = "append"
    parser.add_argument(option, **more)


def _flag_value(name: str, flag: CliFlag, value: Any) -> Any:
    """A flag's value as the body's field (``kind``: see ``CliFlag``).

    Raises:
        ValueError: JSON that does not parse, or a pair without ``=`` (the message names
            the flag).
    """
    option = f"--{flag.flag or name.replace('_', '-')}"
    if flag.kind == "json":
        try:
            return json.loads(value)
        except ValueError as exc:
            raise ValueError(f"{option} is not JSON: {exc}") from None
    if flag.kind == "priority":
        return int(value) if value.lstrip("-").isdigit() else value
    if flag.kind == "pairs":
        pairs = [item.partition("=") for item in value]
        bad = [key for key, sep, _ in pairs if not sep or not key]
        if bad:
            raise ValueError(f"{option}: expected KEY=VALUE, got {bad[0]!r}")
        return {key: text for key, _, text in pairs}
    return value


def _add_format(parser: argparse.ArgumentParser) -> None:
    style = parser.add_mutually_exclusive_group()
    style.add_argument(
        "--human",
        dest="format",
        action="store_const",
        const="human",
        help="times and durations as a person reads them (the default on a terminal)",
    )
    style.add_argument(
        "--json",
        dest="format",
        action="store_const",
        const="json",
        help="the broker's JSON as it is, Unix times included (the default otherwise)",
    )


def _human(args: argparse.Namespace) -> bool:
    """Whether to print for a person: ``--human``, or neither flag and stdout a terminal."""
    style = getattr(args, "format", None)
    return style == "human" or (style is None and sys.stdout.isatty())


def _print(value: Any, args: argparse.Namespace) -> None:
    if _human(args):
        print(render(value, SYSTEM_CLOCK.wall()))
    else:
        print(json.dumps(value, indent=2, sort_keys=True))


def _submit(broker: Broker, args: argparse.Namespace) -> int:
    if args.batch is not None:
        if args.batch == "-":
            text = sys.stdin.read()
        else:
            with open(args.batch, encoding="utf-8") as file:
                text = file.read()
        jobs = json.loads(text)
        if not isinstance(jobs, list):
            print("prioqueue jobs: --batch must hold a JSON list of jobs", file=sys.stderr)
            return 2
        _print({"ids": broker.submit_many(jobs, idempotency_key=args.idempotency_key)}, args)
        return 0
    fields: dict[str, Any] = {}
    for item in args.field:
        name, sep, value = item.partition("=")
        if not sep or not name:
            print(f"prioqueue jobs: --field {item!r}: expected NAME=JSON", file=sys.stderr)
            return 2
        try:
            fields[name] = json.loads(value)
        except ValueError:
            fields[name] = value  # a bare word is a string
    payload = None
    if args.payload is not None:
        text = sys.stdin.read() if args.payload == "-" else args.payload
        try:
            payload = json.loads(text)
        except ValueError as exc:
            print(f"prioqueue jobs: --payload is not JSON: {exc}", file=sys.stderr)
            return 2
    for name, flag in _FLAGGED:
        value = getattr(args, name)
        if value is None:
            continue
        try:
            fields[name] = _flag_value(name, flag, value)
        except ValueError as exc:
            print(f"prioqueue jobs: {exc}", file=sys.stderr)
            return 2
    job_id = broker.submit(payload, idempotency_key=args.idempotency_key, **fields)
    _print({"id": job_id}, args)
    return 0


def _wait(broker: Broker, args: argparse.Namespace) -> int:
    job_id = args.id
    deadline = Deadline(args.timeout)
    try:
        job = broker.get(job_id, wait=deadline.next_poll())
        while not deadline.settled(job):
            job = broker.get(job_id, wait=deadline.next_poll())
    except WaitTimeout as exc:
        _print(exc.job, args)
        return EXIT_CODES["timeout"]
    _print(job, args)
    return EXIT_CODES.get(str(job.get("state")), 1)


def run(args: argparse.Namespace) -> int:
    """Run one ``jobs`` action; returns the exit status (see the module docstring).

    Args:
        args: The parsed options of :func:`add_arguments`.

    Returns:
        The exit status.
    """
    if not args.broker or not args.key:
        print(
            "prioqueue jobs: --broker URL and --key KEY (or PRIOQUEUE_BROKER_URL and "
            "PRIOQUEUE_KEY) are required",
            file=sys.stderr,
        )
        return 2
    try:
        with Broker(args.broker, args.key, retry_timeout=args.retry_timeout) as broker:
            if args.action == "submit":
                return _submit(broker, args)
            if args.action == "get":
                _print(broker.get(args.id), args)
            elif args.action == "wait":
                return _wait(broker, args)
            elif args.action == "cancel":
                _print(broker.cancel(args.id), args)
            elif args.cancel:
                cancelled = broker.cancel_group(args.id, running=args.running, member=args.member)
                _print(cancelled, args)
            else:
                _print(broker.group(args.id, member=args.member), args)
    except BrokerError as exc:
        print(f"prioqueue jobs: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"prioqueue jobs: {exc}", file=sys.stderr)
        return 2
    return 0
