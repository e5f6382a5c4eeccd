"""The verdict: its numbers are the tables' and the JSON's; sweeps are deterministic per seed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from prioqueue.cli import main
from prioqueue.errors import ConfigError
from prioqueue.sim import build, build_report, engine, parse_spec, render, sweep
from prioqueue.sim import summary as verdict
from prioqueue.sim.render import duration


def _suite(capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    assert main(["simulate", "--no-progress", "--json", "-"]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert main(["simulate", "--no-progress", "--plain"]) == 0
    return report, capsys.readouterr().out


def test_summary_equals_tables_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    report, text = _suite(capsys)
    scenarios = report["scenarios"]
    assert [s["scenario"]["name"] for s in scenarios] == ["film-night", "two-films", "overload"]
    verdict = text.split("\n\n========")[0]
    for one in scenarios:
        for label, row in one["summary"]["policies"].items():
            section = one["policies"][label]
            levels = section["levels"]
            # The summary copies the sections' numbers.
            if "100" in levels:
                assert row["interactive_p99"] == levels["100"]["wait_p99"]
            assert row["batch_worst"] == levels["-100"]["wait_max"]
            assert row["batch_unfinished"] == levels["-100"]["unfinished"]
            assert row["batch_starved"] == levels["-100"]["starved"]
            assert row["swaps"] == section["swaps"]
            fair = row["fairness"]
            level = levels[str(fair["level"])]
            assert (fair["gap"], fair["bound"]) == (level["service_gap"], level["gap_bound"])
            shares = [lv["fair_share"]["worst"] for lv in levels.values()]
            rated = [s for s in shares if s is not None]
            assert fair["worst_share"] == (min(rated) if rated else None)
            # The text shows the same numbers, in the verdict and in the tables.
            assert duration(row["batch_worst"]) in verdict
            assert f"{duration(fair['gap'])} / {duration(fair['bound'])}" in verdict
            tables = text.split(f"scenario {one['scenario']['name']},", 1)[1]
            assert duration(level["service_gap"]) in tables
        assert one["summary"]["trade_off"] in verdict


def test_default_case_is_made(capsys: pytest.CaptureFixture[str]) -> None:
    report, _ = _suite(capsys)
    by_name = {s["scenario"]["name"]: s["summary"]["policies"] for s in report["scenarios"]}
    film = by_name["film-night"]
    # Interactive close to strict, far from fifo.
    assert film["prioqueue"]["interactive_p99"] <= 1.1 * film["strict"]["interactive_p99"]
    assert film["fifo"]["interactive_p99"] > 10 * film["prioqueue"]["interactive_p99"]
    # Fairness within the bound where fifo and strict break it.
    films = by_name["two-films"]
    assert films["prioqueue"]["fairness"]["within"] is True
    assert films["strict"]["fairness"]["within"] is False
    assert films["fifo"]["fairness"]["within"] is False
    # Under overload strict starves batch jobs, prioqueue fewer (issue 17: crossings take at
    # most their share of the interactive level's time; batch gets that share).
    over = by_name["overload"]
    assert over["strict"]["batch_starved"] > 0
    assert over["prioqueue"]["batch_starved"] < over["strict"]["batch_starved"]
    for summary in by_name.values():
        assert summary["prioqueue"]["fairness"]["within"] is True


def test_trade_off_sentence_names_both_sides() -> None:
    workload = build("overload", hours=3.0, horizon=3.0, load=1.2)
    results = [
        engine.simulate(workload, parse_spec(p), horizon=workload.horizon)
        for p in ("fifo", "strict", "prioqueue")
    ]
    report = build_report(workload, results)
    sentence = report["summary"]["trade_off"]
    assert "strict" in sentence
    assert "prioqueue" in sentence
    assert "fifo" in sentence
    assert sentence.endswith(".")
    lines = render.verdict_lines(report)
    assert lines[0].startswith("Verdict")
    assert any(sentence in line for line in lines)


def test_sweep_is_deterministic_per_seed() -> None:
    def make(seed: int) -> Any:
        return build("overload", seed=seed, hours=1.5, horizon=1.5)

    first = sweep.run_sweep(make, "prioqueue", "divisor", ["30", "240"], [1, 2, 3])
    again = sweep.run_sweep(make, "prioqueue", "divisor", ["30", "240"], [1, 2, 3])
    assert first == again
    other = sweep.run_sweep(make, "prioqueue", "divisor", ["30", "240"], [4, 5, 6])
    assert other["values"] != first["values"]
    row = first["values"][0]
    p99 = [run["interactive_p99"] for run in row["per_seed"]]
    assert row["figures"]["interactive_p99"]["median"] == pytest.approx(sorted(p99)[1], abs=1e-3)
    assert row["figures"]["interactive_p99"]["min"] == pytest.approx(min(p99), abs=1e-3)
    assert first["frontier"]
    assert set(first["frontier"]) <= {"30", "240"}


def test_frontier() -> None:
    points = [("a", 1.0, 9.0), ("b", 2.0, 5.0), ("c", 3.0, 6.0), ("d", 4.0, 1.0)]
    assert sweep.frontier(points) == ["a", "b", "d"]
    # A column unknown for one point is left out for all: on the second alone, d and e tie.
    assert sweep.frontier([*points, ("e", None, 1.0)]) == ["d"]
    assert sweep.ties([*points, ("e", None, 1.0)]) == {"e": "d"}


def test_frontier_breaks_ties_visibly_and_uses_every_column() -> None:
    """Issue 17 item 5: equal values are one candidate, not all; every column counts."""
    # Equal medians on every column: the first stands for the others, which name it.
    tied = [("x", 1.0, 1.0, 0.3, 500.0), ("y", 1.0, 1.0, 0.3, 500.0), ("z", 1.0, 1.0, 0.3, 500.0)]
    assert sweep.frontier(tied) == ["x"]
    assert sweep.ties(tied) == {"y": "x", "z": "x"}
    # Equal on the two waits but fewer swaps: the value with more swaps is dominated.
    swaps = [("0", 4.6, 5.1, 0.26, 595.0), ("5", 4.6, 5.1, 0.26, 538.0)]
    assert sweep.frontier(swaps) == ["5"]
    assert sweep.ties(swaps) == {}
    # A trade-off on any column keeps both.
    trade = [("a", 1.0, 2.0, 0.5, 10.0), ("b", 1.0, 2.0, 0.4, 20.0)]
    assert sweep.frontier(trade) == ["a", "b"]


def test_sweep_table_marks_the_frontier_and_the_ties() -> None:
    def make(seed: int) -> Any:
        return build("overload", seed=seed, hours=1.0, horizon=1.0)

    # warm_hold does nothing on one GPU: every value ties, one candidate stands.
    result = sweep.run_sweep(make, "prioqueue", "warm_hold", ["0", "15", "30"], [1])
    assert result["frontier"] == ["0"]
    assert result["ties"] == {"15": "0", "30": "0"}
    text = render.render_sweep({**result, "scenario": "overload"})
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("warm_hold=")}
    assert rows["warm_hold=0"].rstrip().endswith("*")
    assert rows["warm_hold=15"].rstrip().endswith("= warm_hold=0")
    assert rows["warm_hold=30"].rstrip().endswith("= warm_hold=0")


def _row(kind: str, p99: float, *, censored: bool = False, swaps: int = 0) -> dict[str, Any]:
    return {
        "kind": kind,
        "interactive_p99": p99,
        "interactive_censored": censored,
        "batch_worst": None,
        "batch_censored": False,
        "batch_unfinished": 0,
        "batch_starved": 0,
        "unfinished": 0,
        "fairness": {"level": None, "gap": None, "bound": None, "within": None,
                     "worst_share": None},
        "swaps": swaps,
    }  # fmt: skip


def test_verdict_states_each_comparison_in_both_directions() -> None:
    """Issue 17 item 5: today's text said "within 0.0s of strict's" when strict's was 8.3 h."""
    faster = verdict.trade_off(
        {"strict": _row("strict", 8.3 * 3600), "prioqueue": _row("prioqueue", 21.8 * 60)}
    )
    assert "prioqueue is 7.9h faster than strict at interactive p99 (21.8m against 8.3h)" in (
        faster
    )
    assert "within" not in faster
    slower = verdict.trade_off(
        {"strict": _row("strict", 3.5 * 60), "prioqueue": _row("prioqueue", 63.9 * 60)}
    )
    assert "strict is 60.4m faster than prioqueue at interactive p99 (3.5m against 63.9m)" in (
        slower
    )
    close = verdict.trade_off({"strict": _row("strict", 100.0), "prioqueue": _row("p", 100.5)})
    assert "prioqueue's interactive p99 (1.7m) is within 0.5s of strict's (1.7m)" in close


def test_verdict_reads_censored_figures_as_lower_bounds() -> None:
    assert verdict.versus("interactive p99", ("p", 60.0, False), ("s", 600.0, True)) == (
        "p is at least 9.0m faster than s at interactive p99 (60.0s against >= 10.0m)"
    )
    assert verdict.versus("interactive p99", ("p", 60.0, True), ("s", 600.0, False)) == (
        "p's interactive p99 is >= 60.0s so far, s's 10.0m (jobs still queued at the horizon)"
    )


def test_verdict_counts_swaps_against_warm_first_both_ways() -> None:
    rows = {
        "warm-first": _row("warm-first", 9000.0, swaps=311),
        "prioqueue": _row("prioqueue", 300.0, swaps=305),
    }
    assert "prioqueue swaps 305 times, 6 fewer than warm-first (311)" in verdict.trade_off(rows)
    rows["prioqueue"] = _row("prioqueue", 300.0, swaps=602)
    assert "prioqueue swaps 602 times, 291 more than warm-first (311)" in verdict.trade_off(rows)
    rows["prioqueue"] = _row("prioqueue", 300.0, swaps=311)
    assert "prioqueue swaps 311 times, as many as warm-first" in verdict.trade_off(rows)


def test_sweep_cli_json_and_text(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--scenario", "overload", "--param", "hours=1", "--param", "horizon=1"]
    argv += ["--sweep", "divisor=30,120", "--seeds", "2"]
    assert main([*argv, "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["seeds"] == [1, 2]
    assert [row["value"] for row in data["values"]] == ["30", "120"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert text.startswith("Sweep of prioqueue on overload, seeds 1-2")
    for row in data["values"]:
        figure = row["figures"]["batch_worst"]
        assert duration(figure["median"]) in text


def test_horizon_flag_overrides_the_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["simulate", "--scenario", "overload", "--param", "hours=1", "--no-progress"]
    assert main([*base, "--horizon", "0.5", "--json", "-"]) == 0
    cut = json.loads(capsys.readouterr().out)
    assert cut["scenario"]["horizon"] == 1800.0
    assert cut["policies"]["strict"]["horizon"] == 1800.0
    assert main([*base, "--horizon", "0", "--json", "-"]) == 0
    drained = json.loads(capsys.readouterr().out)
    assert drained["scenario"]["horizon"] is None
    assert all(s["unfinished"] == 0 for s in drained["policies"].values())


def test_sweep_errors_and_files(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="at least one seed"):
        sweep.run_sweep(lambda seed: build("overload", seed=seed), "prioqueue", "d", ["1"], [])
    argv = ["simulate", "--scenario", "overload", "--param", "hours=1", "--param", "horizon=1"]
    argv += ["--sweep", "divisor=60", "--seeds", "1"]
    assert main([*argv, "--policy", "fifo", "--policy", "strict"]) == 2
    assert "at most one --policy" in capsys.readouterr().err
    out = tmp_path / "sweep.json"
    assert main([*argv, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["frontier"] == ["60"]
    assert capsys.readouterr().out.startswith("Sweep of prioqueue")
    assert sweep._spread([None, None]) == {"median": None, "min": None, "max": None}


def test_engine_rejects_a_bad_horizon() -> None:
    workload = build("two-films", shots=2)
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="horizon must be a finite number"):
            engine.simulate(workload, parse_spec("fifo"), horizon=bad)


def test_sweep_a_tier_bonus_and_a_model_affinity() -> None:
    spec = parse_spec("prioqueue:tier.max=5,affinity.video=3")
    assert spec.params.tier_bonuses["max"] == 5
    assert spec.params.tier_bonuses["pro"] == 1  # the others keep their defaults
    assert spec.params.affinity_by_model == {"video": 3}
    with pytest.raises(ConfigError, match=r"tier\.max must be a number"):
        parse_spec("prioqueue:tier.max=lots")
    result = sweep.run_sweep(
        lambda seed: build("overload", seed=seed, hours=1.0, horizon=1.0),
        "prioqueue",
        "tier.max",
        ["0", "8"],
        [1],
    )
    assert [row["label"] for row in result["values"]] == [
        "prioqueue:tier.max=0",
        "prioqueue:tier.max=8",
    ]
