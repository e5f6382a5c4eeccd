"""The fleet simulator: workers, the engine's invariants, the pull baselines, warm holds."""

from __future__ import annotations

import itertools
import json
import math
import signal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sim_helpers import written

from prioqueue.cli import main
from prioqueue.dispatcher import OVERDUE_SLACK
from prioqueue.errors import ConfigError
from prioqueue.sim import build, build_report, parse_spec, simulate
from prioqueue.sim.engine import CANCELLED, DONE, FAILED, PENDING, QUEUED, RUNNING, RunResult
from prioqueue.sim.fleet_policies import DEFAULT_FLEET_POLICIES, FleetFifo
from prioqueue.sim.workers import WorkerSpec, fleet_of, parse_workers
from prioqueue.sim.workload import Arrival, Workload

POLICIES = (*DEFAULT_FLEET_POLICIES, "prioqueue:warm_hold=10", "no-fair-share")


# --------------------------------------------------------------------------- workers


def test_worker_count_and_file(tmp_path: Path) -> None:
    assert [w.name for w in parse_workers("3")] == ["gpu-0", "gpu-1", "gpu-2"]
    path = written(
        tmp_path / "fleet.toml",
        '[[workers]]\nname = "big"\nspeed = 2.0\nslots = 2\nresident = "video"\n'
        '[[workers]]\nmodels = ["image", "llm"]\n',
    )
    big, small = parse_workers(str(path))
    assert big == WorkerSpec("big", None, 2, 2.0, "video")
    assert small == WorkerSpec("gpu-1", frozenset({"image", "llm"}), 1, 1.0, None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[workers]]\nslots = 0\n", "slots must be an integer in [1, 64]"),
        ("[[workers]]\nspeed = 0\n", "speed must be a number > 0"),
        ("[[workers]]\nspeed = true\n", "speed must be a number > 0"),
        ('[[workers]]\ncolour = "red"\n', "unknown keys ['colour']"),
        ('[[workers]]\nname = "a"\n[[workers]]\nname = "a"\n', "given twice: a"),
        ('[[workers]]\nmodels = ["x"]\nresident = "y"\n', "resident 'y' is not one of"),
        ('[[workers]]\nmodels = "x"\n', "models must be a non-empty list"),
        ("workers = 3\n", "expected one or more [[workers]] tables"),
        ("[[workers]\n", "invalid TOML"),
    ],
)
def test_bad_worker_files(tmp_path: Path, text: str, message: str) -> None:
    path = written(tmp_path / "fleet.toml", text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse_workers(str(path))


def test_worker_specs_built_in_python_are_checked() -> None:
    with pytest.raises(ConfigError, match="slots must be"):
        WorkerSpec("a", slots=0)
    with pytest.raises(ConfigError, match="speed must be"):
        WorkerSpec("a", speed=math.nan)
    with pytest.raises(ConfigError, match="name must be"):
        WorkerSpec(" ")
    with pytest.raises(ConfigError, match="is not one of its models"):
        WorkerSpec("a", models=frozenset({"x"}), resident="y")


@pytest.mark.parametrize("spec", ["0", "2000", "no-such-file.toml", ""])
def test_bad_worker_counts(spec: str) -> None:
    with pytest.raises(ConfigError, match="--workers"):
        parse_workers(spec)


def test_simulate_rejects_bad_fleets() -> None:
    workload = build("two-films", shots=2)
    spec = parse_spec("fifo")
    with pytest.raises(ConfigError, match="unique names"):
        simulate(workload, spec, workers=[WorkerSpec("a"), WorkerSpec("a")])
    with pytest.raises(ValueError, match="poll must be"):
        simulate(workload, spec, workers=2, poll=-1.0)
    with pytest.raises(ConfigError, match="a count must be"):
        simulate(workload, spec, workers=0)
    from prioqueue.sim.fleet_engine import simulate_fleet

    with pytest.raises(ConfigError, match="non-empty"):
        simulate_fleet(workload, spec, [])
    with pytest.raises(ValueError, match="lease_factor"):
        simulate_fleet(workload, spec, fleet_of(2), lease_factor=0.5)
    with pytest.raises(ValueError, match="horizon"):
        simulate_fleet(workload, spec, fleet_of(2), horizon=math.inf)


# --------------------------------------------------------------------------- invariants


def check_fleet_run(result: RunResult, fleet: list[WorkerSpec]) -> None:
    """Every job accounted for once; no worker runs two jobs at once; models respected."""
    arrivals = result.workload.arrivals
    n = len(arrivals)
    terminal = {DONE, CANCELLED, FAILED}
    if result.horizon is None:
        assert all(s in terminal for s in result.status)
    else:
        assert all(s in terminal | {QUEUED, RUNNING, PENDING} for s in result.status)
    by_worker: dict[int, list[tuple[float, float, int]]] = {}
    runs_of: dict[int, int] = {}
    for k, j, start, end in result.runs:
        assert end >= start
        by_worker.setdefault(k, []).append((start, end, j))
        runs_of[j] = runs_of.get(j, 0) + 1
        served = fleet[k].models
        assert served is None or arrivals[j].model is None or arrivals[j].model in served
    for intervals in by_worker.values():
        intervals.sort()
        for (_, end, _), (start, _, _) in itertools.pairwise(intervals):
            assert start >= end - 1e-9, "a worker ran two jobs at once"
    expired: dict[int, int] = {}
    for j, _, _, _ in result.retries:
        expired[j] = expired.get(j, 0) + 1
    for j in range(n):
        status = result.status[j]
        if status == DONE:
            k = result.worker_of[j]
            speed = fleet[k].speed
            took = result.end[j] - result.start[j]
            want = result.load[j] + arrivals[j].duration / speed
            assert math.isclose(took, want, rel_tol=1e-9, abs_tol=1e-6)
            assert result.end[j] >= result.submitted[j] >= arrivals[j].arrival
        if status in terminal:
            assert not math.isnan(result.end[j])
        if status == FAILED:
            assert expired.get(j, 0) >= 1
    assert sum(w.swaps for w in result.workers) == result.swaps
    assert math.isclose(
        sum(w.load_seconds for w in result.workers), result.load_seconds, abs_tol=1e-6
    )
    assert len(result.runs) == sum(w.jobs for w in result.workers)
    clock = result.clock_end
    for w in result.workers:
        assert 0 <= w.busy_seconds <= clock + 1e-6


MODELS = ("a", "b", "c", None)


@st.composite
def fleets_and_workloads(draw: st.DrawFn) -> tuple[Workload, list[WorkerSpec], float]:
    size = draw(st.integers(1, 4))
    fleet = []
    for k in range(size):
        served = draw(st.one_of(st.none(), st.sets(st.sampled_from(MODELS[:3]), min_size=1)))
        fleet.append(
            WorkerSpec(
                f"w{k}",
                None if k == 0 else (frozenset(served) if served else None),
                draw(st.integers(1, 2)),
                draw(st.sampled_from((0.5, 1.0, 2.0))),
                None,
            )
        )
    jobs = []
    t = 0.0
    for _ in range(draw(st.integers(1, 25))):
        t += draw(st.sampled_from((0.0, 1.0, 7.5, 30.0)))
        jobs.append(
            Arrival(
                arrival=t,
                member=draw(st.sampled_from(("x", "y", "z"))),
                priority=draw(st.sampled_from((-100, 0, 100))),
                tier=draw(st.sampled_from(("free", "pro"))),
                model=draw(st.sampled_from(MODELS)),
                duration=draw(st.sampled_from((1.0, 10.0, 45.0))),
                estimate=draw(st.sampled_from((None, 10.0))),
                cancel_after=draw(st.sampled_from((None, None, 5.0, 40.0))),
                hangs=draw(st.sampled_from((0, 0, 0, 1, 3))),
                group=draw(st.sampled_from((None, "film"))),
            )
        )
    chains = draw(st.sampled_from(({}, {"film": 1}, {"film": 2})))
    workload = Workload("random", jobs, load_seconds={"a": 5.0, "b": 20.0, "c": 3.0}, chains=chains)
    return workload, fleet, draw(st.sampled_from((0.0, 5.0)))


@settings(max_examples=60)
@given(case=fleets_and_workloads(), policy=st.sampled_from(POLICIES), cut=st.booleans())
def test_every_job_is_accounted_for_and_workers_run_one_at_a_time(
    case: tuple[Workload, list[WorkerSpec], float], policy: str, cut: bool
) -> None:
    workload, fleet, poll = case
    horizon = workload.arrivals[-1].arrival / 2 if cut else None
    result = simulate(workload, parse_spec(policy), workers=fleet, poll=poll, horizon=horizon)
    check_fleet_run(result, fleet)
    # a chain never has more than its depth submitted and unfinished at once
    depth = workload.chains.get("film")
    if depth is not None:
        film = [j for j, a in enumerate(workload.arrivals) if a.group == "film"]
        for j in film:
            t = result.submitted[j]
            if math.isnan(t):
                continue
            open_ = [
                k
                for k in film
                if result.submitted[k] <= t and not (result.end[k] <= t)  # NaN end: open
            ]
            assert len(open_) <= depth


@pytest.mark.parametrize("policy", DEFAULT_FLEET_POLICIES)
def test_runs_are_deterministic_per_seed(policy: str) -> None:
    spec = parse_spec(policy)
    first = simulate(build("fleet-night", seed=3, hours=2.0, shots=10), spec)
    again = simulate(build("fleet-night", seed=3, hours=2.0, shots=10), spec)
    other = simulate(build("fleet-night", seed=4, hours=2.0, shots=10), spec)
    assert (first.start, first.end, first.worker_of, first.runs) == (
        again.start,
        again.end,
        again.worker_of,
        again.runs,
    )
    assert first.start != other.start
    check_fleet_run(first, list(fleet_of(4)))


def test_fleet_night_runs_on_four_workers_and_reports_each() -> None:
    workload = build("fleet-night", hours=2.0, shots=10)
    assert workload.workers == 4
    result = simulate(workload, parse_spec("prioqueue"))
    report = build_report(workload, [result])
    workers = report["policies"]["prioqueue"]["workers"]
    assert list(workers) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert sum(w["swaps"] for w in workers.values()) == result.swaps
    assert all(0 < w["utilisation"] <= 1 for w in workers.values())
    assert {"film-ana", "film-ben"} <= set(report["policies"]["prioqueue"]["groups"])


def test_speed_divides_the_warm_runtime_not_the_load() -> None:
    workload = Workload(
        "one", [Arrival(0.0, "m", 0, model="x", duration=60.0)], load_seconds={"x": 10.0}
    )
    result = simulate(workload, parse_spec("fifo"), workers=[WorkerSpec("fast", speed=3.0)])
    assert result.end == [30.0]  # 10 s load + 60 s / 3


def test_prefetch_slot_holds_a_second_job() -> None:
    jobs = [Arrival(0.0, "m", 0, model="x", duration=10.0) for _ in range(3)]
    workload = Workload("three", jobs, load_seconds={"x": 0.0})
    result = simulate(workload, parse_spec("prioqueue"), workers=[WorkerSpec("w", slots=2)])
    assert result.start == [0.0, 10.0, 20.0]
    assert result.end == [10.0, 20.0, 30.0]


# --------------------------------------------------------------------------- baselines


def test_fifo_pull_starts_jobs_in_submission_order() -> None:
    workload = build("fleet-night", seed=2, hours=2.0, shots=20, cancel_fraction=0.0)
    result = simulate(workload, parse_spec("fifo"))
    starts = [result.start[j] for j in range(len(workload.arrivals))]
    assert starts == sorted(starts)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_warm_first_swaps_less_than_global_fifo_on_fleet_night(seed: int) -> None:
    workload = build("fleet-night", seed=seed)
    fifo = simulate(workload, parse_spec("fifo"))
    warm = simulate(workload, parse_spec("warm-first"))
    assert warm.swaps < 0.75 * fifo.swaps


def test_warm_first_takes_the_oldest_job_for_the_resident_model() -> None:
    queue = FleetFifo([WorkerSpec("w", resident="b")])
    from prioqueue.sim.fleet_policies import WarmFirst

    warm = WarmFirst([WorkerSpec("w", resident="b")])
    for q in (queue, warm):
        q.submit("1", member="m", priority=0, model="a", now=0.0)
        q.submit("2", member="m", priority=0, model="b", now=1.0)
    fifo_grant = queue.pop("w", now=2.0)
    warm_grant = warm.pop("w", now=2.0)
    assert fifo_grant is not None
    assert fifo_grant.job.id == "1"
    assert warm_grant is not None
    assert warm_grant.job.id == "2"


def test_strict_starves_batch_under_overload_and_prioqueue_fewer() -> None:
    workload = build("overload", seed=1, load=2.2)  # 110 % of two workers
    reports = {}
    for policy in ("strict", "prioqueue", "prioqueue:crossing_share=1"):
        result = simulate(workload, parse_spec(policy), workers=2, horizon=workload.horizon)
        reports[policy] = build_report(workload, [result])["summary"]["policies"][policy]
    assert reports["strict"]["batch_starved"] > 10
    # Issue 17: crossings take at most their share of the interactive level's time, so batch
    # gets that share, not the fleet: fewer batch jobs starve than under strict, and
    # interactive stays near strict's (without the limit, aged work took the fleet).
    assert reports["prioqueue"]["batch_starved"] < reports["strict"]["batch_starved"]
    assert reports["prioqueue:crossing_share=1"]["batch_starved"] == 0
    longest = max(a.duration + workload.load_time(a.model) for a in workload.arrivals)
    assert reports["prioqueue"]["interactive_p99"] <= reports["strict"]["interactive_p99"] + longest
    # Without the limit interactive waits about an hour (57 min since the overdue rule of
    # docs/design/dispatcher.md; 1 h before): far beyond strict's p99 plus the longest job.
    unlimited = reports["prioqueue:crossing_share=1"]["interactive_p99"]
    assert unlimited > 5 * (reports["strict"]["interactive_p99"] + longest)


def test_the_verdict_uses_the_n_worker_bound() -> None:
    workload = build("two-films", shots=12, offset=0.0)
    fleet = [WorkerSpec("a", slots=2), WorkerSpec("b"), WorkerSpec("c")]
    result = simulate(workload, parse_spec("prioqueue"), workers=fleet)
    report = build_report(workload, [result])
    row = report["policies"]["prioqueue"]["levels"]["-100"]
    params = report["policies"]["prioqueue"]["params"]
    largest = max(result.end[j] - result.start[j] for j in range(len(workload.arrivals)))
    offsets = (0.0 + params["max_affinity"]) * params["aging_divisor"]  # one tier (pro)
    # Theorem 2 of docs/design/fleet.md (issue 17): N (k Δ + (T + A) d) + 10 K C, Δ with every
    # tier counted (2 + 10 points).
    slack = OVERDUE_SLACK * (2 + params["max_affinity"]) * params["aging_divisor"]
    bound = 3 * (slack + offsets) + 10 * 4 * largest
    assert row["gap_bound"] == pytest.approx(bound, abs=1e-3)
    assert row["service_gap"] <= row["gap_bound"]


# --------------------------------------------------------------------------- warm holds


def _warm_case(hold: float) -> RunResult:
    workload = Workload("warm", [Arrival(0.5, "m", 0, model="x", duration=5.0)], {"x": 30.0})
    fleet = [WorkerSpec("warm", resident="x"), WorkerSpec("cold-1"), WorkerSpec("cold-2")]
    return simulate(workload, parse_spec(f"prioqueue:warm_hold={hold}"), workers=fleet, poll=10.0)


def test_a_warm_hold_waits_for_the_warm_worker_to_poll() -> None:
    off, short, long = _warm_case(0), _warm_case(5), _warm_case(15)
    assert (off.worker_of, off.swaps) == ([1], 1)  # the first cold worker to poll
    assert (short.worker_of, short.swaps) == ([2], 1)  # held 5 s, then the next cold one
    assert (long.worker_of, long.swaps, long.start) == ([0], 0, [10.0])  # the warm one


def test_polling_workers_take_work_only_at_their_ticks() -> None:
    jobs = [Arrival(7.0, "m", 0, duration=5.0), Arrival(30.0, "m", 0, duration=5.0)]
    result = simulate(Workload("poll", jobs), parse_spec("fifo"), workers=2, poll=10.0)
    assert result.start == [10.0, 30.0]  # gpu-0 ticks at 0, 10, 20, 30
    assert result.worker_of == [0, 0]


def test_warm_hold_reduces_swaps_on_fleet_night() -> None:
    workload = build("fleet-night", seed=1)
    off = simulate(workload, parse_spec("prioqueue:warm_hold=0"), poll=10.0)
    held = simulate(workload, parse_spec("prioqueue:warm_hold=15"), poll=10.0)
    default = simulate(workload, parse_spec("prioqueue"), poll=10.0)  # warm_hold=60
    assert default.swaps < held.swaps < off.swaps


SWAP_CASES = [
    pytest.param("fleet-night", "prioqueue"),
    pytest.param("fleet-night", "prioqueue:crossing_share=1", id="fleet-night-placement-only"),
    pytest.param("overload", "prioqueue"),
]


@pytest.mark.parametrize(("scenario", "policy"), SWAP_CASES)
def test_placement_swaps_no_more_than_the_baselines_allow(scenario: str, policy: str) -> None:
    """Issue 26's swap check (issue 17 item 2's, amended): with 4 workers, prioqueue swaps at
    most strict's and at most 1.25x the fewest swaps of a baseline that itself keeps the
    interactive p99 within strict's plus the longest job (warm-first does not on fleet-night:
    2.8 h); its own interactive p99 stays within that bound, and the warm hold saves swaps."""
    for seed in (1, 2):  # docs/simulator.md has seeds 1-5; the tests keep two
        workload = build(scenario, seed=seed)
        unheld = f"{policy},warm_hold=0" if ":" in policy else f"{policy}:warm_hold=0"
        kinds = ("fifo", "strict", "warm-first", policy, unheld)
        runs = {kind: simulate(workload, parse_spec(kind), workers=4) for kind in kinds}
        report = build_report(workload, list(runs.values()))["summary"]["policies"]
        longest = max(a.duration + workload.load_time(a.model) for a in workload.arrivals)
        bound = report["strict"]["interactive_p99"] + longest
        fewest = min(
            runs[kind].swaps
            for kind in ("fifo", "strict", "warm-first")
            if report[kind]["interactive_p99"] <= bound
        )
        assert runs[policy].swaps <= runs["strict"].swaps
        assert runs[policy].swaps <= 1.25 * fewest
        assert report[policy]["interactive_p99"] <= bound
        if scenario == "fleet-night":  # the warm hold is what keeps the swaps down there
            assert runs[unheld].swaps > 1.5 * runs[policy].swaps


# --------------------------------------------------------------------------- command line


def test_cli_workers_and_poll(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--scenario", "two-films", "--param", "shots=6", "--json", "-"]
    assert main([*args, "--workers", "2", "--poll", "5"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["policies"]) == list(DEFAULT_FLEET_POLICIES)
    for section in report["policies"].values():
        assert list(section["workers"]) == ["gpu-0", "gpu-1"]
    path = written(tmp_path / "fleet.toml", '[[workers]]\nname = "solo"\nspeed = 2.0\n')
    assert main([*args, "--workers", str(path), "--policy", "warm-first"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["policies"]["warm-first"]["workers"]) == ["solo"]


def test_config_file_workers_and_poll(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = written(
        tmp_path / "sim.toml",
        'scenario = "two-films"\npoll = 5\npolicies = ["warm-first"]\n[params]\nshots = 4\n'
        '[[workers]]\nname = "x"\n[[workers]]\nname = "y"\nslots = 2\n',
    )
    assert main(["simulate", "--config", str(path), "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert list(report["policies"]["warm-first"]["workers"]) == ["x", "y"]
    path.write_text('scenario = "two-films"\nworkers = 3\npoll = -1\n', encoding="utf-8")
    assert main(["simulate", "--config", str(path)]) == 2
    assert "--poll must be" in capsys.readouterr().err


def test_cli_warm_hold_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--scenario", "fleet-night", "--param", "hours=2", "--param", "shots=10"]
    assert (
        main([*args, "--sweep", "warm_hold=0,15", "--seeds", "2", "--poll", "10", "--json", "-"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["key"] == "warm_hold"
    assert [row["value"] for row in out["values"]] == ["0", "15"]
    assert out["workers"] == 4
    assert out["poll"] == 10.0
    swaps = [row["figures"]["swaps"]["median"] for row in out["values"]]
    assert swaps[1] <= swaps[0]


def test_plain_report_shows_workers_and_groups(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--scenario", "fleet-night", "--param", "hours=1", "--param", "shots=4"]
    assert main([*args, "--plain", "--no-progress"]) == 0
    out = capsys.readouterr().out
    for text in ("Workers", "utilisation", "Groups (films)", "film-ana", "2*N*(T + A)*d + 10*K*C"):
        assert text in out


def test_one_gpu_warm_first() -> None:
    workload = build("swap-storm", hours=1.0)
    fifo = simulate(workload, parse_spec("fifo"))
    warm = simulate(workload, parse_spec("warm-first"))
    assert all(s in (DONE, CANCELLED) for s in warm.status)
    assert warm.swaps < fifo.swaps


# --------------------------------------------------------------------------- chains


def test_chain_feed_submits_what_a_real_chain_submits() -> None:
    from prioqueue import SizeOneDispatcher
    from prioqueue.chain import Chain
    from prioqueue.sim.groups import ChainFeed

    for depth in (1, 2, 3):
        jobs = [Arrival(0.0, "d", -100, duration=10.0, group="film") for _ in range(7)]
        feed = ChainFeed(Workload("film", jobs, chains={"film": depth}))
        gpu = SizeOneDispatcher()
        specs = [{"job_id": str(k), "member": "d", "priority": -100} for k in range(7)]
        chain = Chain(gpu, specs, depth=depth, group="film")
        real = [[t.job.id for t in chain.start(now=0.0).submitted]]
        ours = [[str(k) for j in range(7) for k in feed.arrive(j)]]
        now = 0.0
        while len(gpu):
            grant = gpu.dispatch(now)
            assert grant is not None
            now += 10.0
            gpu.complete(grant.job.id, now=now)
            real.append([t.job.id for t in chain.completed(grant.job.id, now=now).submitted])
            ours.append([str(k) for k in feed.left(int(grant.job.id))])
        assert ours == real


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_a_chained_film_is_submitted_as_shots_leave(depth: int) -> None:
    workload = build("film-night", shots=12, hours=1.0, film_depth=depth, cancel_fraction=0.0)
    assert workload.chains == ({"film": depth} if depth else {})
    result = simulate(workload, parse_spec("prioqueue"))
    film = [j for j, a in enumerate(workload.arrivals) if a.group == "film"]
    submitted = sorted(result.submitted[j] for j in film)
    ends = sorted(result.end[j] for j in film)
    if depth == 0:
        assert submitted == [0.0] * len(film)
    else:
        assert submitted == [0.0] * depth + ends[: len(film) - depth]
    report = build_report(workload, [result])["policies"]["prioqueue"]["groups"]["film"]
    assert report["finish"] == pytest.approx(ends[-1], abs=1e-3)
    assert report["depth"] == (depth or None)


@pytest.mark.parametrize("depth", [0, 1])
def test_the_forecast_is_exact_when_estimates_are_and_nothing_else_arrives(depth: int) -> None:
    jobs = [
        Arrival(0.0, "d", -100, duration=30.0 + k, estimate=30.0 + k, group="film")
        for k in range(20)
    ]
    chains = {"film": depth} if depth else {}
    workload = Workload("film", jobs, chains=chains)
    result = simulate(workload, parse_spec("prioqueue"))
    forecast = build_report(workload, [result])["policies"]["prioqueue"]["groups"]["film"][
        "forecast"
    ]
    assert len(forecast["points"]) == 10  # the start and each tenth done
    assert forecast["max_abs_error"] == pytest.approx(0.0, abs=1e-6)


def test_forecasts_are_early_by_the_crowd_that_arrives_later() -> None:
    workload = build("film-night", shots=40, hours=4.0)
    result = simulate(workload, parse_spec("prioqueue"))
    forecast = build_report(workload, [result])["policies"]["prioqueue"]["groups"]["film"][
        "forecast"
    ]
    errors = [p["error"] for p in forecast["points"]]
    assert errors[0] < -600  # the crowd's work that arrives later is not foreseen
    assert abs(errors[-1]) < abs(errors[0])
    baseline = simulate(workload, parse_spec("strict"))
    assert baseline.forecasts == {}  # baselines have no groups


def test_fleet_charts_draw_one_timeline_row_per_worker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    from prioqueue.sim.plot import _rows

    workload = build("fleet-night", hours=1.0, shots=4)
    result = simulate(workload, parse_spec("prioqueue"))
    rows = _rows(result)
    assert [label for label, _ in rows] == [f"prioqueue gpu-{k}" for k in range(4)]
    assert sum(len(spans) for _, spans in rows) == len(result.runs)
    args = ["simulate", "--scenario", "fleet-night", "--param", "hours=1", "--param", "shots=4"]
    assert main([*args, "--plot", str(tmp_path), "--plain", "--no-progress"]) == 0
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "service_gap.png",
        "timeline.png",
        "waits.png",
    ]


def test_a_poll_tick_rounded_onto_now_moves_on() -> None:
    # Worker 2 of 3 polling every 5 s ticks at 10/3 + 5 m; at m = 3 the float sum is
    # 18.333333333333332 and (now - phase) / poll rounds to 2.9999999999999996, so its next
    # tick came out equal to now: a free worker that can run nothing queued then held the
    # clock at 18.33 s for ever (found by the property test above).
    fleet = [
        WorkerSpec("w0", None, 1, 1.0, None),
        WorkerSpec("w1", frozenset({"b"}), 1, 1.0, None),
        WorkerSpec("w2", frozenset({"a"}), 1, 1.0, None),
    ]
    jobs = [
        Arrival(0.0, "x", 0, model="b", duration=100.0),
        Arrival(0.0, "x", 0, model="b", duration=100.0),
        Arrival(1.0, "y", 0, model="b", duration=1.0),
    ]
    workload = Workload("tick", jobs, load_seconds={"a": 1.0, "b": 1.0})

    def hung(*_: object) -> None:
        raise TimeoutError("the engine stopped advancing its clock")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        result = simulate(workload, parse_spec("fifo"), workers=fleet, poll=5.0)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert result.status == [DONE, DONE, DONE]
    assert result.start[2] >= 101.0  # it waited for w0 or w1
