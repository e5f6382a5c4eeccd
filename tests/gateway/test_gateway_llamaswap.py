"""The gateway against llama-swap's own behaviour, reproduced by the fake (issue 27).

Each case here is one that the gateway once got wrong in front of the real llama-swap; the
same cases run against the real binary in ``tests/gateway/real``. Here they run in a second
against :class:`~prioqueue.gateway.fake_upstream.FakeLlamaSwap`, which answers as llama-swap
does: several ``/running`` entries (a persistent group), the loading-state stream, 301 on a
bare ``/upstream/<model>``, ``apiKeys``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from prioqueue import ConfigError
from prioqueue.gateway import Gateway, parse_config
from prioqueue.gateway._loaded import Loaded, loaded_models
from prioqueue.gateway.fake_upstream import FakeLlamaSwap, ServerThread

from .gateway_helpers import CHAT, KEYS, as_key, chat, run, wait_for

MODELS = ("embed", "llama", "qwen")


@pytest.fixture
def front() -> Iterator[Any]:
    """``front(fake_options, config, fleet=False) -> (fake, gateway, url)``."""
    servers: list[ServerThread] = []

    def make(
        fake_options: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        *,
        fleet: bool = False,
    ) -> tuple[FakeLlamaSwap, Gateway, str]:
        fake = FakeLlamaSwap(models=MODELS, **(fake_options or {}))
        up = ServerThread(fake).start()
        servers.append(up)
        data: dict[str, Any] = {"allow_anonymous": False, "keys": KEYS, **(config or {})}
        if fleet:
            key = data.pop("upstream_api_key", None)
            entry: dict[str, Any] = {"url": up.url, "name": "gpu0"}
            if key is not None:
                entry["upstream_api_key"] = key
            data["upstreams"] = [entry]
            gateway = Gateway(parse_config(data))
        else:
            gateway = Gateway(parse_config(data, upstream=up.url))
        gw = ServerThread(gateway, limits=gateway.config.limits).start()
        servers.append(gw)
        return fake, gateway, gw.url

    yield make
    for server in reversed(servers):
        server.stop()


ROOT = as_key("k-root")
ALICE = as_key("k-alice")


async def _serve(url: str, models: list[str]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        for model in models:
            response = await client.post(CHAT, json=chat(model), headers=ALICE)
            assert response.status_code == 200, response.text


# -- 1. several models loaded at once ---------------------------------------------------------


def test_loaded_tracks_a_persistent_model_beside_the_swapped_one() -> None:
    loaded = Loaded()
    assert loaded.polled(["embed", "qwen"]) in {"embed", "qwen"}
    assert not loaded.granted("qwen")
    assert not loaded.granted("embed")
    assert loaded.granted("llama")
    assert loaded.polled(["embed", "llama"]) == "llama"
    assert loaded.sticky == {"embed"}  # it stayed through a swap: a persistent group
    assert not loaded.granted("embed")
    assert loaded.primary == "llama"  # an embedding beside it does not displace the chat model
    assert loaded.granted("qwen")
    assert loaded.models == {"embed", "qwen"}
    assert loaded.swaps == 2
    assert loaded_models({"running": [{"model": "a", "state": "stopping"}, {"model": "b"}]}) == [
        "b"
    ]
    assert loaded_models({"error": "unauthorized"}) is None


@pytest.mark.parametrize("fleet", [False, True], ids=["single", "fleet"])
def test_swaps_counted_equal_the_loads_with_a_persistent_group(front: Any, fleet: bool) -> None:
    fake, _gateway, url = front(
        {"persistent": ("embed",)},
        {"resident": {"poll_seconds": 0.05}, "health_seconds": 0.05},
        fleet=fleet,
    )
    mixed = ["qwen", "embed", "qwen", "qwen", "llama", "embed", "llama", "embed", "qwen", "embed"]

    async def main() -> dict[str, Any]:
        await _serve(url, mixed)
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            return dict((await client.get("/prioqueue/status", headers=ROOT)).json())

    status = run(main())
    assert fake.loads == 4  # qwen, embed, llama, qwen: embed stays loaded
    swaps = status["fleet"][0]["swaps"] if fleet else status["swaps"]
    assert swaps == fake.loads
    loaded = status["fleet"][0]["loaded_models"] if fleet else status["upstream"]["loaded_models"]
    assert set(loaded) == {"embed", "qwen"}


def test_resident_is_the_swapped_model_not_the_first_listed(front: Any) -> None:
    _fake, gateway, url = front({"persistent": ("embed",)}, {"resident": {"poll_seconds": 0.05}})

    async def main() -> None:
        await _serve(url, ["embed", "qwen"])
        await wait_for(lambda: gateway.loaded.models == {"embed", "qwen"})

    run(main())
    assert gateway.dispatcher.resident_model == "qwen"  # "embed" sorts first in /running


# -- 2, 3. /upstream/<model>/ ------------------------------------------------------------------


def test_upstream_route_takes_its_model_from_the_path(front: Any) -> None:
    fake, gateway, url = front()

    async def main() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            ignored = await client.post(
                "/upstream/llama/v1/chat/completions", json=chat("ignored"), headers=ALICE
            )
            empty = await client.post(
                "/upstream/llama/v1/chat/completions", json=chat(""), headers=ALICE
            )
            bare = await client.get("/upstream/llama", headers=ALICE)
            return ignored, empty, bare

    ignored, empty, bare = run(main())
    assert ignored.status_code == 200, ignored.text
    assert empty.status_code == 200, empty.text
    job = gateway.explain(ignored.headers["x-prioqueue-job"])
    assert job["model"] == "llama"
    assert [s.model for s in fake.served] == ["llama", "llama"]
    assert bare.status_code == 301
    assert bare.headers["location"] == "/upstream/llama/"


# -- 4. llama-swap's UI: Basic and X-API-Key -------------------------------------------------


def test_llama_swap_ui_keys_basic_and_x_api_key(front: Any) -> None:
    _fake, _gateway, url = front()
    basic = "Basic " + base64.b64encode(b"anyone:k-root").decode()

    async def main() -> dict[str, httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            return {
                "ui_anonymous": await client.get("/ui/"),
                "status_anonymous": await client.get("/prioqueue/status"),
                "basic": await client.get("/echo", headers={"authorization": basic}),
                "api_basic": await client.get("/api/events", headers={"authorization": basic}),
                "x_api_key": await client.get("/echo", headers={"x-api-key": "k-root"}),
                "api_member": await client.get("/api/events", headers={"x-api-key": "k-alice"}),
            }

    got = run(main())
    assert got["ui_anonymous"].status_code == 401
    assert 'Basic realm="prioqueue"' in got["ui_anonymous"].headers.get_list("www-authenticate")
    # No Basic challenge on the dashboard's own paths (a browser would pop up a dialog).
    challenges = got["status_anonymous"].headers.get_list("www-authenticate")
    assert not any(c.startswith("Basic") for c in challenges)
    assert got["basic"].status_code == 200
    assert got["api_basic"].status_code == 404  # through to llama-swap (the fake has no UI)
    assert got["x_api_key"].status_code == 200
    assert got["api_member"].status_code == 403
    for name in ("basic", "x_api_key"):  # the gateway key never reaches the upstream
        headers = got[name].json()["headers"]
        assert "authorization" not in headers
        assert "x-api-key" not in headers


# -- 5. an upstream 5xx: 502 with a one-line reason --------------------------------------------


def test_upstream_5xx_is_a_502_with_a_one_line_reason_and_no_breaker_failure(front: Any) -> None:
    _fake, gateway, url = front(config={"limits": {"breaker_failures": 2}})

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            body = chat("qwen", status=500)
            return [await client.post(CHAT, json=body, headers=ALICE) for _ in range(3)]

    answers = run(main())
    for response in answers:
        assert response.status_code == 502
        assert response.headers["x-prioqueue-upstream-status"] == "500"
        message = response.json()["error"]["message"]
        assert message == "the upstream answered 500: fake error 500"
    assert gateway.breaker.state == "closed"  # a 5xx is the request's error, not an outage


# -- 6. sendLoadingState -----------------------------------------------------------------------


def test_loading_state_is_not_the_first_byte(front: Any) -> None:
    _fake, gateway, url = front({"send_loading_state": True, "load_seconds": 0.4})

    async def main() -> bytes:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            body = {**chat("qwen"), "stream": True}
            response = await client.post(CHAT, json=body, headers=ALICE)
            assert response.status_code == 200
            return response.content

    content = run(main())
    assert b"llama-swap loading model: qwen" in content
    assert b"tok0" in content
    assert gateway.http_stats.latency_sum >= 0.35  # the load, not the loading text's 1 ms


def test_a_stuck_load_behind_the_loading_state_hits_first_byte_timeout(front: Any) -> None:
    _fake, gateway, url = front(
        {"send_loading_state": True, "load_seconds": 3.0, "aborts": True},
        {"limits": {"first_byte_timeout": 0.5, "breaker_failures": 5}},
    )

    async def main() -> bytes:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            body = {**chat("qwen"), "stream": True}
            response = await client.post(CHAT, json=body, headers=ALICE)
            return response.content

    content = run(main())
    assert b"llama-swap loading model" in content
    assert content.rstrip().endswith(b"}")
    last = content.rstrip().split(b"\n\n")[-1]
    assert last.startswith(b"event: error")
    assert json.loads(last.split(b"data: ", 1)[1])["error"]["type"] == "upstream_timeout"
    # Counted once the handler is past the stream's end (the client may see the end first).
    run(wait_for(lambda: gateway.breaker.consecutive == 1))


# -- 7. upstream_api_key on the gateway's own polls --------------------------------------------


def test_polls_carry_the_upstream_key_and_a_wrong_key_is_shown(front: Any) -> None:
    fake, gateway, url = front(
        {"api_keys": ("sk-up",)},
        {"upstream_api_key": "sk-up", "resident": {"poll_seconds": 0.05}},
    )

    async def main() -> None:
        await _serve(url, ["qwen"])
        await wait_for(lambda: fake.running_polls >= 3)
        assert gateway.poll_error is None
        assert gateway.loaded.models == {"qwen"}

    run(main())
    assert fake.refused == 0


def test_a_wrong_upstream_key_keeps_the_loaded_model_and_says_why(front: Any) -> None:
    fake, _gateway, url = front(
        {"api_keys": ("sk-up",)},
        {"upstream_api_key": "sk-wrong", "resident": {"poll_seconds": 0.05}},
    )

    async def main() -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            await wait_for(lambda: fake.refused >= 2)
            return dict((await client.get("/prioqueue/status", headers=ROOT)).json())

    status = run(main())
    assert "401" in status["upstream"]["poll_error"]
    assert "upstream_api_key" in status["upstream"]["poll_error"]


@pytest.mark.parametrize("key", ["sk-up", "sk-wrong"])
def test_upstreams_with_api_keys_come_up_or_say_why(front: Any, key: str) -> None:
    _fake, _gateway, url = front(
        {"api_keys": ("sk-up",)}, {"upstream_api_key": key, "health_seconds": 0.05}, fleet=True
    )

    async def main() -> tuple[httpx.Response, dict[str, Any]]:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            answer = await client.post(CHAT, json=chat("qwen"), headers=ALICE)
            status = (await client.get("/prioqueue/status", headers=ROOT)).json()
            return answer, status

    answer, status = run(main())
    upstream = status["fleet"][0]
    if key == "sk-up":
        assert answer.status_code == 200
        assert upstream["state"] == "up"
    else:
        assert answer.status_code == 503
        assert upstream["state"] == "down"
        assert "401" in upstream["last_error"]
        assert "upstream_api_key" in upstream["last_error"]
        assert "401" in answer.json()["error"]["message"]


# -- the notes: /running, llama-swap's /metrics ------------------------------------------------


def test_running_is_for_observers_and_upstream_metrics_for_admins(front: Any) -> None:
    _fake, _gateway, url = front({"api_keys": ("sk-up",)}, {"upstream_api_key": "sk-up"})

    async def main() -> dict[str, httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            await client.post(CHAT, json=chat("qwen"), headers=ALICE)
            return {
                "running_member": await client.get("/running", headers=ALICE),
                "running_observer": await client.get("/running", headers=as_key("k-watch")),
                "metrics_observer": await client.get(
                    "/prioqueue/upstream-metrics", headers=as_key("k-watch")
                ),
                "metrics_admin": await client.get("/prioqueue/upstream-metrics", headers=ROOT),
            }

    got = run(main())
    assert got["running_member"].status_code == 403
    assert got["running_observer"].status_code == 200
    assert got["running_observer"].json()["running"][0]["model"] == "qwen"
    assert got["metrics_observer"].status_code == 403
    assert got["metrics_admin"].status_code == 200
    assert "llamaswap_loads_total 1" in got["metrics_admin"].text


# -- configuration -----------------------------------------------------------------------------


def test_configuration_of_keys_persistent_models_and_observer_paths() -> None:
    config = parse_config(
        {
            "upstream_api_key": "sk-top",
            "resident": {"persistent": ["embed"]},
            "observer_paths": ["/running", "/api/metrics/*"],
            "upstreams": [
                {"url": "http://127.0.0.1:1", "name": "a"},
                {"url": "http://127.0.0.1:2", "name": "b", "upstream_api_key": "sk-b"},
            ],
        }
    )
    assert [u.api_key for u in config.upstreams] == ["sk-top", "sk-b"]
    assert config.poll_headers(config.upstreams[1]) == {"authorization": "Bearer sk-b"}
    assert "sk-b" not in repr(config.upstreams[1])  # keys stay out of logs
    assert config.resident_persistent == {"embed"}
    assert config.is_observer_path("/api/metrics/activity")
    assert parse_config({}).poll_headers() == {}
    with pytest.raises(ConfigError, match=r"persistent.*array of model names"):
        parse_config({"resident": {"persistent": "embed"}})


def test_upstream_metrics_names_an_upstream_of_a_fleet(front: Any) -> None:
    fake, _gateway, url = front(fleet=True)

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            path = "/prioqueue/upstream-metrics"
            return [
                await client.get(path + "?upstream=gpu0", headers=ROOT),
                await client.get(path + "?upstream=nope", headers=ROOT),
                await client.post(path, headers=ROOT),
            ]

    named, unknown, posted = run(main())
    assert named.status_code == 200
    assert "llamaswap_requests_total" in named.text
    assert unknown.status_code == 404
    assert "known: gpu0" in unknown.json()["error"]["message"]
    assert posted.status_code == 405
    assert fake.refused == 0
