"""``GET /v1/dashboard`` and ``GET /ui`` on the broker (issue 19), in memory.

What each kind of key sees, the job panel, the bounds on the lists and the static page.
The page itself runs in a browser in tests/ui/test_ui_browser.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from prioqueue.ui import model as _model

from .broker_helpers import BOB, KEYS, SUBMITTER, WORKER, Api, api, run

OPS = {"Authorization": "Bearer sk-ops"}
ROOT = {"Authorization": "Bearer sk-root"}
DASH_KEYS = {
    **KEYS,
    "sk-ops": {"role": "submitter", "member": "ops", "observer": True},
    "sk-root": {"role": "submitter", "member": "root", "admin": True},
}


async def _seed(a: Api) -> dict[str, str]:
    ids = {
        "a1": await a.submit(model="m1", group="film", estimate=10.0, priority=5),
        "a2": await a.submit(model="m1", group="film", estimate=10.0),
        "a3": await a.submit(model="m1", group="film", estimate=10.0),
        "b1": await a.submit(BOB, model="m2", group="film", estimate=10.0),
        "b2": await a.submit(BOB, model="m2", estimate=10.0),
    }
    r = await a.pop("gpu-1")
    assert r.json()["id"] == ids["a1"]
    r = await a.pop("gpu-2", models=["m2"], slots=2)
    assert r.json()["id"] == ids["b1"]
    r = await a.pop("gpu-2", models=["m2"], slots=2)
    assert r.json()["id"] == ids["b2"]
    return ids


def _on_seeded(check: Callable[[Api, dict[str, str]], Awaitable[None]]) -> None:
    """Run ``check(a, ids)`` on a broker with the dashboard keys and ``_seed``'s jobs."""

    async def main() -> None:
        async with api(keys=DASH_KEYS) as a:
            await check(a, await _seed(a))

    run(main())


async def _dash(a: Api, headers: dict[str, str], **params: str) -> dict[str, Any]:
    r = await a.client.get("/v1/dashboard", headers=headers, params=params)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def _ids(data: dict[str, Any]) -> set[str]:
    found = {j["id"] for lane in data["lanes"] for j in lane["jobs"] if "id" in j}
    for worker in data["workers"]:
        found.update(j["id"] for j in [worker["running"], *worker["prefetched"]] if j and "id" in j)
    return found


def test_an_observer_sees_every_member() -> None:
    async def check(a: Api, ids: dict[str, str]) -> None:
        data = await _dash(a, OPS)
        assert data["scope"] == "all"
        assert (data["queued"], data["running"]) == (2, 3)
        assert {(lane["member"], lane["level"]) for lane in data["lanes"]} == {
            ("alice", 5), ("alice", 0), ("bob", 0),
        }  # fmt: skip
        assert _ids(data) == set(ids.values())
        gpu2 = next(w for w in data["workers"] if w["name"] == "gpu-2")
        assert gpu2["running"]["id"] == ids["b1"]
        assert [j["id"] for j in gpu2["prefetched"]] == [ids["b2"]]
        assert gpu2["running"]["lease_remaining"] == pytest.approx(900.0)
        assert gpu2["models"] == ["m2"]
        assert [s["to"] for s in gpu2["swaps"]] == ["m2"]  # its first grant loaded m2
        films = {(g["member"], g["group"]): g for g in data["groups"]}
        assert set(films) == {("alice", "film"), ("bob", "film")}
        assert films["alice", "film"]["running"] == 1
        assert films["alice", "film"]["queued"] == 2
        assert films["alice", "film"]["forecast_in"] is not None
        assert not films["bob", "film"]["can_cancel"]  # an observer reads, never cancels
        levels = [level["level"] for level in data["levels"]]
        assert levels == [5, 0]
        # The policy's names of the levels (its aliases), for the page to show beside them.
        assert data["level_names"] == {"100": "interactive", "0": "normal", "-100": "batch"}
        assert set(data["levels"][0]["reorders"]) >= {"aging", "affinity", "tier"}
        root = await _dash(a, ROOT)
        assert all(g["can_cancel"] for g in root["groups"] if g["running"] + g["queued"])

    _on_seeded(check)


def test_a_submitter_sees_only_its_own_member() -> None:
    async def check(a: Api, ids: dict[str, str]) -> None:
        data = await _dash(a, BOB)
        assert data["scope"] == "member"
        assert {lane["member"] for lane in data["lanes"]} == {"bob"}
        assert [(g["member"], g["group"]) for g in data["groups"]] == [("bob", "film")]
        assert _ids(data) == {ids["b1"], ids["b2"]}
        gpu1 = next(w for w in data["workers"] if w["name"] == "gpu-1")
        assert gpu1["running"] == {"hidden": True, "priority": 5}
        assert all(w["resident"] is None and w["swaps"] == [] for w in data["workers"])
        assert "alice" not in str(data)
        # The job panel: its own job, explained; another member's is unknown.
        mine = await _dash(a, BOB, job=ids["b1"])
        assert mine["job"]["state"] == "running"
        assert mine["job"]["explain"]["state"] == "running"
        theirs = await _dash(a, BOB, job=ids["a2"])
        assert theirs["job"] == {"id": ids["a2"], "error": f"no job {ids['a2']!r}"}

    _on_seeded(check)


def test_the_job_panel_explains_and_hides_others() -> None:
    async def check(a: Api, ids: dict[str, str]) -> None:
        late = await a.submit(BOB, model="m1", estimate=10.0)
        panel = (await _dash(a, BOB, job=late))["job"]
        explained = panel["explain"]
        assert panel["state"] == "queued"
        assert explained["position"] == len(explained["ahead"]) + 1 == 3
        assert explained["score"]["band"] == 0
        assert explained["score"]["tier_bonus"] == 0  # bob has no tier bonus
        # alice's jobs ahead of it, without their ids or member
        assert explained["ahead"] == [
            {"hidden": True, "priority": 0, "score": e["score"], "start_in": e["start_in"]}
            for e in explained["ahead"]
        ]
        assert explained["forecast_start_in"] is not None
        seen = (await _dash(a, OPS, job=late))["job"]["explain"]
        assert [e["id"] for e in seen["ahead"]] == [ids["a2"], ids["a3"]]
        done = (await _dash(a, WORKER, job=late))["job"]
        assert "error" in done

    _on_seeded(check)


def test_a_worker_key_sees_only_the_held_jobs() -> None:
    async def check(a: Api, ids: dict[str, str]) -> None:
        data = await _dash(a, WORKER)
        assert data["scope"] == "worker"
        assert (data["lanes"], data["groups"]) == ([], [])
        assert _ids(data) == {ids["a1"], ids["b1"], ids["b2"]}
        assert "alice" not in str(data)
        assert "bob" not in str(data)

    _on_seeded(check)


def test_the_dashboard_needs_a_key() -> None:
    async def main() -> None:
        async with api() as a:
            r = await a.client.get("/v1/dashboard")
            assert r.status_code == 401
            r = await a.client.get("/v1/dashboard", headers={"Authorization": "Bearer nope"})
            assert r.status_code == 401
            r = await a.client.get("/v1/dashboard", headers=SUBMITTER, params={"job": ""})
            assert r.status_code == 422

    run(main())


def test_the_page_is_static_and_locked_down() -> None:
    async def main() -> None:
        async with api() as a:
            await a.submit(model="m1")
            r = await a.client.get("/ui")
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/html")
            assert "script-src 'self'" in r.headers["content-security-policy"]
            assert 'data-endpoint="/v1/dashboard"' in r.text
            assert 'src="/ui/app.js"' in r.text
            assert "alice" not in r.text
            js = await a.client.get("/ui/app.js")
            assert js.headers["content-type"].startswith("text/javascript")
            assert "innerHTML" not in js.text.replace("never innerHTML", "")
            assert "localStorage" not in js.text
            assert "document.cookie" not in js.text
            assert (await a.client.get("/ui/app.css")).status_code == 200
            assert (await a.client.get("/ui/secret.txt")).status_code == 404
            assert (await a.client.get("/ui/__init__.py")).status_code == 404

    run(main())


def test_lanes_list_a_bounded_number_of_jobs() -> None:
    async def main() -> None:
        async with api() as a:
            for _ in range(_model.LANE_HEADS + 7):
                await a.submit(model="m1")
            data = await _dash(a, SUBMITTER)
            (lane,) = data["lanes"]
            assert lane["queued"] == _model.LANE_HEADS + 7
            assert len(lane["jobs"]) == _model.LANE_HEADS
            assert [j["id"] for j in lane["jobs"]] == [
                f"job-{i}" for i in range(1, _model.LANE_HEADS + 1)
            ]

    run(main())


def test_recent_grants_per_minute_and_waits_over_the_window() -> None:
    async def main() -> None:
        async with api() as a:
            first = await _dash(a, SUBMITTER)
            assert first["levels"] == []
            for _ in range(4):
                await a.submit(model="m1")
            a.clock.advance(20.0)
            await _dash(a, SUBMITTER)  # a sample, 20 s after the start
            for n in range(4):
                r = await a.pop("gpu-1")
                body = r.json()
                await a.finish(body["id"], "gpu-1", body["attempt"])
                if n == 1:
                    a.clock.advance(100.0)
            a.clock.advance(30.0)
            (level,) = (await _dash(a, SUBMITTER))["levels"]
            assert level["window_seconds"] == pytest.approx(150.0)  # since the first poll
            assert level["recent_grants"] == 4
            assert level["grants_per_minute"] == pytest.approx(4 * 60 / 150.0, abs=1e-3)
            assert level["wait_p50"] == 30.0  # two waited 20 s: the (15, 30] bucket
            assert level["wait_p95"] == 120.0  # two waited 120 s
            assert level["oldest_wait"] == 0.0

    run(main())


def test_recent_forgets_samples_when_the_counters_go_back() -> None:
    recent = _model.Recent(window=60.0, every=10.0)
    from prioqueue.fleet import FleetDispatcher

    d = FleetDispatcher()
    d.join("w", now=0.0)
    d.submit("j1", member="m", now=0.0)
    recent.levels(d.stats(now=0.0), 0.0)
    d.pop("w", now=5.0)
    (row,) = recent.levels(d.stats(now=5.0), 15.0)
    assert row["window_seconds"] == 15.0
    assert row["recent_grants"] == 1
    fresh = FleetDispatcher()
    fresh.join("w", now=20.0)
    fresh.submit("j2", member="m", now=20.0)
    (row,) = recent.levels(fresh.stats(now=20.0), 20.0)
    assert row["window_seconds"] is None  # a restart: the samples are gone
    assert row["wait_p50"] is None
    (row,) = recent.levels(fresh.stats(now=20.0), 200.0)
    assert row["window_seconds"] == 180.0


def test_quantile_of_the_open_bucket_and_split_group() -> None:
    bounds = [1.0, 5.0, float("inf")]
    assert _model._quantile(bounds, [0, 0, 4], 0.5) == (5.0, True)
    assert _model._quantile(bounds, [4, 4, 4], 0.95) == (1.0, False)
    assert _model._quantile(bounds, [0, 0, 0], 0.5) == (None, False)
    assert _model.split_group("5:alice/film/1") == ("alice", "film/1")
    assert _model.split_group("3:a:b/") == ("a:b", "")
    for bad in ("film", "x:alice/film", "9:alice/film", "5:aliceXfilm"):
        assert _model.split_group(bad) is None


def test_a_group_past_the_forecast_horizon_has_no_forecast(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_model, "FORECAST_LIMIT", 3)

    async def main() -> None:
        async with api() as a:
            for _ in range(3):
                await a.submit(model="m1", estimate=10.0, group="near")
            for _ in range(2):
                await a.submit(model="m1", estimate=10.0, group="far")
            await a.submit(model="m1", group="unknown-runtime", priority=5)
            await a.pop("gpu-1")  # the runtime of the grouped job ahead is unknown
            groups = {g["group"]: g for g in (await _dash(a, SUBMITTER))["groups"]}
            assert groups["far"]["forecast_beyond"]
            assert groups["far"]["forecast_in"] is None
            assert not groups["near"]["forecast_beyond"]
            assert groups["unknown-runtime"]["forecast_in"] is None

    run(main())


def test_groups_are_listed_up_to_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_model, "GROUP_LIMIT", 2)

    async def main() -> None:
        async with api() as a:
            for label in ("c", "a", "b"):
                await a.submit(model="m1", group=label)
            r = await a.client.delete("/v1/groups/a", headers=SUBMITTER)
            assert r.status_code == 200
            groups = (await _dash(a, SUBMITTER))["groups"]
            assert [g["group"] for g in groups] == ["b", "c"]  # active first, then by label

    run(main())


def test_the_page_files_are_named_by_service() -> None:
    from prioqueue.ui import asset

    found = asset("index.html", service="gateway", base="/prioqueue/ui")
    assert found is not None
    assert b'data-endpoint="/prioqueue/dashboard"' in found[0]
    assert b"__" not in found[0]  # every placeholder filled
    with pytest.raises(ValueError, match="service must be 'broker' or 'gateway'"):
        asset("", service="worker", base="/ui")


def test_a_new_reorder_cause_reaches_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """``deferred_crossings`` (the policy branch) shows up as soon as the core counts it."""
    from prioqueue.records import Reorders

    plain = Reorders.as_dict
    monkeypatch.setattr(Reorders, "as_dict", lambda self: {**plain(self), "deferred_crossings": 3})

    async def main() -> None:
        async with api() as a:
            await a.submit(model="m1")
            (level,) = (await _dash(a, SUBMITTER))["levels"]
            assert level["reorders"]["deferred_crossings"] == 3
            assert list(level["reorders"])[:4] == ["aging", "affinity", "tier", "fair_share"]

    run(main())


def test_the_level_names_are_the_policys_aliases() -> None:
    async def main() -> None:
        policy = {"aliases": {"urgent": 50, "asap": 50, "bulk": -20}}
        async with api(keys=DASH_KEYS, policy=policy) as a:
            await a.submit(priority="urgent")
            data = await _dash(a, OPS)
            names = data["level_names"]
            assert (names["50"], names["-20"]) == ("urgent", "bulk")  # urgent: the first of two
            assert names["100"] == "interactive"  # the built-in aliases stay
            assert [level["level"] for level in data["levels"]] == [50]

    run(main())


def test_a_finished_shot_counts_its_gpu_time() -> None:
    """GPU time is what the finished attempts held the GPU (the clock is moved by hand)."""

    async def main() -> None:
        async with api(keys=DASH_KEYS) as a:
            shots = [await a.submit(model="m1", group="film", estimate=10.0) for _ in range(2)]
            granted = (await a.pop("gpu-1")).json()
            assert granted["id"] == shots[0]
            a.clock.advance(42.5)
            assert (await a.finish(shots[0], "gpu-1", granted["attempt"])).status_code == 200
            (film,) = (await _dash(a, OPS))["groups"]
            assert (film["done"], film["queued"]) == (1, 1)
            assert film["gpu_seconds"] == 42.5
            assert film["mean_runtime"] == 42.5

    run(main())
