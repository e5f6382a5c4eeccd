"""``prioqueue worker --broker URL --key KEY --name NAME [--models a,b] [--slow] -- CMD ...``.

Runs ``CMD`` once per job: the job's payload as JSON on stdin; its id, attempt, model, lease
and deadline in ``PRIOQUEUE_*`` environment variables. Exit status 0 with JSON on stdout
completes the job with that result (stdout that is not JSON is kept as a string, and stdout
over ``--result-max-bytes`` fails the job); any other status fails it with the tail of
stderr. The command (its whole process group) is killed when the job's lease runs out or
the broker takes the job back.

Exit status of ``prioqueue worker``: 0 after a clean stop (SIGTERM or Ctrl-C: the job in
hand finishes and is reported, then the worker leaves; a second signal kills the command and
hands the job back), 1 when the broker refused the worker or could not be reached within
``--retry-timeout`` seconds, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from prioqueue.client._cli import add_broker_options
from prioqueue.client._errors import BrokerError
from prioqueue.client._worker import Job, Worker

__all__ = ["add_arguments", "run", "run_command"]

STDERR_TAIL = 4000
"""Characters of stderr kept in a failed job's result."""
KILL_GRACE = 5.0
"""Seconds between SIGTERM and SIGKILL when the command is stopped."""

_log = logging.getLogger("prioqueue.worker")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the worker's options to its subcommand parser.

    Args:
        parser: The ``worker`` subparser.
    """
    add_broker_options(parser, role="worker", several=True)
    parser.add_argument(
        "--name", default=socket.gethostname(), help="this worker's name (default: hostname)"
    )
    parser.add_argument("--models", help="models it serves, comma-separated (default: any)")
    parser.add_argument("--resident", help="the model loaded now")
    parser.add_argument("--slow", action="store_true", help="an extra-slow worker (3x leases)")
    parser.add_argument("--slots", type=int, default=1, help="jobs run at once (default 1)")
    parser.add_argument(
        "--wait", type=float, default=30.0, help="seconds of one long-poll pop (0..60)"
    )
    parser.add_argument(
        "--result-max-bytes",
        type=int,
        default=256 * 1024,
        help="largest stdout kept as the result (the broker's result_max_bytes; default 256 KiB)",
    )
    parser.add_argument(
        "--retry", action="store_true", help="ask the broker to retry failed jobs (fail retry)"
    )
    parser.add_argument(
        "--retry-timeout",
        type=float,
        default=300.0,
        help="seconds to keep retrying an unreachable broker before exiting 1",
    )
    parser.add_argument(
        "--log-level", default="info", choices=("debug", "info", "warning", "error")
    )
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...: run per job")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the command's process group, SIGKILL it after :data:`KILL_GRACE`."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=KILL_GRACE)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:  # pragma: no cover - it ended meanwhile
        proc.wait()


def run_command(
    cmd: list[str], job: Job, *, worker: str, result_max_bytes: int, retry: bool = False
) -> None:
    """Run ``cmd`` for one job and report the outcome (see the module docstring).

    Args:
        cmd: The command and its arguments.
        job: The job.
        worker: The worker's name (``PRIOQUEUE_WORKER``).
        result_max_bytes: The largest stdout kept as the result.
        retry: Ask for a retry when the command fails.

    Raises:
        JobLost: The job was taken back while reporting.
    """
    env = {
        **os.environ,
        "PRIOQUEUE_JOB_ID": job.id,
        "PRIOQUEUE_ATTEMPT": str(job.attempt),
        "PRIOQUEUE_MODEL": job.model or "",
        "PRIOQUEUE_LEASE_SECONDS": repr(job.lease_seconds),
        "PRIOQUEUE_DEADLINE": repr(job.deadline),
        "PRIOQUEUE_WORKER": worker,
    }
    with (
        tempfile.TemporaryFile() as stdin,
        tempfile.TemporaryFile() as stdout,
        tempfile.TemporaryFile() as stderr,
    ):
        stdin.write(json.dumps(job.payload).encode())
        stdin.seek(0)
        proc = subprocess.Popen(
            cmd, stdin=stdin, stdout=stdout, stderr=stderr, env=env, start_new_session=True
        )
        why = None
        try:
            while proc.poll() is None:
                if job.lost:
                    why = "the broker took the job back"
                elif time.time() >= job.deadline:
                    why = "the lease ran out"
                if why is not None:
                    _log.warning("%r: %s: killing the command", job, why)
                    _stop(proc)
                    break
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.1)
        finally:
            _stop(proc)  # a second signal (or any error) kills it too
        stdout.seek(0)
        out = stdout.read(result_max_bytes + 1)
        stderr.seek(0, os.SEEK_END)
        stderr.seek(max(0, stderr.tell() - STDERR_TAIL))
        err = stderr.read().decode(errors="replace")
    code = proc.returncode
    if why is not None:
        job.fail(
            f"killed: {why}",
            result={"error": f"killed: {why}", "exit_code": code, "stderr": err},
        )
        return
    if code != 0:
        job.fail(
            f"exit status {code}",
            retry=retry,
            result={"error": f"exit status {code}", "exit_code": code, "stderr": err},
        )
        return
    if len(out) > result_max_bytes:
        job.fail(f"stdout is over --result-max-bytes={result_max_bytes}", retry=retry)
        return
    text = out.decode(errors="replace").strip()
    result: Any
    try:
        result = json.loads(text) if text else None
    except ValueError:
        result = text
    job.complete(result)


def run(args: argparse.Namespace) -> int:
    """Run the worker until stopped; returns the exit status (see the module docstring).

    Args:
        args: The parsed options of :func:`add_arguments`.

    Returns:
        The exit status.
    """
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    problems = []
    if not args.broker:
        problems.append("--broker URL (or PRIOQUEUE_BROKER_URL) is required")
    if not args.key:
        problems.append("--key KEY (or PRIOQUEUE_KEY) is required")
    if not cmd:
        problems.append("a command to run is required after --")
    if problems:
        print("prioqueue worker: " + "; ".join(problems), file=sys.stderr)
        return 2
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    models = None if args.models is None else [m for m in args.models.split(",") if m]
    try:
        worker = Worker(
            args.broker, args.key, args.name, models=models, resident=args.resident,
            slots=args.slots, slow=args.slow, wait=args.wait, retry_timeout=args.retry_timeout,
        )  # fmt: skip
    except ValueError as exc:
        print(f"prioqueue worker: {exc}", file=sys.stderr)
        return 2

    def handler(job: Job) -> None:
        run_command(
            cmd, job, worker=args.name, result_max_bytes=args.result_max_bytes, retry=args.retry
        )

    try:
        with worker:
            worker.run(handler)
    except BrokerError as exc:
        print(f"prioqueue worker: {exc}", file=sys.stderr)
        return 1
    return 0
