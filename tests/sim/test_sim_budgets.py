"""Queue budgets (max_queued, max_wait) and ttl in the simulator (issue 17 item 4)."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_helpers import simulate_json, written

from prioqueue.cli import main
from prioqueue.errors import ConfigError
from prioqueue.lifecycle import LevelBudget
from prioqueue.sim import engine, report
from prioqueue.sim.policies import PolicyParams, parse_spec
from prioqueue.sim.render import tables
from prioqueue.sim.workload import Arrival, Workload


def _workload(*jobs: Arrival) -> Workload:
    return Workload("test", list(jobs), load_seconds={}, default_load=5.0)


def test_spec_keys_set_a_levels_budget_and_show_in_params() -> None:
    spec = parse_spec("prioqueue:max_wait.interactive=300,ttl.-100=600,max_queued.0=5")
    assert spec.params.budgets == {
        100: LevelBudget(max_wait=300.0),
        -100: LevelBudget(ttl=600.0),
        0: LevelBudget(max_queued=5),
    }
    assert spec.params.as_dict()["budgets"] == {
        "-100": {"ttl": 600.0},
        "0": {"max_queued": 5},
        "100": {"max_wait": 300.0},
    }
    assert "budgets" not in parse_spec("prioqueue").params.as_dict()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("prioqueue:max_wait.top=3", "level must be an integer"),
        ("prioqueue:max_queued.0=1.5", "max_queued must be an integer"),
        ("prioqueue:ttl.0=-1", "ttl"),
        ("prioqueue:max_wait.0=soon", "max_wait must be a number"),
    ],
)
def test_bad_budget_keys_name_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_spec(spec)


@pytest.mark.parametrize("workers", [None, 1, 2])
def test_max_queued_refuses_instead_of_queueing(workers: int | None) -> None:
    workload = _workload(*(Arrival(0, f"m{k}", 0, duration=10) for k in range(5)))
    spec = parse_spec("prioqueue:max_queued.0=2")
    result = engine.simulate(workload, spec, workers=workers)
    refused = [i for i, st in enumerate(result.status) if st == engine.REFUSED]
    done = [i for i, st in enumerate(result.status) if st == engine.DONE]
    assert len(refused) == 3
    assert len(done) == 2
    for i in refused:  # left at once, never granted
        assert math.isnan(result.start[i])
        assert result.end[i] == 0
    summary = report.summarize(result, PolicyParams())
    level = summary["levels"]["0"]
    assert (level["jobs"], level["refused"], level["completed"]) == (5, 3, 2)
    assert summary["refused"] == 3
    assert summary["ttl_expired"] == 0
    assert level["wait_max"] == (0 if workers == 2 else 10)  # the refused ones have no wait


@pytest.mark.parametrize("workers", [None, 2])
def test_ttl_expires_a_queued_job_and_never_grants_it(workers: int | None) -> None:
    jobs = [Arrival(0, "a", 0, duration=100)]
    if workers:
        jobs.append(Arrival(0, "b", 0, duration=100))
    jobs.append(Arrival(1, "c", 0, duration=10))  # deadline 51, the GPU(s) busy till 100
    workload = _workload(*jobs)
    result = engine.simulate(workload, parse_spec("prioqueue:ttl.0=50"), workers=workers)
    last = len(jobs) - 1
    assert result.status[last] == engine.EXPIRED
    assert math.isnan(result.start[last])
    assert result.end[last] == 51
    assert result.status[:last] == [engine.DONE] * last
    assert not result.retries  # a lapse is not a lease expiry
    summary = report.summarize(result, PolicyParams())
    assert summary["levels"]["0"]["ttl_expired"] == 1
    assert summary["ttl_expired"] == 1
    assert summary["expired"] == 0


def test_ttl_does_not_shorten_a_hanging_jobs_lease() -> None:
    # The lease deadline comes from the grant, not next_deadline() (which holds the ttl timer).
    workload = _workload(
        Arrival(0, "a", 100, duration=10, hangs=1),  # lease 2*10 + 5 + 1 = 26, no ttl
        Arrival(0, "b", 0, duration=10),  # deadline 5: expires while a hangs
    )
    result = engine.simulate(workload, parse_spec("prioqueue:ttl.0=5"), lease_factor=2)
    assert result.status == [engine.DONE, engine.EXPIRED]
    assert result.end[1] == 5
    assert result.retries == [(0, 0.0, 26.0, 0.0)]
    assert result.end[0] == 26 + 10


def test_a_job_requeued_past_its_deadline_expires() -> None:
    workload = _workload(Arrival(0, "a", 0, duration=10, hangs=1))
    result = engine.simulate(workload, parse_spec("prioqueue:ttl.0=5"), lease_factor=2)
    assert result.status == [engine.EXPIRED]
    assert result.end[0] == 26
    assert result.retries == [(0, 0.0, 26.0, 0.0)]


def test_max_wait_refuses_when_the_forecast_is_too_long() -> None:
    workload = _workload(*(Arrival(0, f"m{k}", 100, duration=60) for k in range(6)))
    result = engine.simulate(workload, parse_spec("prioqueue:max_wait.interactive=150"))
    # Forecast: the queued interactive jobs at 60 s each (nothing known yet) on one GPU.
    assert result.status.count(engine.REFUSED) == 3
    assert result.status.count(engine.DONE) == 3


def test_baselines_run_unprotected_and_reports_without_budgets_are_unchanged() -> None:
    workload = _workload(*(Arrival(0, f"m{k}", 0, duration=10) for k in range(3)))
    base = PolicyParams(budgets={0: LevelBudget(max_queued=1)})
    result = engine.simulate(workload, parse_spec("strict", base))
    assert result.status == [engine.DONE] * 3
    plain = report.summarize(engine.simulate(workload, parse_spec("prioqueue")), PolicyParams())
    assert "refused" not in plain
    assert "ttl_expired" not in plain
    assert "refused" not in plain["levels"]["0"]
    built = report.build_report(workload, [engine.simulate(workload, parse_spec("prioqueue"))])
    assert "Queue budgets by level" not in [t.title for t in tables(built)]


def test_cli_budget_flag_reports_refused_and_expired(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.json"
    args = ["simulate", "--scenario", "overload", "--param", "hours=1", "--no-progress"]
    code = main(
        [
            *args,
            "--plain",
            "--budget",
            "interactive:max_wait=30",
            "--budget",
            "batch:ttl=600,max_queued=3",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "Queue budgets by level" in text
    data = json.loads(out.read_text())
    pq = data["policies"]["prioqueue"]
    assert pq["params"]["budgets"] == {
        "-100": {"max_queued": 3, "ttl": 600.0},
        "100": {"max_wait": 30.0},
    }
    interactive = pq["levels"]["100"]
    assert interactive["refused"] > 0
    assert pq["refused"] == sum(row["refused"] for row in pq["levels"].values())
    assert pq["ttl_expired"] == sum(row["ttl_expired"] for row in pq["levels"].values())
    assert "refused" not in data["policies"]["strict"]  # baselines run unprotected


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("interactive", "expects LEVEL:KEY=VALUE"),
        ("top:max_wait=3", "level must be an integer"),
        ("0:soon=3", "unknown key 'soon'"),
        ("0:max_queued=2.5", "max_queued must be an integer"),
        ("0:ttl=-3", "ttl"),
    ],
)
def test_cli_bad_budget_is_a_usage_error(
    flag: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["simulate", "--scenario", "overload", "--no-progress", "--budget", flag])
    assert code == 2
    assert message in capsys.readouterr().err


_BUDGETS_QUOTE = re.compile(
    r"<!--\s*budgets-of:\s*(?P<command>[^>]*?)\s*-->\s*\n```text\n(?P<body>.*?)^```",
    re.MULTILINE | re.DOTALL,
)


def test_the_simulator_page_quotes_a_current_budget_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    page = Path(__file__).resolve().parents[2] / "docs" / "simulator.md"
    match = _BUDGETS_QUOTE.search(page.read_text(encoding="utf-8"))
    assert match is not None
    words = shlex.split(match["command"])
    assert words[:2] == ["prioqueue", "simulate"]
    assert main([*words[1:], "--plain", "--no-progress"]) == 0
    assert match["body"] in capsys.readouterr().out, "docs/simulator.md quotes an outdated run"


def test_config_file_budgets_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = written(
        tmp_path / "sim.toml",
        'scenario = "overload"\npolicies = ["prioqueue"]\nparams = {hours = 1}\n'
        "[policy.budgets.100]\nmax_wait = 30\n[policy.budgets.batch]\nmax_queued = 2\n",
    )
    data = simulate_json(tmp_path, "--config", str(config), "--no-progress")
    capsys.readouterr()
    assert data["policies"]["prioqueue"]["params"]["budgets"] == {
        "-100": {"max_queued": 2},
        "100": {"max_wait": 30.0},
    }
    assert data["policies"]["prioqueue"]["levels"]["100"]["refused"] > 0


@st.composite
def _budgeted_runs(draw: st.DrawFn) -> tuple[Workload, str, int | None]:
    jobs = draw(
        st.lists(
            st.builds(
                Arrival,
                st.integers(0, 200).map(float),
                st.sampled_from(["a", "b", "c"]),
                st.sampled_from([-100, 0, 100]),
                model=st.sampled_from([None, "x", "y"]),
                duration=st.integers(1, 60).map(float),
                hangs=st.integers(0, 1),
                cancel_after=st.none() | st.integers(1, 100).map(float),
            ),
            max_size=25,
        )
    )
    jobs.sort(key=lambda a: a.arrival)
    keys = draw(
        st.lists(
            st.sampled_from(
                ["max_queued.0=2", "max_queued.100=1", "max_wait.100=60", "ttl.0=30", "ttl.-100=5"]
            ),
            min_size=1,
            unique=True,
        )
    )
    return _workload(*jobs), "prioqueue:" + ",".join(keys), draw(st.sampled_from([None, 2]))


@settings(max_examples=60)
@given(_budgeted_runs())
def test_every_job_leaves_once_and_refused_or_expired_jobs_never_finish_a_run(
    run: tuple[Workload, str, int | None],
) -> None:
    workload, spec, workers = run
    result = engine.simulate(workload, parse_spec(spec), lease_factor=2, workers=workers)
    final = {engine.DONE, engine.CANCELLED, engine.FAILED, engine.EXPIRED, engine.REFUSED}
    assert set(result.status) <= final  # no horizon: every job left
    retried = {j for j, *_ in result.retries}
    for i, st_ in enumerate(result.status):
        if st_ in (engine.REFUSED, engine.EXPIRED):
            assert math.isnan(result.start[i])  # never granted (an expired job: not again)
        if st_ == engine.REFUSED:
            assert result.end[i] == result.submitted[i]
            assert i not in retried
    summary = report.summarize(result, PolicyParams())
    assert summary["refused"] == result.status.count(engine.REFUSED)
    assert summary["ttl_expired"] == result.status.count(engine.EXPIRED)
    for row in summary["levels"].values():
        assert row["jobs"] == (
            row["completed"]
            + row["cancelled"]
            + row["failed"]
            + row["refused"]
            + row["ttl_expired"]
        )
