"""``prioqueue jobs --human`` and the worker's log: what a person reads (issue 30)."""

from __future__ import annotations

import datetime
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prioqueue.cli import main
from prioqueue.client import Job
from prioqueue.client._human import duration, instant, render
from prioqueue.client.worker_cli import configure_logging, run_command

from .test_client_fleet import _broker


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.25, "250 ms"),
        (0.9996, "1.0 s"),
        (3.04, "3.0 s"),
        (-42.0, "42.0 s"),
        (59.97, "1 min 0 s"),
        (899.6, "15 min 0 s"),  # rounded before it is split: never "14 min 60 s"
        (7500.0, "2 h 5 min"),
        (90000.0, "1 d 1 h"),
    ],
)
def test_durations_read_as_a_person_says_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


@given(st.floats(min_value=0, max_value=10**9))
def test_no_duration_shows_60_of_a_unit_or_24_hours(seconds: float) -> None:
    words = duration(seconds).split()
    for number, unit in zip(words[::2], words[1::2], strict=True):
        limit = {"ms": 1000, "s": 60, "min": 60, "h": 24, "d": math.inf}[unit]
        assert float(number) < limit


def test_an_instant_is_local_iso_8601_with_how_far_from_now() -> None:
    when = 1_790_000_000.0
    text = instant(when, now=when + 185)
    stamp, rest = text.split(" ", 1)
    assert datetime.datetime.fromisoformat(stamp).timestamp() == when  # offset included
    assert rest == "(3 min 5 s ago)"
    assert instant(when, now=when - 2.5).endswith("(in 2.5 s)")
    assert instant(when, now=when + 0.2).endswith("(now)")
    with pytest.raises(ValueError, match="finite"):
        instant(math.nan, now=when)
    with pytest.raises(ValueError, match="finite"):
        duration(math.inf)


def test_a_job_renders_its_times_durations_and_json() -> None:
    now = 1_790_000_000.0
    job = {
        "id": "job-7", "state": "done", "result": {"url": "s3://x"}, "priority": 100,
        "submitted_at": now - 600, "finished_at": now - 5, "not_before": None,
        "estimate": 30.0, "ids": ["job-1", "job-2"], "flag": True,
    }  # fmt: skip
    lines = dict(line.split(None, 1) for line in render(job, now).splitlines())
    assert lines["id"] == "job-7"
    assert lines["result"] == '{"url": "s3://x"}'
    assert lines["submitted_at"].endswith("(10 min 0 s ago)")
    assert lines["finished_at"].endswith("(5.0 s ago)")
    assert lines["not_before"] == "-"
    assert lines["estimate"] == "30.0 s"
    assert lines["ids"] == "job-1, job-2"
    assert lines["flag"] == "true"
    # A group's answer carries the broker's time: "ago" counts from it, not from this host.
    group = {"group": "film", "forecast_finish": now + 90, "now": now, "gpu_seconds": 0.0}
    lines = dict(line.split(None, 1) for line in render(group, now + 3600).splitlines())
    assert lines["forecast_finish"].endswith("(in 1 min 30 s)")
    assert lines["gpu_seconds"] == "0 ms"
    assert render([1, 2], now) == "[\n  1,\n  2\n]"


def test_jobs_get_prints_json_or_for_a_person_and_a_terminal_gets_the_latter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with _broker(tmp_path, "sqlite") as proc:
        base = ["jobs", "--broker", proc.url, "--key", "sk-alice"]
        assert main([*base, "submit", "--payload", "1", "--estimate", "90", "--group", "film"]) == 0
        job_id = json.loads(capsys.readouterr().out)["id"]
        assert main([*base, "get", job_id]) == 0  # not a terminal: JSON
        raw = json.loads(capsys.readouterr().out)
        assert isinstance(raw["submitted_at"], float)
        assert main([*base, "get", job_id, "--human"]) == 0
        human = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
        stamp = human["submitted_at"].split(" ", 1)[0]
        assert datetime.datetime.fromisoformat(stamp).timestamp() == int(raw["submitted_at"])
        assert human["submitted_at"].endswith(("ago)", "(now)"))
        assert human["finished_at"] == "-"
        monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
        assert main([*base, "get", job_id]) == 0  # a terminal: for a person
        assert "submitted_at " in capsys.readouterr().out
        assert main([*base, "get", job_id, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["id"] == job_id
        assert main([*base, "group", "film", "--human"]) == 0
        assert "forecast_seconds" in capsys.readouterr().out


class _Recorder:
    def __init__(self) -> None:
        self.clock = time.monotonic

    def _finish(self, job: Job, op: str, extra: dict[str, Any]) -> None:
        job.finished = True


def test_the_worker_logs_one_line_per_job_and_no_http_requests(
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = {
        "id": "job-9", "payload": None, "image": None, "model": None, "attempt": 2,
        "lease_seconds": 60.0, "deadline": time.time() + 60,
    }  # fmt: skip
    job = Job(_Recorder(), data)
    with caplog.at_level(logging.INFO):
        outcome = run_command(["sh", "-c", "exit 4"], job, worker="w", result_max_bytes=64)
    assert outcome == "failed (exit status 4)"
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(lines) == 1
    assert lines[0].startswith("job-9 attempt 2: failed (exit status 4) in ")
    try:
        configure_logging("info", verbose=False)
        assert logging.getLogger("httpx").getEffectiveLevel() == logging.WARNING
        assert logging.getLogger("httpcore").getEffectiveLevel() == logging.WARNING
        configure_logging("info", verbose=True)
        assert logging.getLogger("httpx").level == logging.NOTSET
    finally:
        logging.getLogger("httpx").setLevel(logging.NOTSET)
        logging.getLogger("httpcore").setLevel(logging.NOTSET)
