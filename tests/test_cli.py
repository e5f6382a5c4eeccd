"""The ``prioqueue`` command itself: what every subcommand shares."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("rich")


def test_a_closed_pipe_is_a_quiet_exit_not_a_traceback() -> None:
    # `prioqueue simulate --list-scenarios | head` once ended in a BrokenPipeError traceback.
    # The read end is closed before the command writes, so its first write meets EPIPE.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "prioqueue", "simulate", "--list-scenarios"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr
    assert "BrokenPipeError" not in done.stderr
