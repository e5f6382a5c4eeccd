"""Your own traffic: the JSONL trace round trip, the Azure conversion and the recorder."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sim_helpers import synthetic_azure

from prioqueue.sim import build, build_report, engine, parse_spec, traces
from prioqueue.sim.traces import TraceRecorder
from prioqueue.sim.workload import Workload

AZURE_DIR = Path(
    os.environ.get("PRIOQUEUE_TRACES", Path(__file__).resolve().parents[3] / "shared" / "traces")
)
AZURE_HOW = (
    "needs the Azure LLM inference trace 2023 as azure-llm-2023-code.csv in ../shared/traces "
    "or in $PRIOQUEUE_TRACES: download data/AzureLLMInferenceTrace_code.csv from "
    "https://github.com/Azure/AzurePublicDataset (commit b469a113)"
)
POLICIES = ("fifo", "strict", "prioqueue")


def _policies(workload: Workload) -> dict[str, Any]:
    results = [engine.simulate(workload, parse_spec(p), horizon=workload.horizon) for p in POLICIES]
    report = build_report(workload, results)
    for section in report["policies"].values():
        section.pop("timing")
    return {"policies": report["policies"], "summary": report["summary"]}


def _round_trip(source: Path, tmp_path: Path, **kwargs: Any) -> tuple[Workload, Workload]:
    original = traces.read_trace(source, **kwargs)
    converted = tmp_path / "converted.jsonl"
    with converted.open("w", encoding="utf-8") as handle:
        traces.write_trace(original, handle)
    return original, traces.read_trace(converted)


def test_azure_conversion_round_trip_gives_identical_results(tmp_path: Path) -> None:
    source = tmp_path / "azure.csv"
    synthetic_azure(source)
    original, replayed = _round_trip(source, tmp_path, seed=4)  # auto: recognised as Azure
    assert original.params["format"] == "azure"
    assert replayed.arrivals == original.arrivals
    assert dict(replayed.load_seconds) == dict(original.load_seconds)
    assert replayed.default_load == original.default_load
    assert _policies(replayed) == _policies(original)


def test_scenario_round_trip_keeps_hangs_and_cancels(tmp_path: Path) -> None:
    workload = build("overload", hours=1.0, horizon=0.0, lost_fraction=0.05, cancel_fraction=0.05)
    assert any(a.hangs for a in workload.arrivals)
    assert any(a.cancel_after is not None for a in workload.arrivals)
    buffer = io.StringIO()
    traces.write_trace(workload, buffer)
    path = tmp_path / "overload.jsonl"
    path.write_text(buffer.getvalue())
    replayed = traces.read_trace(path)
    assert replayed.arrivals == workload.arrivals
    assert _policies(replayed) == _policies(workload)


@pytest.mark.skipif(not (AZURE_DIR / "azure-llm-2023-code.csv").exists(), reason=AZURE_HOW)
def test_real_azure_round_trip(tmp_path: Path) -> None:
    source = AZURE_DIR / "azure-llm-2023-code.csv"
    original, replayed = _round_trip(source, tmp_path, seed=1)
    assert len(original.arrivals) == 8819
    assert replayed.arrivals == original.arrivals
    assert _policies(replayed)["summary"] == _policies(original)["summary"]


def test_recorder_writes_a_replayable_trace(tmp_path: Path) -> None:
    path = tmp_path / "traffic.jsonl"
    with TraceRecorder(path, load_seconds={"image": 30.0}) as recorder:
        # Requests finish out of arrival order; arrivals on a monotonic clock.
        recorder.record(
            arrival=1000.0, member="ana", tier="pro", priority=100, model="image",
            runtime=20.0, swap=True, load=28.0, estimate=25.0,
        )  # fmt: skip
        recorder.record(
            arrival=1010.0, member="ben", priority=-100, model="video", runtime=200.0,
            swap=True, load=50.0,
        )  # fmt: skip
        recorder.record(
            arrival=1005.0, member="ben", priority=-100, model="video", runtime=100.0,
            swap=True, load=70.0, cancel_after=40.0,
        )  # fmt: skip
        recorder.record(arrival=1020.0, member="cy", priority=0, runtime=5.0)
        assert recorder.records == 4
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"prioqueue_trace": 1, "load_seconds": {"image": 30.0}}
    workload = traces.read_trace(path)
    assert [a.arrival for a in workload.arrivals] == [0.0, 5.0, 10.0, 20.0]
    assert workload.arrivals[1].cancel_after == 40.0
    assert workload.arrivals[0].estimate == 25.0
    assert workload.load_time("image") == 30.0  # the header wins over the measured 28
    assert workload.load_time("video") == 60.0  # the mean of the measured loads
    assert workload.load_time(None) == 0.0
    # Appending to an existing file writes no second header.
    with TraceRecorder(path) as again:
        again.record(arrival=1030.0, member="ana", priority=100, runtime=1.0)
    assert sum("prioqueue_trace" in line for line in path.read_text().splitlines()) == 1
    assert len(traces.read_trace(path).arrivals) == 5


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"member": ""}, ValueError, "member must be a non-empty string"),
        ({"tier": " "}, ValueError, "tier must be"),
        ({"priority": "high"}, TypeError, "priority must be an integer"),
        ({"priority": True}, TypeError, "priority must be an integer"),
        ({"runtime": -1.0}, ValueError, "runtime must be a finite number >= 0"),
        ({"arrival": float("nan")}, ValueError, "arrival must be a finite number"),
        ({"estimate": 0.0}, ValueError, "estimate must be a finite number > 0"),
        ({"swap": True}, ValueError, "swap=True needs the model"),
        ({"load": 3.0, "model": "m"}, ValueError, "pass swap=True"),
        ({"model": ""}, ValueError, "model must be a non-empty string"),
    ],
)
def test_recorder_rejects_bad_values(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    recorder = TraceRecorder(io.StringIO())
    args: dict[str, Any] = {"arrival": 0.0, "member": "a", "priority": 0, "runtime": 1.0}
    args.update(kwargs)
    with pytest.raises(error, match=message):
        recorder.record(**args)
    assert recorder.records == 0


def test_recorder_closed_and_bad_target() -> None:
    handle = io.StringIO()
    recorder = TraceRecorder(handle, default_load=12.0)
    recorder.close()
    recorder.close()  # idempotent
    assert not handle.closed  # the caller's handle stays open
    with pytest.raises(ValueError, match="closed"):
        recorder.record(arrival=0.0, member="a", priority=0, runtime=1.0)
    with pytest.raises(TypeError, match="path or a text handle"):
        TraceRecorder(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="default_load"):
        TraceRecorder(io.StringIO(), default_load=-1.0)


def test_recorder_imports_neither_rich_nor_the_engine() -> None:
    code = (
        "import sys; import prioqueue.sim.recorder; "
        "bad = [m for m in ('rich', 'matplotlib', 'prioqueue.sim.engine') if m in sys.modules]; "
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"arrival": 0, "member": "a", "duration": 1}\n{"prioqueue_trace": 1}\n', "first line"),
        ('{"prioqueue_trace": 2}\n', "unknown trace version"),
        ('{"prioqueue_trace": 1, "load_seconds": {"m": -1}}\n', "bad header"),
        ('{"arrival": 0, "member": "a", "duration": 1, "hangs": 1.5}\n', "whole number"),
    ],
)
def test_bad_headers(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(traces.TraceError, match=message):
        traces.read_trace(path)
