"""The gateway's dashboard: the page at ``/prioqueue/ui`` and ``GET /prioqueue/dashboard``.

The page in a browser is tested in tests/ui/test_ui_browser.py.
"""

from __future__ import annotations

import asyncio

import httpx

from prioqueue.gateway import Gateway, parse_config
from prioqueue.gateway.fake_upstream import FakeLlamaSwap, ServerThread

from .gateway_helpers import CHAT, StackFactory, as_key, chat, hold_as, keyed_config, wait_for


def test_the_page_needs_no_key_and_the_endpoint_does(make_stack: StackFactory) -> None:
    stack = make_stack(keyed_config())
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        page = client.get("/prioqueue/ui")
        assert page.status_code == 200
        assert 'data-endpoint="/prioqueue/dashboard"' in page.text
        assert 'src="/prioqueue/ui/app.js"' in page.text
        assert "default-src 'none'" in page.headers["content-security-policy"]
        assert client.get("/prioqueue/ui/app.js").status_code == 200
        assert client.get("/prioqueue/ui/../ui/app.css").status_code == 200
        assert client.get("/prioqueue/ui/nope.txt").status_code == 404
        assert client.get("/prioqueue/dashboard").status_code == 401
        r = client.get("/prioqueue/dashboard", headers=as_key("k-alice"), params={"job": "x" * 201})
        assert r.status_code == 400
        assert client.post("/prioqueue/dashboard", headers=as_key("k-alice")).status_code == 405
    assert stack.fake.served == []  # nothing of it reached the upstream


def test_one_upstream_observer_and_submitter_views(make_stack: StackFactory) -> None:
    stack = make_stack(keyed_config(estimate_seconds=5.0))
    gateway = stack.gateway

    async def main() -> None:
        async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
            first = await hold_as(client, stack, "k-alice", "film")
            rest = [
                asyncio.ensure_future(client.post(CHAT, json=chat(), headers=as_key(key, group)))
                for key, group in (("k-alice", "film"), ("k-bob", None))
            ]
            await wait_for(lambda: len(gateway.dispatcher) == 2)
            seen = (await client.get("/prioqueue/dashboard", headers=as_key("k-watch"))).json()
            assert seen["service"] == "gateway"
            assert seen["scope"] == "all"
            assert seen["level_names"] == {"100": "interactive", "0": "normal", "-100": "batch"}
            (upstream,) = seen["workers"]
            assert upstream["name"] == "upstream"
            assert upstream["resident"] == "model-a"
            assert upstream["running"]["member"] == "alice"
            assert {lane["member"] for lane in seen["lanes"]} == {"alice", "bob"}
            (film,) = seen["groups"]
            assert (film["group"], film["running"], film["queued"]) == ("film", 1, 1)
            assert film["forecast_in"] is not None
            bob = (await client.get("/prioqueue/dashboard", headers=as_key("k-bob"))).json()
            assert bob["scope"] == "member"
            assert {lane["member"] for lane in bob["lanes"]} == {"bob"}
            assert bob["groups"] == []
            assert bob["workers"][0]["running"] == {"hidden": True, "priority": 0}
            assert bob["workers"][0]["resident"] is None
            assert "alice" not in str(bob)
            # The job panel: a live job explained; another member's unknown.
            alice = (await client.get("/prioqueue/dashboard", headers=as_key("k-alice"))).json()
            waiting = [j["id"] for lane in alice["lanes"] for j in lane["jobs"]]
            waiting = [i for i in waiting if i != upstream["running"]["id"]]
            panel = (
                await client.get(
                    "/prioqueue/dashboard", headers=as_key("k-alice"), params={"job": waiting[0]}
                )
            ).json()["job"]
            assert panel["state"] == "queued"
            explained = panel["explain"]
            assert explained["position"] == len(explained["ahead"]) + 1
            assert all(e.get("hidden") for e in explained["ahead"])  # bob's, fair share first
            running = upstream["running"]["id"]
            refused = (
                await client.get(
                    "/prioqueue/dashboard", headers=as_key("k-bob"), params={"job": running}
                )
            ).json()["job"]
            assert "not queued, running or remembered" in refused["error"]
            stack.fake.release("go")
            await asyncio.gather(first, *rest)
            done = (
                await client.get(
                    "/prioqueue/dashboard", headers=as_key("k-alice"), params={"job": running}
                )
            ).json()
            assert done["job"]["state"] == "done"
            assert done["job"]["explain"] is None
            (level,) = done["levels"]
            assert level["dispatched"] == 3

    asyncio.run(main())


def test_a_fleet_shows_each_upstream_and_its_health() -> None:
    fake = FakeLlamaSwap()
    up = ServerThread(fake).start()
    config = {
        "allow_anonymous": True,
        "anonymous_observer": True,
        "upstreams": [{"name": "gpu-a", "url": up.url}, {"name": "gpu-b", "url": up.url}],
    }
    gateway = Gateway(parse_config(config))
    server = ServerThread(gateway, limits=gateway.config.limits).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.post(CHAT, json=chat()).status_code == 200
            gateway.take_out(gateway.upstreams["gpu-b"], "test: unplugged")
            data = client.get("/prioqueue/dashboard").json()
    finally:
        server.stop()
        up.stop()
    rows = {row["name"]: row for row in data["workers"]}
    assert list(rows) == ["gpu-a", "gpu-b"]
    assert not rows["gpu-a"]["unhealthy"]
    assert rows["gpu-b"]["unhealthy"]
    assert rows["gpu-b"]["last_error"] == "test: unplugged"
    swaps = [s["to"] for row in rows.values() for s in row["swaps"]]
    assert swaps == ["model-a"]
