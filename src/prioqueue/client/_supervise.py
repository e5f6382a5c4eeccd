"""A job's supervisor: runs one command and leaves no process of it behind (private).

``prioqueue worker`` starts this file as a script for each job (standard library only, so it
starts in a few tens of milliseconds)::

    python -I -S _supervise.py FD -- CMD ARGS...

Theory of operation
-------------------
* The supervisor runs in its own session (the worker starts it so); it runs ``CMD`` in
  another new session, so the command's process group is the command's pid, and on Linux it
  marks itself a *child subreaper* (``PR_SET_CHILD_SUBREAPER``): a process of the job whose
  parent exits is re-parented to the supervisor instead of ``init``, so even one that left
  the process group (``setsid``) stays below it and is found by walking ``/proc``.
* The command's direct child gets ``PR_SET_PDEATHSIG(SIGKILL)``: should the supervisor itself
  be killed, the command dies with it.
* ``FD`` is the read end of a pipe whose only write end the worker holds. It is never written:
  it reads end-of-file when the worker closes it (to kill the job at once) or when the worker
  process dies, SIGKILL included (the kernel closes its descriptors). Either way every process
  of the job gets SIGKILL.
* SIGTERM to the supervisor is passed on to every process of the job (the lease is running
  out: the command may clean up until the worker closes the pipe).
* When the command exits, everything it left behind (its group, and on Linux every process
  below the supervisor) gets SIGKILL and is reaped; then the supervisor exits with the
  command's status (a command killed by a signal kills the supervisor with the same signal,
  so the worker reads the same status as if it had run the command itself).

Limits: without ``/proc`` and subreapers (not Linux) only the command's process group is
killed, so a process that calls ``setsid`` escapes; a SIGKILL of the supervisor alone (not of
the worker) kills the command but not its children. Nothing here confines a process that
runs as another user or that a privileged helper re-parents.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
REAP_SECONDS = 5.0
"""Seconds spent at most killing and reaping what a command left (a process stuck in the
kernel cannot be reaped sooner)."""

_LIBC: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):  # pragma: no branch - the tests run on Linux
    try:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - a libc ctypes cannot load
        _LIBC = None


def prctl(option: int, value: int) -> bool:
    """``prctl(option, value)`` on Linux; False where it is not available or refused."""
    if _LIBC is None:  # pragma: no cover - not Linux
        return False
    return bool(_LIBC.prctl(option, value, 0, 0, 0) == 0)


def descendants(root: int) -> list[int]:
    """The pids below ``root`` (children first) per ``/proc``; empty without ``/proc``.

    Complexity: O(p) for p processes on the machine.
    """
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:  # pragma: no cover - not Linux
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as file:
                stat = file.read()
        except OSError:  # it ended meanwhile
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(name))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def signal_job(group: int, signum: int) -> None:
    """Send ``signum`` to the process group ``group`` and to every process below this one."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # empty, or zombies only
        os.killpg(group, signum)
    for pid in descendants(os.getpid()):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _reap() -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return bool(descendants(os.getpid()))
    return True


def clean_up(proc: subprocess.Popen[bytes]) -> None:
    """Kill the command (if it still runs) and everything it left; reap them all."""
    if proc.poll() is None:
        signal_job(proc.pid, signal.SIGKILL)
        proc.wait()
    end = time.monotonic() + REAP_SECONDS
    while True:
        signal_job(proc.pid, signal.SIGKILL)
        _reap()
        if not _alive(proc.pid) or time.monotonic() >= end:
            return
        time.sleep(0.01)  # SIGKILLed processes take a moment to become zombies


def _start(cmd: list[str]) -> subprocess.Popen[bytes]:
    parent = os.getpid()

    def in_child() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # pragma: no cover - the supervisor died meanwhile
            os._exit(137)

    # The supervisor has one thread, so preexec_fn is safe here.
    return subprocess.Popen(cmd, start_new_session=True, preexec_fn=in_child)  # noqa: PLW1509


def _watch(proc: subprocess.Popen[bytes], fd: int, wake: int, terms: list[int]) -> None:
    """Until the command exits or the worker's pipe ends; passes SIGTERM on."""
    while proc.poll() is None:
        if terms:
            terms.clear()
            signal_job(proc.pid, signal.SIGTERM)
        ready, _, _ = select.select([fd, wake], [], [])
        if wake in ready:
            try:
                while os.read(wake, 512):
                    pass
            except BlockingIOError:
                pass
        if fd in ready and not os.read(fd, 512):
            return  # the worker closed the pipe, or died


def main(argv: list[str]) -> int:
    """Run the command of ``argv`` (``FD -- CMD ARGS...``); returns its exit status."""
    if len(argv) < 3 or argv[1] != "--" or not argv[0].isdigit():
        print("usage: _supervise.py FD -- CMD ARGS...", file=sys.stderr)
        return 2
    fd, cmd = int(argv[0]), argv[2:]
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    terms: list[int] = []
    signal.signal(signal.SIGCHLD, lambda _s, _f: None)  # only to wake the select
    signal.signal(signal.SIGTERM, lambda s, _f: terms.append(s))
    try:
        proc = _start(cmd)
    except OSError as exc:
        print(f"prioqueue worker: cannot run {cmd[0]!r}: {exc}", file=sys.stderr)
        return 126 if isinstance(exc, PermissionError) else 127
    try:
        _watch(proc, fd, wake_r, terms)
    finally:
        clean_up(proc)
    code = proc.returncode
    if code < 0:  # killed by a signal: die of the same one
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # pragma: no cover - a signal that does not end a process
    return code


if __name__ == "__main__":  # pragma: no cover - run as a script by the worker
    sys.exit(main(sys.argv[1:]))
