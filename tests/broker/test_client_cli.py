"""``prioqueue worker`` and ``prioqueue jobs`` in this process: the command runner's outcomes,
the usage errors, and the ``jobs`` actions against a real broker."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from prioqueue.cli import main
from prioqueue.client import Job, Worker
from prioqueue.client.worker_cli import run_command

from .test_client_fleet import _broker


class _Recorder:
    """Stands in for the Worker behind a Job: records what the job reported."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self.reports: list[tuple[str, dict[str, Any]]] = []
        self.clock = clock

    def _finish(self, job: Job, op: str, extra: dict[str, Any]) -> None:
        self.reports.append((op, extra))
        job.finished = True


def _job(payload: Any, lease: float = 60.0) -> tuple[Job, _Recorder]:
    recorder = _Recorder()
    data = {
        "id": "job-1", "payload": payload, "image": None, "model": "sdxl", "attempt": 2,
        "lease_seconds": lease, "deadline": time.time() + lease,
    }  # fmt: skip
    return Job(recorder, data), recorder


def _run(script: str, payload: Any = None, lease: float = 60.0, **kw: Any) -> Any:
    job, recorder = _job(payload, lease)
    run_command(["sh", "-c", script], job, worker="gpu-x", result_max_bytes=64, **kw)
    assert len(recorder.reports) == 1
    return recorder.reports[0]


def test_json_stdout_completes_with_it_and_the_job_reaches_the_command() -> None:
    script = 'read -r line; printf \'{"in": %s, "id": "%s", "attempt": %s, "model": "%s"}\' ' \
        '"$line" "$PRIOQUEUE_JOB_ID" "$PRIOQUEUE_ATTEMPT" "$PRIOQUEUE_MODEL"'  # fmt: skip
    op, extra = _run(script, payload={"a": 1})
    assert op == "complete"
    assert extra["result"] == {"in": {"a": 1}, "id": "job-1", "attempt": 2, "model": "sdxl"}


def test_text_stdout_is_a_string_and_no_stdout_is_null() -> None:
    assert _run("echo hello")[1]["result"] == "hello"
    assert _run("true")[1]["result"] is None


def test_a_failing_command_fails_the_job_with_its_stderr_tail() -> None:
    op, extra = _run("echo oops >&2; exit 7", retry=True)
    assert op == "fail"
    assert extra["result"]["exit_code"] == 7
    assert "oops" in extra["result"]["stderr"]
    assert extra["retry"] is True


def test_stdout_over_the_limit_fails_the_job() -> None:
    op, extra = _run("head -c 100 /dev/zero | tr '\\0' x")
    assert op == "fail"
    assert "result-max-bytes=64" in extra["result"]["error"]


def test_a_command_past_its_lease_is_killed_and_the_job_failed() -> None:
    start = time.monotonic()
    op, extra = _run("sleep 30", lease=0.5)
    assert op == "fail"
    assert "lease ran out" in extra["result"]["error"]
    assert time.monotonic() - start < 25  # it did not run to its end


def test_a_lost_job_kills_the_command() -> None:
    job, recorder = _job(None)
    job._lost.set()
    run_command(["sleep", "30"], job, worker="gpu-x", result_max_bytes=64)
    assert "took the job back" in recorder.reports[0][1]["result"]["error"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["worker", "--key", "k", "--", "true"], "--broker URL"),
        (["worker", "--broker", "http://x", "--", "true"], "--key KEY"),
        (["worker", "--broker", "http://x", "--key", "k"], "a command to run"),
        (["worker", "--broker", "http://x", "--key", "k", "--slots", "0", "--", "true"], "slots"),
        (["jobs", "get", "job-1"], "--broker URL and --key KEY"),
    ],
)
def test_usage_errors_exit_2_naming_what_is_missing(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    monkeypatch.delenv("PRIOQUEUE_BROKER_URL", raising=False)
    monkeypatch.delenv("PRIOQUEUE_KEY", raising=False)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_jobs_actions_print_json_with_the_documented_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with _broker(tmp_path, "sqlite") as proc:
        base = ["jobs", "--broker", proc.url, "--key", "sk-alice"]

        def jobs(*args: str) -> tuple[int, Any]:
            code = main([*base, *args])
            out = capsys.readouterr().out
            return code, json.loads(out) if out.strip() else None

        code, made = jobs("submit", "--payload", '{"n": 1}', "--priority", "5",
                          "--group", "film", "--estimate", "2")  # fmt: skip
        assert code == 0
        code, job = jobs("get", made["id"])
        assert (code, job["state"], job["priority"]) == (0, "queued", 5)
        batch = tmp_path / "batch.json"
        batch.write_text(json.dumps([{"payload": 1, "group": "film"}, {"payload": 2}]))
        code, ids = jobs("submit", "--batch", str(batch))
        assert code == 0
        assert len(ids["ids"]) == 2
        code, group = jobs("group", "film")
        assert (code, group["queued"]) == (0, 2)
        with Worker(proc.url, "wk-1", "gpu-1", wait=2, handle_signals=False) as worker:
            held = worker.pop()
            assert held is not None
            held.complete({"ok": True})
        code, done = jobs("wait", made["id"], "--timeout", "10")
        assert (code, done["result"]) == (0, {"ok": True})
        code, cancelled = jobs("cancel", ids["ids"][1])
        assert (code, cancelled["state"]) == (0, "cancelled")
        code, _ = jobs("wait", ids["ids"][1])
        assert code == 4
        code, _ = jobs("group", "film", "--cancel", "--running", "cancel")
        assert code == 0
        assert jobs("submit", "--field", "nonsense")[0] == 2
        assert jobs("submit", "--payload", "{not json")[0] == 2
        capsys.readouterr()
        assert main([*base, "submit", "--field", "colour=5"]) == 1  # unknown to the broker
        assert "colour" in capsys.readouterr().err


def test_needs_travel_from_the_cli_and_the_client_to_the_pop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import httpx

    from prioqueue.capabilities import Needs
    from prioqueue.client import Broker

    with _broker(tmp_path, "sqlite") as proc:
        base = ["jobs", "--broker", proc.url, "--key", "sk-alice"]
        assert main([*base, "submit", "--needs", '{"features": ["lora"]}']) == 0
        cli_id = json.loads(capsys.readouterr().out)["id"]
        assert main([*base, "submit", "--needs", "{lora"]) == 2
        assert "--needs is not JSON" in capsys.readouterr().err
        assert main([*base, "submit", "--needs", '{"features": ["loras"]}']) == 1
        assert "needs.features" in capsys.readouterr().err
        with Broker(proc.url, "sk-alice") as client:
            one = client.submit(needs=Needs(features={"lora"}, pixels=4096))
            many = client.submit_many([{"needs": {"features": ["lora"]}}, {"needs": None}])
        pop = f"{proc.url}/v1/workers/gpu-small/pop"
        auth = {"Authorization": "Bearer wk-1"}
        no_lora = {"slots": 4, "capabilities": {"features": ["img2img"]}}
        granted = []
        for _ in range(2):
            r = httpx.post(pop, json=no_lora, headers=auth, timeout=10)
            if r.status_code == 200:
                granted.append(r.json()["id"])
        assert granted == [many[1]]  # the only job that needs no LoRA
        r = httpx.post(pop, json=no_lora, headers=auth, timeout=10)
        assert r.status_code == 204
        assert r.headers["X-Prioqueue-Idle"] == "lora=3"
        lora = {"slots": 4, "capabilities": {"features": ["lora"]}}
        got = set()
        for _ in range(3):
            r = httpx.post(f"{proc.url}/v1/workers/gpu-lora/pop", json=lora, headers=auth)
            assert r.status_code == 200, r.text
            got.add(r.json()["id"])
        assert got == {cli_id, one, many[0]}
