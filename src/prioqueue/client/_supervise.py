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

import ctypes
import os
import select
import signal
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
    try:  # noqa: SIM105 - contextlib would cost the supervisor's start a few ms
        os.killpg(group, signum)
    except (ProcessLookupError, PermissionError):  # empty, or zombies only
        pass
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            continue


class Command:
    """The command's pid and, once it was reaped, its exit status (negative: a signal)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.code: int | None = None

    def reap(self) -> None:
        """Reap every child that ended (orphans of the job re-parented here included)."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.pid:
                self.code = os.waitstatus_to_exitcode(status)

    def alive(self) -> bool:
        """Whether any process of the job is left (the group, or anything below this one)."""
        try:
            os.killpg(self.pid, 0)
        except (ProcessLookupError, PermissionError):
            return bool(descendants(os.getpid()))
        return True


def clean_up(command: Command) -> None:
    """Kill the command (if it still runs) and everything it left; reap them all."""
    end = time.monotonic() + REAP_SECONDS
    while True:
        command.reap()
        if command.code is not None and not command.alive():
            return
        if time.monotonic() >= end:  # pragma: no cover - a process stuck in the kernel
            if command.code is None:
                command.code = -signal.SIGKILL
            return
        signal_job(command.pid, signal.SIGKILL)
        time.sleep(0.005)  # SIGKILLed processes take a moment to become zombies


def start(cmd: list[str]) -> Command:
    """Fork and exec ``cmd`` in a new session, to die with this process.

    Raises:
        OSError: It could not be executed (not found, not executable...).
    """
    parent = os.getpid()
    errors_r, errors_w = os.pipe()  # closed on exec: an empty read means it ran
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, until exec
        try:
            os.close(errors_r)
            os.setsid()
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != parent:  # the supervisor died meanwhile
                os._exit(137)
            os.execvp(cmd[0], cmd)
        except OSError as exc:
            os.write(errors_w, str(exc.errno).encode())
        finally:
            os._exit(127)
    os.close(errors_w)
    with os.fdopen(errors_r, "rb") as errors:
        failed = errors.read()
    if failed:
        os.waitpid(pid, 0)
        errno = int(failed)
        raise OSError(errno, os.strerror(errno))
    return Command(pid)


def _watch(command: Command, fd: int, wake: int, terms: list[int]) -> None:
    """Until the command exits or the worker's pipe ends; passes SIGTERM on."""
    while True:
        command.reap()
        if command.code is not None:
            return
        if terms:
            terms.clear()
            signal_job(command.pid, signal.SIGTERM)
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
    os.set_inheritable(fd, False)  # the command has no business with it
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    terms: list[int] = []
    signal.signal(signal.SIGCHLD, lambda _s, _f: None)  # only to wake the select
    signal.signal(signal.SIGTERM, lambda s, _f: terms.append(s))
    try:
        command = start(cmd)
    except OSError as exc:
        print(f"prioqueue worker: cannot run {cmd[0]!r}: {exc}", file=sys.stderr)
        return 126 if isinstance(exc, PermissionError) else 127
    try:
        _watch(command, fd, wake_r, terms)
    finally:
        clean_up(command)
    code = command.code
    assert code is not None  # clean_up reaped it
    if code < 0:  # killed by a signal: die of the same one
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code  # pragma: no cover - a signal that does not end a process
    return code


if __name__ == "__main__":  # pragma: no cover - run as a script by the worker
    sys.exit(main(sys.argv[1:]))
