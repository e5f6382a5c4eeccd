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

from prioqueue.client._broker import Broker, Deadline
from prioqueue.client._cli import add_broker_options
from prioqueue.client._errors import BrokerError, WaitTimeout
from prioqueue.client._human import render
from prioqueue.clock import SYSTEM_CLOCK

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
    submit.add_argument("--priority", help="a number or an alias (interactive, batch...)")
    submit.add_argument("--model", help="the model the job needs")
    submit.add_argument("--estimate", type=float, help="expected runtime in seconds")
    submit.add_argument("--group", help="a group label (a film)")
    submit.add_argument(
        "--needs",
        metavar="JSON",
        help='what the job needs from its worker, e.g. \'{"features": ["lora"], '
        '"pixels": 1048576}\' (models, pixels, steps, features, nsfw, text)',
    )
    submit.add_argument(
        "--field",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="another body field (ttl, not_before, max_attempts...), repeatable",
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


def _print(value: Any, args: argparse.Namespace) -> None:
    if args.human:
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
    if args.needs is not None:
        try:
            fields["needs"] = json.loads(args.needs)
        except ValueError as exc:
            print(f"prioqueue jobs: --needs is not JSON: {exc}", file=sys.stderr)
            return 2
    text_priority: str | None = args.priority
    priority: int | str | None = text_priority
    if text_priority is not None and text_priority.lstrip("-").isdigit():
        priority = int(text_priority)
    job_id = broker.submit(
        payload, priority=priority, model=args.model, estimate=args.estimate,
        group=args.group, idempotency_key=args.idempotency_key, **fields,
    )  # fmt: skip
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
    style = getattr(args, "format", None)
    args.human = style == "human" or (style is None and sys.stdout.isatty())
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
