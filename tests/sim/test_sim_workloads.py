from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from prioqueue.errors import ConfigError
from prioqueue.sim import scenarios, traces
from prioqueue.sim.workload import Arrival, Workload

AZURE_DIR = Path(
    os.environ.get("PRIOQUEUE_TRACES", Path(__file__).resolve().parents[3] / "shared" / "traces")
)


@pytest.mark.parametrize("name", list(scenarios.SCENARIOS))
def test_scenarios_are_seeded_and_sorted(name: str) -> None:
    defaults = scenarios.SCENARIOS[name].defaults
    small: dict[str, float] = {"shots": 10} if "shots" in defaults else {}
    if "hours" in defaults:
        small["hours"] = 1.0
    assert set(defaults) <= set(scenarios.UNITS)  # --list-scenarios shows every unit
    first = scenarios.build(name, seed=3, **small)
    again = scenarios.build(name, seed=3, **small)
    other = scenarios.build(name, seed=4, **small)
    assert first.arrivals == again.arrivals
    assert first.arrivals != other.arrivals
    times = [a.arrival for a in first.arrivals]
    assert times == sorted(times)
    assert first.params["seed"] == 3


def test_film_night_shape() -> None:
    workload = scenarios.build()
    film = [a for a in workload.arrivals if a.member == "director"]
    assert len(film) == 174
    assert {a.priority for a in film} == {-100}
    assert all(a.arrival == 0 for a in film)
    assert {a.model for a in workload.arrivals} == {"image", "video", "llm"}
    assert {a.tier for a in workload.arrivals} == {"free", "pro", "max"}
    assert {a.priority for a in workload.arrivals} == {100, 0, -100}
    videos = [a for a in workload.arrivals if a.priority == 100 and a.model == "video"]
    assert all(240 <= a.duration <= 960 for a in videos)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"nope": 1}, "has no parameter 'nope'"),
        ({"shots": "many"}, "must be an integer"),
        ({"hours": "x"}, "must be a number"),
        ({"hours": -1}, "must be >= 0"),
        ({"cancel_fraction": 2}, "within [0, 1]"),
    ],
)
def test_scenario_parameter_errors(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        scenarios.build("film-night", **overrides)  # type: ignore[arg-type]


def test_unknown_scenario() -> None:
    with pytest.raises(ConfigError, match="unknown scenario"):
        scenarios.build("nope")


def test_workload_helpers() -> None:
    empty = Workload("x", [])
    assert empty.span() == 0
    assert empty.load_time(None) == 0
    assert empty.load_time("m") == 0


CSV = """arrival,member,priority,tier,model,duration,estimate,cancel_after,extra
10,alice,interactive,pro,image,20,25,,ignored
12.5,bob,-100,free,,240,,,
11,carol,,max,video,300,,60,
"""


def test_read_csv_trace(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(CSV)
    workload = traces.read_trace(path, default_load=7)
    jobs = workload.arrivals
    assert [a.member for a in jobs] == ["alice", "carol", "bob"]
    assert jobs[0] == Arrival(0.0, "alice", 100, "pro", "image", 20.0, 25.0)
    assert jobs[1].priority == 0
    assert jobs[1].cancel_after == 60
    assert jobs[2].model is None
    assert jobs[2].estimate is None
    assert workload.load_time("video") == 7


def test_jsonl_round_trip(tmp_path: Path) -> None:
    workload = scenarios.build("overload", hours=0.5)
    path = tmp_path / "t.jsonl"
    with path.open("w") as handle:
        assert traces.write_trace(workload, handle) == len(workload.arrivals)
    again = traces.read_trace(path)
    # The header's origin (0) keeps the times as written: no shift to the first arrival.
    assert again.arrivals == workload.arrivals
    assert again.horizon == workload.horizon == 8 * 3600  # the default horizon, in the header


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "arrival,member,duration\n1,a,x\n",
            r"t\.csv:2: column 'duration' \(#3\): expected a number",
        ),
        ("arrival,member,duration\n1,a,5\n-1,b,5\n", r"t\.csv:3: column 'arrival' \(#1\).*>= 0"),
        ("arrival,member,duration\n1,,5\n", r"t\.csv:2: column 'member' \(#2\): missing value"),
        ("arrival,member,duration\n1,a\n", r"t\.csv:2: expected 3 fields, got 2"),
        ("arrival,member\n1,a\n", r"t\.csv:1: column 'duration': missing"),
        ("", r"t\.csv:1: empty file"),
        ("arrival,member,duration,priority\n1,a,5,urgent\n", r"t\.csv:2: column 'priority' \(#4\)"),
        ("arrival,member,duration,estimate\n1,a,5,0\n", r"column 'estimate' \(#4\).*> 0"),
        ("arrival,member,duration\n1,a,inf\n", r"column 'duration' \(#3\).*finite"),
        ("arrival,member,duration\n\n", r"t\.csv:1: the trace has no jobs"),
    ],
)
def test_bad_csv_rows(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(traces.TraceError, match=message):
        traces.read_trace(path)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", r"t\.jsonl:2: invalid JSON"),
        ("[1, 2]", r"t\.jsonl:2: expected a JSON object"),
        ('{"arrival": true, "member": "a", "duration": 1}', r"column 'arrival': expected a number"),
        (
            '{"arrival": 1, "member": 5, "duration": 1}',
            r"t\.jsonl:2: column 'member': expected a string",
        ),
        ('{"arrival": 1, "member": "a", "duration": 1, "priority": 1.5}', "column 'priority'"),
    ],
)
def test_bad_jsonl_rows(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival": 0, "member": "a", "duration": 1, "priority": -5}\n' + line + "\n")
    with pytest.raises(traces.TraceError, match=message):
        traces.read_trace(path)


def test_trace_format_errors(tmp_path: Path) -> None:
    path = tmp_path / "t.txt"
    path.write_text("x")
    with pytest.raises(ConfigError, match="cannot tell the trace format"):
        traces.read_trace(path)
    with pytest.raises(ConfigError, match="unknown trace format"):
        traces.read_trace(path, fmt="xml")
    good = tmp_path / "t.csv"
    good.write_text("arrival,member,duration\n0,a,1\n")
    with pytest.raises(ConfigError, match="does not apply"):
        traces.read_trace(good, params={"members": 3})


AZURE = (
    "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"
    "2023-11-16 18:15:46.6805900,374,44\r\n"
    "2023-11-16 18:15:50.9951690,396,109\r\n"
    "2023-11-16 18:15:51.2000000,100,20"
)


def test_azure_converter_is_reproducible(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_bytes(AZURE.encode())
    first = traces.read_trace(path, fmt="azure", seed=5)
    again = traces.convert_azure(path, seed=5)
    other = traces.convert_azure(path, seed=6, params={"members": 2})
    assert first.arrivals == again.arrivals
    assert first.arrivals != other.arrivals
    assert [a.duration for a in first.arrivals] == pytest.approx(
        [374 / 4000 + 44 / 40, 396 / 4000 + 109 / 40, 100 / 4000 + 20 / 40]
    )
    work = first.work_seconds()
    assert work / first.span() == pytest.approx(0.9)
    assert {a.model for a in first.arrivals} <= {"llm-small", "llm-medium", "llm-large"}
    assert "CC BY 4.0" in traces.AZURE_ATTRIBUTION


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a,b,c\r\n", "expected the header"),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\r\nyesterday,1,2",
            r"line|:2: column 'TIMESTAMP'",
        ),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.5,x,2",
            "'ContextTokens' \\(#2\\)",
        ),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.5,1", "expected 3 fields"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\r\n", "no rows"),
    ],
)
def test_azure_bad_rows(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "azure.csv"
    path.write_bytes(text.encode())
    with pytest.raises(traces.TraceError, match=message):
        traces.convert_azure(path)


def test_azure_parameter_errors(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_bytes(AZURE.encode())
    with pytest.raises(ConfigError, match="no parameter 'x'"):
        traces.convert_azure(path, params={"x": 1})
    with pytest.raises(ConfigError, match="target_load must be > 0"):
        traces.convert_azure(path, params={"target_load": 0})


@pytest.mark.skipif(
    not (AZURE_DIR / "azure-llm-2023-code.csv").exists(),
    reason="needs azure-llm-2023-code.csv in ../shared/traces or $PRIOQUEUE_TRACES: download "
    "data/AzureLLMInferenceTrace_code.csv from https://github.com/Azure/AzurePublicDataset",
)
def test_real_azure_trace() -> None:
    workload = traces.convert_azure(AZURE_DIR / "azure-llm-2023-code.csv", seed=1)
    assert len(workload.arrivals) == 8819
    assert json.dumps(dict(workload.params))  # serialisable for the report


def test_bursty_is_heavy_tailed_skewed_and_bursty() -> None:
    from collections import Counter

    from prioqueue.sim import build

    load = build("bursty", seed=3)
    again = build("bursty", seed=3)
    assert load.arrivals == again.arrivals
    assert load.workers is None
    assert build("bursty", gpus=4).workers == 4
    durations = sorted(a.duration for a in load.arrivals)
    assert durations[0] >= 4.0
    assert durations[-1] <= 960.0
    assert durations[len(durations) // 2] < 30.0 < durations[-1] / 10  # a heavy tail
    by_member = Counter(a.member for a in load.arrivals).most_common()
    assert by_member[0][1] > 4 * by_member[-1][1]  # Zipf-skewed demand
    instants = Counter(round(a.arrival / 60) for a in load.arrivals)
    assert max(instants.values()) >= 10  # a burst of at least 10 jobs within a minute
    assert sum(a.hangs for a in build("bursty", seed=3, lost_fraction=0.05).arrivals) > 0
    fewer = build("bursty", seed=3, burst_share=0.0, load=0.45)
    assert len(fewer.arrivals) < len(load.arrivals)
