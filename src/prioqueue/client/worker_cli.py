"""``prioqueue worker --broker URL --key KEY --name NAME [--models a,b] [--slow] -- CMD ...``.

Runs ``CMD`` once per job: the job's payload as JSON on stdin; its id, attempt, model, lease
and deadline in ``PRIOQUEUE_*`` environment variables. Exit status 0 with JSON on stdout
completes the job with that result (stdout that is not JSON is kept as a string, and stdout
over ``--result-max-bytes`` fails the job); any other status fails it with the tail of
stderr. The command runs under a supervisor (:mod:`prioqueue.client._supervise`) in its own
session: it gets SIGTERM shortly before the lease runs out by this host's monotonic clock and
SIGKILL when it does, SIGKILL at once when the broker takes the job back, and no process it
started outlives the job or the worker (SIGKILL of the worker included). One line per job is
logged at INFO; HTTP requests only with ``--verbose``.

Exit status of ``prioqueue worker``: 0 after a clean stop (SIGTERM or Ctrl-C: the job in
hand finishes and is reported, then the worker leaves; a second signal kills the command and
hands the job back), 1 when the broker refused the worker or could not be reached within
``--retry-timeout`` seconds, 2 on bad usage, a worker of the same ``--name`` for the same
broker already running on this host included (two processes of one name would each hand the
other's jobs back as lost grants: each job run twice, over and over).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from prioqueue.client._cli import add_broker_options
from prioqueue.client.errors import BrokerError, JobLost
from prioqueue.client.job import Job
from prioqueue.client.worker import Worker

__all__ = ["add_arguments", "claim_name", "configure_logging", "run", "run_command"]

STDERR_TAIL = 4000
"""Characters of stderr kept in a failed job's result."""
KILL_GRACE = 5.0
"""Seconds between SIGTERM and SIGKILL when the lease runs out (at most a tenth of the lease);
SIGKILL lands when the lease runs out by the worker's clock."""
POLL_SECONDS = 0.1
"""Seconds between looks at a running command's job (lost? lease?)."""
SUPERVISOR_GRACE = 30.0
"""Seconds to wait for a job's supervisor once it was told to kill everything."""
SUPERVISOR = str(Path(__file__).with_name("_supervise.py"))
"""The supervisor script each job's command runs under."""

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
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="log every HTTP request too (httpx, httpcore); by default one line per job",
    )
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...: run per job")


def _supervised(
    cmd: list[str], env: dict[str, str], stdin: IO[bytes], stdout: IO[bytes], stderr: IO[bytes]
) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``cmd`` under its supervisor; returns it and the write end of its pipe.

    Closing the write end (or this process dying) makes the supervisor kill every process
    of the job (see :mod:`prioqueue.client._supervise`).
    """
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", SUPERVISOR, str(read_end), "--", *cmd],
            stdin=stdin, stdout=stdout, stderr=stderr, env=env,
            start_new_session=True, pass_fds=(read_end,),
        )  # fmt: skip
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return proc, write_end


def _end(proc: subprocess.Popen[bytes], pipe: int) -> None:
    """Kill whatever of the job still runs and wait for its supervisor."""
    with contextlib.suppress(OSError):
        os.close(pipe)  # the supervisor kills every process of the job
    try:
        proc.wait(timeout=SUPERVISOR_GRACE)
    except subprocess.TimeoutExpired:  # pragma: no cover - a supervisor stuck in the kernel
        proc.kill()
        proc.wait()


def _watch(proc: subprocess.Popen[bytes], pipe: int, job: Job) -> str | None:
    """Wait for the command; stop it when the job is lost or its lease runs out.

    The lease is measured on the worker's clock (``job.expires_at``): SIGTERM goes out
    ``KILL_GRACE`` seconds (at most a tenth of the lease) before it runs out, SIGKILL when it
    does; a job taken back is killed at once (another worker may run it already).

    Returns:
        Why the command was stopped, or None when it ended by itself.
    """
    grace = min(KILL_GRACE, job.lease_seconds / 10)
    why = None
    pidfd = _pidfd(proc)
    try:
        while proc.poll() is None:
            left = job.remaining()
            if job.lost:
                return "the broker took the job back"
            if left <= 0:
                return "the lease ran out"
            if left <= grace and why is None:
                why = "the lease ran out"
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)  # passed on to every process of the job
            until_next = left if left <= grace else left - grace
            _wait_a_little(proc, pidfd, min(POLL_SECONDS, max(0.001, until_next)))
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return why


def _pidfd(proc: subprocess.Popen[bytes]) -> int | None:
    """A descriptor readable once ``proc`` exits (Linux 5.3+), else None."""
    try:
        return os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # pragma: no cover - not Linux, or an old kernel
        return None


def _wait_a_little(proc: subprocess.Popen[bytes], pidfd: int | None, seconds: float) -> None:
    """Wait ``seconds`` at most for ``proc`` to exit (at once when it does, with a pidfd)."""
    if pidfd is not None:
        select.select([pidfd], [], [], seconds)
        return
    with contextlib.suppress(subprocess.TimeoutExpired):  # pragma: no cover - not Linux
        proc.wait(timeout=seconds)  # polls: up to 50 ms late


def _outcome(
    job: Job, why: str | None, code: int, out: bytes, err: str, limit: int, retry: bool
) -> str:
    """Report the job; returns its outcome in words for the log."""
    if why is not None:
        report = {"error": f"killed: {why}", "exit_code": code, "stderr": err}
        job.fail(f"killed: {why}", result=report)
        return f"killed ({why})"
    if code != 0:
        report = {"error": f"exit status {code}", "exit_code": code, "stderr": err}
        job.fail(f"exit status {code}", retry=retry, result=report)
        return f"failed (exit status {code})"
    if len(out) > limit:
        job.fail(f"stdout is over --result-max-bytes={limit}", retry=retry)
        return f"failed (stdout over {limit} bytes)"
    text = out.decode(errors="replace").strip()
    result: Any
    try:
        result = json.loads(text) if text else None
    except ValueError:
        result = text
    job.complete(result)
    return "done"


def run_command(
    cmd: list[str], job: Job, *, worker: str, result_max_bytes: int, retry: bool = False
) -> str:
    """Run ``cmd`` for one job and report the outcome (see the module docstring).

    The command runs under a supervisor (:mod:`prioqueue.client._supervise`): however the
    job ends (the command exits, the lease runs out, the job is taken back, the worker is
    interrupted, an error, the worker killed), no process of the command outlives it. One
    line per job is logged at INFO: the job, its outcome, its seconds.

    Args:
        cmd: The command and its arguments.
        job: The job.
        worker: The worker's name (``PRIOQUEUE_WORKER``).
        result_max_bytes: The largest stdout kept as the result.
        retry: Ask for a retry when the command fails.

    Returns:
        The outcome in words (``done``, ``failed (...)``, ``killed (...)``, ``lost``).
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
        proc, pipe = _supervised(cmd, env, stdin, stdout, stderr)
        try:
            why = _watch(proc, pipe, job)
        except BaseException as exc:  # a second signal, or an error: handed back by leave
            seconds = job.lease_seconds - job.remaining()
            cause = f"{type(exc).__name__}: {exc}" if isinstance(exc, Exception) else "a signal"
            _log.info("%s attempt %d: interrupted (%s) in %.1f s", job.id, job.attempt,
                      cause, seconds)  # fmt: skip
            raise
        finally:
            _end(proc, pipe)  # every process of the job is killed on every path
        stdout.seek(0)
        out = stdout.read(result_max_bytes + 1)
        stderr.seek(0, os.SEEK_END)
        stderr.seek(max(0, stderr.tell() - STDERR_TAIL))
        err = stderr.read().decode(errors="replace")
    try:
        outcome = _outcome(job, why, proc.returncode, out, err, result_max_bytes, retry)
    except JobLost:
        outcome = "lost (the broker took the job back)"
    seconds = job.lease_seconds - job.remaining()  # since the grant arrived
    _log.info("%s attempt %d: %s in %.1f s", job.id, job.attempt, outcome, seconds)
    return outcome


def claim_name(broker: str, name: str) -> int | None:
    """Take this host's lock of worker ``name`` for ``broker`` (per user); close it to free it.

    The kernel frees it when the process dies (SIGKILL included), so a restarted worker takes
    it at once; the descriptor is not inherited by the job's commands.

    Args:
        broker: The ``--broker`` value.
        name: The worker's name.

    Returns:
        The lock's descriptor, or None where there is no ``flock`` or no lock file. O(1).

    Raises:
        ValueError: Another live process of this host holds the lock (say so to the user).
    """
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock
        return None
    digest = hashlib.sha256(f"{broker}\0{name}".encode()).hexdigest()[:32]
    path = Path(tempfile.gettempdir()) / f"prioqueue-worker-{os.getuid()}-{digest}.lock"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise ValueError(
            f"another prioqueue worker named {name!r} runs on this host for this broker; "
            "give each worker its own --name (the default is the host name)"
        ) from None
    return fd


def configure_logging(level: str, *, verbose: bool) -> None:
    """The worker's log: one line per job at INFO; HTTP requests only when ``verbose``.

    Args:
        level: The root level's name (``debug``, ``info``...).
        verbose: Keep the ``httpx`` and ``httpcore`` loggers at ``level`` (each request a
            line); otherwise they log warnings and errors only.
    """
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)


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
    lock = None
    if not problems:
        try:
            lock = claim_name(args.broker, args.name)
        except ValueError as exc:
            problems.append(str(exc))
    if problems:
        print("prioqueue worker: " + "; ".join(problems), file=sys.stderr)
        return 2
    try:
        return _serve(args, cmd)
    finally:
        if lock is not None:
            os.close(lock)


def _serve(args: argparse.Namespace, cmd: list[str]) -> int:
    configure_logging(args.log_level, verbose=args.verbose)
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
