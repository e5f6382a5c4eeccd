"""No process of a job's command outlives its job or its worker (issue 30).

Each command starts a background grandchild and one that leaves the process group
(``setsid``); each records their pids. However the job ends (the command exits or fails, the
job is taken back, the lease runs out by the worker's clock, the worker gets SIGTERM twice or
SIGKILL), none of them is left. Real processes; only the pids these tests started are looked
at (by ``/proc``) and killed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prioqueue.client import Broker, Job, JobLost, Worker
from prioqueue.client._supervise import descendants
from prioqueue.client.worker_cli import SUPERVISOR, run_command

from .test_client_cli import _Recorder
from .test_client_fleet import _broker, _cli, _started

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the supervisor's guarantees are Linux's"
)

LEAVES = r"""
cat > /dev/null
sleep 300 &
echo $! > "$DIR/$PRIOQUEUE_JOB_ID.child"
setsid sleep 300 &
echo $! > "$DIR/$PRIOQUEUE_JOB_ID.escaped"
echo $$ > "$DIR/$PRIOQUEUE_JOB_ID.pid"
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _pids(directory: Path, job_id: str) -> list[int]:
    names = ("pid", "child", "escaped")
    return [int((directory / f"{job_id}.{name}").read_text()) for name in names]


def _all_gone(pids: list[int], timeout: float = 30.0) -> bool:
    """Whether every pid is gone within ``timeout`` (a bound meaning "hung", not a speed)."""
    end = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids):
        if time.monotonic() >= end:
            return False
        time.sleep(0.05)  # waiting for other processes to end
    return True


@contextlib.contextmanager
def _reaped(directory: Path) -> Iterator[None]:
    """Kill (by pid) whatever a test's commands left, should the test fail."""
    try:
        yield
    finally:
        for path in directory.glob("*.child"):
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(path.read_text()), signal.SIGKILL)
        for path in directory.glob("*.escaped"):
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(path.read_text()), signal.SIGKILL)


class _Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _job(job_id: str, recorder: _Recorder, lease: float = 600.0, ahead: float = 0.0) -> Job:
    data = {
        "id": job_id, "payload": None, "image": None, "model": None, "attempt": 1,
        "lease_seconds": lease, "deadline": time.time() + ahead + lease,
    }  # fmt: skip
    return Job(recorder, data)


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("DIR", str(tmp_path))
    with _reaped(tmp_path):
        yield tmp_path


@pytest.mark.parametrize(("tail", "outcome"), [("echo 1", "done"), ("exit 3", "failed")])
def test_what_a_finished_command_left_is_killed_before_the_job_is_reported(
    env: Path, tail: str, outcome: str
) -> None:
    recorder = _Recorder()
    said = run_command(
        ["sh", "-c", LEAVES + tail], _job("job-1", recorder), worker="w", result_max_bytes=64
    )
    assert said.startswith(outcome)
    assert [op for op, _ in recorder.reports] == ["complete" if outcome == "done" else "fail"]
    pids = _pids(env, "job-1")
    assert not [pid for pid in pids if _alive(pid)]  # gone already, not eventually


def _in_thread(cmd: str, job: Job, outcomes: list[str]) -> threading.Thread:
    def target() -> None:
        outcomes.append(run_command(["sh", "-c", cmd], job, worker="w", result_max_bytes=64))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_a_job_taken_back_kills_every_process_of_its_command_at_once(env: Path) -> None:
    recorder = _Recorder()
    job = _job("job-2", recorder)
    outcomes: list[str] = []
    thread = _in_thread(LEAVES + "sleep 300", job, outcomes)
    _started(env / "job-2.pid")
    job._lost.set()  # what a heartbeat does when the broker no longer lists the job
    thread.join(30)
    assert outcomes == ["killed (the broker took the job back)"]
    assert not [pid for pid in _pids(env, "job-2") if _alive(pid)]


TERM_PROOF = r"""
trap 'touch "$DIR/$PRIOQUEUE_JOB_ID.term"' TERM
while :; do sleep 0.05; done
"""


def test_the_lease_is_kept_by_the_workers_clock_whatever_the_brokers_says(env: Path) -> None:
    # The broker's clock is an hour ahead: its deadline says the lease has an hour more. The
    # command (which survives SIGTERM) gets SIGTERM 5 s before the lease runs out by the
    # worker's own clock and SIGKILL when it does, never later.
    clock = _Clock()
    recorder = _Recorder(clock)
    job = _job("job-3", recorder, lease=100.0, ahead=3600.0)
    outcomes: list[str] = []
    thread = _in_thread(LEAVES + TERM_PROOF, job, outcomes)
    _started(env / "job-3.pid")
    clock.t = 94.9
    assert job.remaining() == pytest.approx(5.1)
    clock.t = 95.0  # 5 s left: SIGTERM to every process of the job
    _started(env / "job-3.term")
    assert thread.is_alive()
    assert _alive(_pids(env, "job-3")[0])  # it ignored the SIGTERM: still running
    clock.t = 100.0  # the lease ran out on this host: SIGKILL
    thread.join(30)
    assert outcomes == ["killed (the lease ran out)"]
    assert recorder.reports[0][1]["result"]["error"] == "killed: the lease ran out"
    assert not [pid for pid in _pids(env, "job-3") if _alive(pid)]


def _worker_cli(tmp_path: Path, url: str, name: str) -> Any:
    env = {"DIR": str(tmp_path), "PRIOQUEUE_BROKER_URL": url, "PRIOQUEUE_KEY": "wk-1"}
    command = ["worker", "--name", name, "--wait", "2", "--", "sh", "-c", LEAVES + "sleep 300"]
    return _cli(*command, env=env, log=tmp_path / f"{name}.log")


@pytest.mark.parametrize("how", ["sigterm-twice", "sigkill"])
def test_no_process_of_the_command_outlives_its_worker(env: Path, how: str) -> None:
    with _broker(env, "sqlite") as proc, Broker(proc.url, "sk-alice") as broker:
        cli = _worker_cli(env, proc.url, "gpu-p")
        try:
            job_id = broker.submit({"n": 1})
            _started(env / f"{job_id}.pid")
            pids = _pids(env, job_id)
            if how == "sigkill":
                cli.kill()
                cli.wait(30)
            else:
                cli.send_signal(signal.SIGTERM)  # finish the job in hand (it would not)...
                _started_logging(env / "gpu-p.log", "stopping")
                cli.send_signal(signal.SIGTERM)  # ...then: kill it, hand the job back
                assert cli.wait(timeout=60) == 0, (env / "gpu-p.log").read_text()
                assert broker.get(job_id)["state"] == "queued"
                log = (env / "gpu-p.log").read_text()
                assert f"{job_id} attempt 1: interrupted (a signal)" in log  # its one line
                assert "HTTP Request" not in log  # httpx logs warnings only
            assert _all_gone(pids), [pid for pid in pids if _alive(pid)]
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.wait()


def test_a_job_cancelled_while_it_runs_leaves_no_process_of_its_command(env: Path) -> None:
    # The submitter cancels the running job: the worker's next heartbeat (a quarter of the
    # 8 s lease) no longer lists it, and every process of its command is killed at once.
    with (
        _broker(env, "sqlite", default_lease_seconds=8) as proc,
        Broker(proc.url, "sk-alice") as broker,
    ):
        cli = _worker_cli(env, proc.url, "gpu-c")
        try:
            job_id = broker.submit({"n": 1})
            _started(env / f"{job_id}.pid")
            pids = _pids(env, job_id)
            assert broker.cancel(job_id)["state"] == "cancelled"
            assert _all_gone(pids), [pid for pid in pids if _alive(pid)]
            _started_logging(env / "gpu-c.log", f"{job_id} attempt 1: lost")
            assert cli.poll() is None  # the worker goes on
        finally:
            cli.send_signal(signal.SIGTERM)
            try:
                cli.wait(timeout=30)
            finally:
                if cli.poll() is None:
                    cli.kill()
                    cli.wait()


def _started_logging(log: Path, text: str) -> None:
    end = time.monotonic() + 30
    while text not in log.read_text():
        assert time.monotonic() < end, log.read_text()
        time.sleep(0.05)  # waiting for the worker process


def test_the_supervisor_refuses_bad_usage_and_reports_a_missing_command() -> None:
    def supervise(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-I", "-S", SUPERVISOR, *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)

    assert supervise("x", "--", "true").returncode == 2
    read_end, write_end = os.pipe()
    try:
        command = [sys.executable, "-I", "-S", SUPERVISOR, str(read_end), "--", "/nonexistent"]
        missing = subprocess.run(
            command, capture_output=True, text=True, timeout=60, check=False, pass_fds=[read_end]
        )
    finally:
        os.close(read_end)
        os.close(write_end)
    assert missing.returncode == 127
    assert "cannot run '/nonexistent'" in missing.stderr
    me = os.getpid()
    assert me not in descendants(me)
    assert os.getppid() not in descendants(me)


def test_a_worker_stopped_while_it_long_polls_leaves_no_job_running_nowhere(env: Path) -> None:
    # SIGTERM while the worker waits in a long poll, then a job is submitted: the broker may
    # grant it to the abandoned poll (a broker that does not notice a closed connection
    # does), but the stopping worker hands it back, so the job is queued for another worker,
    # not running attempt 1 with nobody.
    with _broker(env, "sqlite") as proc, Broker(proc.url, "sk-alice") as broker:
        cli_env = {"PRIOQUEUE_BROKER_URL": proc.url, "PRIOQUEUE_KEY": "wk-1"}
        log = env / "idle.log"
        command = ["worker", "--name", "gpu-idle", "--wait", "5", "--", "sh", "-c", "echo 1"]
        cli = _cli(*command, env=cli_env, log=log)
        try:
            _until_polling(broker, log)
            cli.send_signal(signal.SIGTERM)
            job_id = broker.submit({"n": 1})
            assert cli.wait(timeout=60) == 0, log.read_text()
            job = broker.get(job_id)
            assert job["state"] == "queued", (job, log.read_text())
            with Worker(proc.url, "wk-1", "gpu-next", wait=5, handle_signals=False) as other:
                granted = other.pop()
                assert granted is not None
                assert granted.id == job_id
                granted.complete("ran once")
            assert broker.wait(job_id, timeout=30) == "ran once"
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.wait()


def test_a_worker_stopped_in_a_long_poll_exits_once_the_broker_holds_no_poll_of_it(
    env: Path,
) -> None:
    # Probes, round 5: SIGTERM of an idle `prioqueue worker --wait 60` kept it heartbeating
    # until the abandoned poll's wait would have run out (61 s: past `docker stop`'s 10 s and
    # Kubernetes' 30 s grace, so it was SIGKILLed). The broker's heartbeat answer now says how
    # many polls of the worker still wait; at 0 nothing can be granted to the gone one.
    with _broker(env, "sqlite") as proc, Broker(proc.url, "sk-alice") as broker:
        cli_env = {"PRIOQUEUE_BROKER_URL": proc.url, "PRIOQUEUE_KEY": "wk-1"}
        log = env / "long.log"
        command = ["worker", "--name", "gpu-long", "--wait", "60", "--log-level", "info"]
        cli = _cli(*command, "--", "sh", "-c", "echo 1", env=cli_env, log=log)
        try:
            _until_polling(broker, log)
            cli.send_signal(signal.SIGTERM)
            assert cli.wait(timeout=50) == 0, log.read_text()  # "hung": the poll's wait is 60
            assert "no poll of it waits in the broker" in log.read_text()
            assert broker.status()["workers"] == 0
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.wait()


def test_in_process_a_signal_during_a_long_poll_hands_back_what_the_poll_is_granted(
    env: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The same as above with Worker.jobs() in this process (its signal handlers installed in
    # the main thread): one SIGTERM to this process once the worker polls.
    with _broker(env, "sqlite") as proc, Broker(proc.url, "sk-alice") as broker:
        submitted: list[str] = []

        def signal_then_submit() -> None:
            end = time.monotonic() + 60
            while broker.status()["workers"] != 1 and time.monotonic() < end:
                time.sleep(0.05)  # waiting for the worker's first pop (it joins the fleet)
            os.kill(os.getpid(), signal.SIGTERM)  # handled by the worker: it stops
            while broker.status()["workers"] != 0 and time.monotonic() < end:
                time.sleep(0.05)  # waiting for its leave: the abandoned poll may still grant
            submitted.append(broker.submit({"n": 2}))

        thread = threading.Thread(target=signal_then_submit, daemon=True)
        with Worker(proc.url, "wk-1", "gpu-in", wait=3) as worker, caplog.at_level(logging.INFO):
            thread.start()
            ran = list(worker.jobs())
        thread.join(60)
        assert ran == []
        assert "watching the abandoned poll" in caplog.text
        assert broker.get(submitted[0])["state"] == "queued"
        if "handing back a job granted while stopping" not in caplog.text:
            # A broker that noticed the closed connection granted nothing to the gone poll.
            assert broker.get(submitted[0])["attempt"] == 0, caplog.text


def test_an_error_in_the_worker_kills_every_process_of_the_job(
    env: Path, caplog: pytest.LogCaptureFixture
) -> None:
    raised: list[bool] = []

    def failing_clock() -> float:
        if (env / "job-4.pid").exists() and not raised:
            raised.append(True)
            raise RuntimeError("the clock broke")
        return 0.0

    job = _job("job-4", _Recorder(failing_clock))
    with caplog.at_level(logging.INFO), pytest.raises(RuntimeError, match="clock broke"):
        run_command(["sh", "-c", LEAVES + "sleep 300"], job, worker="w", result_max_bytes=64)
    assert "job-4 attempt 1: interrupted (RuntimeError: the clock broke)" in caplog.text
    assert not [pid for pid in _pids(env, "job-4") if _alive(pid)]


class _Lost(_Recorder):
    def _finish(self, job: Job, op: str, extra: dict[str, Any]) -> None:
        raise JobLost(409, f"job {job.id!r} was taken back")


def test_a_report_answered_taken_back_is_the_outcome_lost(env: Path) -> None:
    job = _job("job-5", _Lost())
    said = run_command(["sh", "-c", "echo 1"], job, worker="w", result_max_bytes=64)
    assert said == "lost (the broker took the job back)"


def test_a_second_worker_of_one_name_on_one_host_is_refused(env: Path) -> None:
    # Probes, round 5: two `prioqueue worker` processes of one name (the default name is the
    # host name) each handed the other's job back as a lost grant: one job started 12 times
    # in 90 s, on both at once, never finished. The second one now exits 2 saying why.
    with _broker(env, "sqlite") as proc, Broker(proc.url, "sk-alice") as broker:
        cli_env = {"PRIOQUEUE_BROKER_URL": proc.url, "PRIOQUEUE_KEY": "wk-1"}
        command = ["worker", "--name", "gpu-same", "--wait", "5", "--", "sh", "-c", "echo 1"]
        first = _cli(*command, env=cli_env, log=env / "first.log")
        try:
            end = time.monotonic() + 60
            while broker.status()["workers"] != 1:  # its first pop joined: it is polling
                assert time.monotonic() < end, (env / "first.log").read_text()
                time.sleep(0.05)  # waiting for the worker process
            second = _cli(*command, env=cli_env)
            _, err = second.communicate(timeout=60)
            assert second.returncode == 2
            assert b"another prioqueue worker named 'gpu-same'" in err
            assert first.poll() is None  # the first one goes on
            other = ["worker", "--name", "gpu-other", "--wait", "5", "--", "true"]
            third = _cli(*other, env=cli_env, log=env / "third.log")
            while broker.status()["workers"] != 2:  # another name is welcome
                assert time.monotonic() < end, (env / "third.log").read_text()
                time.sleep(0.05)  # waiting for the worker process
            third.send_signal(signal.SIGTERM)
            assert third.wait(timeout=60) == 0
        finally:
            if first.poll() is None:
                first.send_signal(signal.SIGTERM)
                first.wait(timeout=60)
        again = _cli(*command, env=cli_env, log=env / "again.log")  # free once it exits
        try:
            while broker.status()["workers"] != 1:
                assert time.monotonic() < end, (env / "again.log").read_text()
                time.sleep(0.05)  # waiting for the worker process
        finally:
            again.send_signal(signal.SIGTERM)
            assert again.wait(timeout=60) == 0


def test_slots_full_while_holding_nothing_hands_back_no_other_process_s_job(
    env: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Two Worker objects of one name (another host, or the library used twice): the broker's
    # "slots_full" for a worker that holds nothing in this process is not a lost grant.
    with _broker(env, "sqlite") as proc, Broker(proc.url, "sk-alice") as broker:
        with (
            Worker(proc.url, "wk-1", "gpu-twin", wait=0, handle_signals=False) as one,
            Worker(proc.url, "wk-1", "gpu-twin", wait=0, handle_signals=False) as two,
            caplog.at_level(logging.WARNING),
        ):
            assert two.pop() is None  # its first idle pop: nothing held under the name
            job_id = broker.submit({"n": 1})
            job = one.pop()
            assert job is not None
            waiting = broker.submit({"n": 2})  # queued, and the name's one slot is taken
            assert two.pop() is None  # slots_full: the job is one's, not a lost grant
            assert "is its name shared?" in caplog.text
            view = broker.get(job_id)
            assert (view["state"], view["attempt"]) == ("running", 1)
            assert broker.get(waiting)["state"] == "queued"
            job.complete("once")
        assert broker.wait(job_id, timeout=30) == "once"


def _until_polling(broker: Broker, log: Path) -> None:
    """Wait (60 s at most: "hung") until the worker process's first pop joined it."""
    end = time.monotonic() + 60
    while broker.status()["workers"] != 1:
        assert time.monotonic() < end, log.read_text()
        time.sleep(0.05)  # waiting for the worker process
