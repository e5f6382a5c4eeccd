"""The clients against a real broker subprocess (SQLite and PostgreSQL), issue 18.

* A fleet of :class:`prioqueue.client.Worker` threads runs jobs while the broker is SIGKILLed
  and restarted: every job ends done, its handler's side effect happened exactly once, and
  every submit made exactly one job (idempotency keys reused across retries).
* ``prioqueue worker -- CMD`` runs a shell command per job: the payload reaches it, a failure
  on purpose is reported with its stderr, a command past its lease is killed.
* ``prioqueue jobs wait`` returns when the job ends, with the documented exit status.
* A worker waiting in a long poll gets a job submitted while it waits; 100 waiting pops and
  a SIGTERM end cleanly.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from prioqueue.cli import main
from prioqueue.client import Broker, Job, JobFailed, Worker
from store.pg import POSTGRES_URL

from .broker_helpers import WORKER, BrokerProcess, free_port, postgres_schema, write_config

_MAIN = "import sys; from prioqueue.cli import main; sys.exit(main(sys.argv[1:]))"


def _serve(proc: BrokerProcess) -> None:
    async def wait() -> None:
        async with httpx.AsyncClient() as client:
            await proc.wait_serving(client)

    asyncio.run(wait())


@contextlib.contextmanager
def _broker(tmp_path: Path, store: str, **config: Any) -> Iterator[BrokerProcess]:
    port = free_port()
    with contextlib.ExitStack() as stack:
        if store == "sqlite":
            url = f"sqlite:///{tmp_path / 'b.db'}"
            path = write_config(tmp_path / "broker.toml", port, url, **config)
        else:
            schema = stack.enter_context(postgres_schema())
            path = write_config(tmp_path / "broker.toml", port, POSTGRES_URL, schema, **config)
        proc = BrokerProcess(path, port, tmp_path / "broker.log").start()
        try:
            _serve(proc)
            yield proc
        finally:
            proc.kill()


def _stop(workers: list[Worker], threads: list[threading.Thread]) -> None:
    """Stop the workers, wait for their threads (30 s each) and close them."""
    for w in workers:
        w.stop()
    for thread in threads:
        thread.join(120)
    for w in workers:
        w.close()


def _fleet_under_kills(proc: BrokerProcess, jobs: int, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    effects: collections.Counter[int] = collections.Counter()
    after_lost: list[str] = []
    lock = threading.Lock()

    def handler(job: Job) -> int:
        time.sleep(rng.random() * 0.02)
        if job.lost:  # taken back: no side effect
            after_lost.append(job.id)
            return -1
        with lock:
            effects[int(job.payload)] += 1
        return int(job.payload)

    workers = [
        Worker(proc.url, "wk-1", f"gpu-{i}", wait=2, handle_signals=False, retry_timeout=120)
        for i in range(4)
    ]
    threads = [threading.Thread(target=w.run, args=(handler,), daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    ids: list[str] = []
    with Broker(proc.url, "sk-alice", retry_timeout=120) as broker:
        half = jobs // 2
        ids.extend(broker.submit_many([{"payload": n} for n in range(half)]))
        submitter_done = threading.Event()

        def submit_rest() -> None:
            with Broker(proc.url, "sk-alice", retry_timeout=120) as b:
                for n in range(half, jobs):
                    ids.append(b.submit(n))
            submitter_done.set()

        submitter = threading.Thread(target=submit_rest, daemon=True)
        submitter.start()
        for _ in range(kills):
            time.sleep(0.3 + rng.random() * 0.7)
            proc.kill()
            proc.start()
            _serve(proc)
        submitter.join(120)
        assert submitter_done.is_set()
        results = {job_id: broker.wait(job_id, timeout=120) for job_id in ids}
        status = broker.status()
    _stop(workers, threads)
    assert len(ids) == jobs
    assert sorted(results.values()) == list(range(jobs))  # every job done, with its result
    assert effects == collections.Counter(range(jobs))  # each side effect exactly once
    assert status["totals"]["submitted"] == jobs  # no retried submit made a second job
    assert not after_lost


@contextlib.contextmanager
def _submitter_and_worker(tmp_path: Path, **worker: Any) -> Iterator[tuple[Broker, Worker]]:
    """An SQLite broker, a submitter's ``Broker`` and a ``Worker`` (options ``worker``) on it."""
    with (
        _broker(tmp_path, "sqlite") as proc,
        Broker(proc.url, "sk-alice") as broker,
        Worker(proc.url, "wk-1", "gpu-1", handle_signals=False, **worker) as client,
    ):
        yield broker, client


def _until_lost(job: Job, timeout: float) -> None:
    """Wait until the worker's heartbeats mark ``job`` lost (its event: no polling)."""
    job._lost.wait(timeout)


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_a_fleet_of_workers_runs_every_job_once_while_the_broker_is_killed(
    tmp_path: Path, store: str
) -> None:
    with _broker(tmp_path, store) as proc:
        _fleet_under_kills(proc, jobs=60, kills=2, seed=7)


@pytest.mark.slow
@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_500_jobs_5_kills(tmp_path: Path, store: str) -> None:
    with _broker(tmp_path, store) as proc:
        _fleet_under_kills(proc, jobs=500, kills=5, seed=8)


def test_a_job_popped_while_a_heartbeat_is_in_flight_is_not_taken_back(tmp_path: Path) -> None:
    # Found by the busy-machine runs (issue 30): a heartbeat answered before a pop's grant was
    # read after the job had joined held(), so the new job, missing from that answer, was
    # dropped as "taken back" (and later handed back and run again elsewhere). Here the
    # heartbeat thread is held between its answer and reading it while the second job is
    # popped: the order a loaded machine made by chance.
    with _submitter_and_worker(tmp_path, slots=2, heartbeat_interval=0.05) as (broker, worker):
        first, second = broker.submit({"n": 1}), broker.submit({"n": 2})
        answered, go_on = threading.Event(), threading.Event()
        beats_after = [0]
        real = worker._http.request

        def request(method: str, path: str, **kwargs: Any) -> Any:
            response = real(method, path, **kwargs)
            beating = threading.current_thread().name.startswith("prioqueue-heartbeat")
            if beating and path.endswith("/heartbeat"):
                if go_on.is_set():
                    beats_after[0] += 1
                else:
                    answered.set()
                    go_on.wait(60)  # "hung" bound: the test sets it
            return response

        worker._http.request = request  # type: ignore[method-assign]
        one = worker.pop()
        assert one is not None
        assert one.id == first
        assert answered.wait(60)  # a heartbeat answered while only the first was held...
        two = worker.pop()  # ...then the second granted
        assert two is not None
        assert two.id == second
        go_on.set()  # the heartbeat thread reads the answer that does not list the second
        for _ in range(1200):  # two more heartbeats (60 s: "hung")
            if beats_after[0] >= 2:
                break
            time.sleep(0.05)
        assert beats_after[0] >= 2
        assert not two.lost
        assert not one.lost
        two.complete({"n": 2})
        one.complete({"n": 1})
        assert broker.wait(second, timeout=60) == {"n": 2}
        assert broker.get(second)["attempt"] == 1  # never handed back, never run twice


def test_a_job_taken_back_raises_job_lost_and_its_handler_stops(tmp_path: Path) -> None:
    with _submitter_and_worker(tmp_path, wait=5, heartbeat_interval=0.1) as (broker, worker):
        job_id = broker.submit({"n": 1})
        job = worker.pop()
        assert job is not None
        assert job.id == job_id
        broker.cancel(job_id)
        _until_lost(job, timeout=60)  # the heartbeats notice (60 s: "hung")
        assert job.lost
        with pytest.raises(Exception, match="taken back"):
            job.check()


def _cli(*args: str, env: dict[str, str] | None = None, log: Path | None = None) -> Any:
    """``prioqueue ARGS`` as a subprocess: output piped, or into ``log`` (a long-lived one)."""
    command = [sys.executable, "-c", _MAIN, *args]
    environ = {**os.environ, **(env or {})}
    if log is None:
        return subprocess.Popen(
            command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    with log.open("ab") as out:
        return subprocess.Popen(command, env=environ, stdout=out, stderr=subprocess.STDOUT)


SCRIPT = r"""
in=$(cat)
printf '%s' "$in" > "$DIR/$PRIOQUEUE_JOB_ID.in"
echo "$PRIOQUEUE_ATTEMPT $PRIOQUEUE_DEADLINE" > "$DIR/$PRIOQUEUE_JOB_ID.env"
case "$in" in *sleep*) echo $$ > "$DIR/sleeper.pid"; sleep 30; touch "$DIR/slept";; esac
if [ ! -e "$DIR/failed-once" ]; then touch "$DIR/failed-once"; echo boom >&2; exit 3; fi
echo '{"ok": true}'
"""


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_the_worker_cli_runs_a_command_per_job(tmp_path: Path, store: str) -> None:
    with _broker(tmp_path, store, default_lease_seconds=3, max_attempts=1) as proc:
        env = {"DIR": str(tmp_path), "PRIOQUEUE_BROKER_URL": proc.url, "PRIOQUEUE_KEY": "wk-1"}
        log = tmp_path / "worker.log"
        cli = _cli(
            "worker", "--name", "gpu-cli", "--wait", "2", "--", "sh", "-c", SCRIPT,
            env=env, log=log,
        )  # fmt: skip
        try:
            with Broker(proc.url, "sk-alice") as broker:
                first = broker.submit({"prompt": "a cat"})
                with pytest.raises(JobFailed) as failed:
                    broker.wait(first, timeout=60)
                report = failed.value.job["result"]
                assert report["exit_code"] == 3
                assert "boom" in report["stderr"]
                second = broker.submit({"prompt": "a dog"})
                assert broker.wait(second, timeout=60) == {"ok": True}
                assert json.loads((tmp_path / f"{second}.in").read_text()) == {"prompt": "a dog"}
                assert (tmp_path / f"{second}.env").read_text().startswith("1 ")
                sleeper = broker.submit({"sleep": True})
                with pytest.raises(JobFailed):
                    broker.wait(sleeper, timeout=60)
                pid = int((tmp_path / "sleeper.pid").read_text())
                for _ in range(1200):  # killed at its lease (the whole group; 60 s: hung)
                    try:
                        os.kill(pid, 0)
                    except ProcessLookupError:
                        break
                    time.sleep(0.05)
                else:
                    raise AssertionError("the command outlived its lease")
                assert not (tmp_path / "slept").exists()
            cli.send_signal(signal.SIGTERM)
            assert cli.wait(timeout=120) == 0, log.read_text()
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.wait()


def test_jobs_wait_returns_when_the_job_ends_with_its_exit_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Real `prioqueue jobs` processes (the broker and the key from the environment): a submit,
    # and a wait that returns when another client ends the job. The other exit statuses are
    # read in this process (each `prioqueue` process takes seconds to start on a busy machine).
    with _broker(tmp_path, "sqlite") as proc:
        env = {"PRIOQUEUE_BROKER_URL": proc.url, "PRIOQUEUE_KEY": "sk-alice"}
        submit = _cli("jobs", "submit", "--payload", '{"n": 1}', env=env)
        out, err = submit.communicate(timeout=120)
        assert submit.returncode == 0, err
        job_id = json.loads(out)["id"]
        waiting = _cli("jobs", "wait", job_id, env=env)
        time.sleep(0.5)
        assert waiting.poll() is None  # still queued: it waits
        jobs = ["jobs", "--broker", proc.url, "--key", "sk-alice"]
        with Worker(proc.url, "wk-1", "gpu-1", wait=5, handle_signals=False) as worker:
            job = worker.pop()
            assert job is not None
            job.complete({"answer": 42})
            out, err = waiting.communicate(timeout=120)
            assert waiting.returncode == 0, err
            assert json.loads(out)["result"] == {"answer": 42}
            assert main([*jobs, "submit"]) == 0
            failing = json.loads(capsys.readouterr().out)
            job = worker.pop()
            assert job is not None
            job.fail("no")
            assert main([*jobs, "wait", failing["id"]]) == 3
            assert json.loads(capsys.readouterr().out)["state"] == "failed"
        assert main([*jobs, "submit"]) == 0
        queued = json.loads(capsys.readouterr().out)
        assert main([*jobs, "wait", "--timeout", "0.2", queued["id"]]) == 6
        capsys.readouterr()
        assert main([*jobs, "get", "job-999"]) == 1
        assert "404" in capsys.readouterr().err


def test_a_worker_waiting_in_a_long_poll_gets_a_job_submitted_meanwhile(tmp_path: Path) -> None:
    with (
        _broker(tmp_path, "sqlite") as proc,
        Worker(proc.url, "wk-1", "gpu-1", handle_signals=False) as worker,
    ):
        assert worker.pop(wait=0) is None  # joins
        got: list[Job | None] = []
        thread = threading.Thread(target=lambda: got.append(worker.pop(wait=30)))
        thread.start()
        time.sleep(1.0)
        assert thread.is_alive()  # waiting, not polling
        with Broker(proc.url, "sk-alice") as broker:
            job_id = broker.submit({"n": 1})
        thread.join(120)
        assert got
        assert got[0] is not None
        assert got[0].id == job_id


def test_100_waiting_pops_and_a_sigterm_end_cleanly(tmp_path: Path) -> None:
    with _broker(tmp_path, "sqlite") as proc:

        async def scenario() -> list[Any]:
            limits = httpx.Limits(max_connections=200)
            async with httpx.AsyncClient(timeout=90, limits=limits) as client:

                async def pop(i: int) -> Any:
                    try:
                        response = await client.post(
                            f"{proc.url}/v1/workers/gpu-{i}/pop",
                            params={"wait": 60},
                            json={},
                            headers=WORKER,
                        )
                        return response.status_code
                    except httpx.HTTPError as exc:
                        return type(exc).__name__

                tasks = [asyncio.create_task(pop(i)) for i in range(100)]
                await asyncio.sleep(2.0)
                assert not any(t.done() for t in tasks)
                proc.signal(signal.SIGTERM)
                return await asyncio.wait_for(asyncio.gather(*tasks), 30)

        answers = asyncio.run(scenario())
        assert proc.proc is not None
        assert proc.proc.wait(timeout=120) == 0
        assert set(answers) <= {503, "RemoteProtocolError", "ReadError", "ConnectError"}
        assert 503 in answers


def test_workers_follow_the_new_leader_after_a_sigkill(tmp_path: Path) -> None:
    with postgres_schema() as schema:
        procs = []
        for name in ("a", "b"):
            port = free_port()
            config = write_config(
                tmp_path / f"{name}.toml", port, POSTGRES_URL, schema,
                advertise=f"http://127.0.0.1:{port}", leader_lease_seconds=2,
            )  # fmt: skip
            procs.append(BrokerProcess(config, port, tmp_path / f"{name}.log"))
        a, b = procs
        urls = f"{a.url},{b.url}"
        try:
            a.start()
            _serve(a)
            b.start()
            done: collections.Counter[int] = collections.Counter()
            lock = threading.Lock()

            def handler(job: Job) -> int:
                with lock:
                    done[int(job.payload)] += 1
                return int(job.payload)

            workers = [
                Worker(urls, "wk-1", f"gpu-{i}", wait=2, handle_signals=False, retry_timeout=60)
                for i in range(3)
            ]
            threads = [threading.Thread(target=w.run, args=(handler,)) for w in workers]
            for thread in threads:
                thread.start()
            with Broker(urls, "sk-alice", retry_timeout=60) as broker:
                first = broker.submit_many([{"payload": n} for n in range(10)])
                assert [broker.wait(j, timeout=60) for j in first] == list(range(10))
                a.kill()  # the leader dies; b takes over; every client moves to b
                second = broker.submit_many([{"payload": n} for n in range(10, 20)])
                assert [broker.wait(j, timeout=60) for j in second] == list(range(10, 20))
                assert broker.status()["leader"] == b.url
            _stop(workers, threads)
            assert done == collections.Counter(range(20))
        finally:
            a.kill()
            b.kill()


SLOW = r"""
cat > /dev/null
touch "$DIR/$PRIOQUEUE_JOB_ID.started"
sleep 2
echo '{"ok": 1}'
"""


def _started(path: Path) -> None:
    for _ in range(1200):  # 60 s: "hung", not "slow"
        if path.exists():
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def _logged(log: Path, text: str, after: int = 0, timeout: float = 60.0) -> None:
    """Wait until ``log`` holds ``text`` more than ``after`` times (``timeout``: "hung")."""
    for _ in range(int(timeout / 0.05)):
        if log.read_text(errors="replace").count(text) > after:
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} never logged: {log.read_text(errors='replace')[-2000:]}")


def test_sigterm_lets_the_job_in_hand_finish_and_a_second_one_hands_it_back(
    tmp_path: Path,
) -> None:
    with _broker(tmp_path, "sqlite") as proc, Broker(proc.url, "sk-alice") as broker:
        env = {"DIR": str(tmp_path), "PRIOQUEUE_BROKER_URL": proc.url, "PRIOQUEUE_KEY": "wk-1"}
        command = ["worker", "--name", "gpu-t", "--wait", "5", "--", "sh", "-c", SLOW]
        log = tmp_path / "worker.log"
        cli = _cli(*command, env=env, log=log)
        try:
            first = broker.submit({"n": 1})
            _started(tmp_path / f"{first}.started")
            cli.send_signal(signal.SIGTERM)  # stop popping, finish this job, leave
            assert cli.wait(timeout=60) == 0, log.read_text()
            first_stop = log.read_text().count("signal 15: stopping")
            assert broker.get(first)["state"] == "done"
            assert broker.get(first)["result"] == {"ok": 1}
            assert broker.status()["workers"] == 0  # it left
            cli = _cli(*command, env=env, log=log)
            second = broker.submit({"n": 2})
            _started(tmp_path / f"{second}.started")
            cli.send_signal(signal.SIGTERM)
            # The second signal only after the first was handled (two signals sent before the
            # handler ran would arrive as one): its log line says so.
            _logged(log, "signal 15: stopping", after=first_stop)
            cli.send_signal(signal.SIGTERM)  # again: kill the command, hand the job back
            assert cli.wait(timeout=60) == 0, log.read_text()
            job = broker.get(second)
            assert job["state"] == "queued"
            assert job["attempt"] == 1
        finally:
            if cli.poll() is None:
                cli.kill()
                cli.wait()


def test_a_worker_with_two_slots_runs_completes_and_fails_in_process(tmp_path: Path) -> None:
    # Worker.run with slots > 1 (a pool of handler threads), a handler that raises (the job
    # fails with its reason), heartbeats while a handler runs, and stop() ending the loop with
    # a leave: in this process, so coverage sees the worker's own code.
    with _submitter_and_worker(tmp_path, slots=2, wait=1, heartbeat_interval=0.05) as (
        broker,
        worker,
    ):
        ids = [broker.submit({"n": n, "raise": n % 3 == 0}) for n in range(6)]
        seen: list[int] = []
        lock = threading.Lock()

        def handler(job: Job) -> dict[str, int]:
            time.sleep(0.2)  # long enough for a heartbeat or two
            with lock:
                seen.append(job.payload["n"])
                if len(seen) == len(ids):
                    worker.stop()
            if job.payload["raise"]:
                raise RuntimeError(f"shot {job.payload['n']} broke")
            return {"n": job.payload["n"]}

        worker.run(handler)
        assert sorted(seen) == list(range(6))
        assert worker.held() == []
        for n, job_id in enumerate(ids):
            if n % 3 == 0:
                with pytest.raises(JobFailed, match=f"shot {n} broke"):
                    broker.wait(job_id, timeout=10)
            else:
                assert broker.wait(job_id, timeout=10) == {"n": n}


def test_run_with_one_slot_lets_a_handler_see_its_job_taken_back(tmp_path: Path) -> None:
    # Worker.run with one slot: the broker takes the job back (a cancel) while the handler
    # runs; the heartbeats mark it lost, job.check() raises JobLost in the handler, run()
    # reports nothing for it and goes on with the next job.
    with _submitter_and_worker(tmp_path, wait=1, heartbeat_interval=0.05) as (broker, worker):
        first = broker.submit({"n": 1})
        second = broker.submit({"n": 2})
        outcomes: dict[str, str] = {}

        def handler(job: Job) -> dict[str, int]:
            if job.id == first:
                broker.cancel(first)
                _until_lost(job, timeout=60)
                try:
                    job.check()
                except Exception as exc:
                    outcomes[job.id] = type(exc).__name__
                    raise
            outcomes[job.id] = "done"
            worker.stop()
            return {"n": job.payload["n"]}

        worker.run(handler)
        assert outcomes == {first: "JobLost", second: "done"}
        assert broker.get(first)["state"] == "cancelled"
        assert broker.wait(second, timeout=10) == {"n": 2}


def test_the_async_broker_submits_waits_cancels_and_reads_groups(tmp_path: Path) -> None:
    # AsyncBroker against a real broker: the same answers as the sync Broker.
    from prioqueue.client import AsyncBroker, JobCancelled, WaitTimeout

    with (
        _broker(tmp_path, "sqlite") as proc,
        Worker(proc.url, "wk-1", "gpu-1", wait=1, handle_signals=False) as worker,
    ):

        async def main() -> None:
            async with AsyncBroker(proc.url, "sk-alice") as broker:
                one = await broker.submit({"n": 1}, group="film", priority="batch")
                two, three = await broker.submit_many(
                    [{"payload": {"n": 2}, "group": "film"}, {"payload": {"n": 3}}]
                )
                assert (await broker.get(one))["state"] == "queued"
                with pytest.raises(WaitTimeout):
                    await broker.wait(three, timeout=0.2)
                await broker.cancel(three)
                with pytest.raises(JobCancelled):
                    await broker.wait(three, timeout=60)
                job = await asyncio.to_thread(worker.pop)
                assert job is not None
                await asyncio.to_thread(job.complete, {"ok": job.id})
                assert await broker.wait(job.id, timeout=60) == {"ok": job.id}
                film = await broker.group("film")
                assert film["done"] + film["queued"] == 2
                assert job.id in (one, two)  # three was cancelled before the pop
                cancelled = await broker.cancel_group("film")
                assert len(cancelled["cancelled"]) == 1  # the film's job still queued
                assert (await broker.status())["role"] == "leader"

        asyncio.run(main())
