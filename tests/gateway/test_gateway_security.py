"""Gating by default, key roles, what is forwarded upstream: the issue's isolation probes."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from prioqueue.gateway import load_config, parse_config
from prioqueue.gateway.settings import DEFAULT_PASSTHROUGH_PATHS

from .gateway_helpers import CHAT, StackFactory, chat

ROOT = Path(__file__).resolve().parents[2]

KEYS = {
    "allow_anonymous": False,
    "anonymous_observer": False,
    "metrics_key": "sk-scrape",
    "keys": {
        "sk-alice": {"member": "alice", "max_priority": 100},
        "sk-bob": {"member": "bob"},
        "sk-watch": {"member": "ops", "observer": True},
        "sk-root": {"member": "root", "admin": True},
    },
}
ALICE = {"Authorization": "Bearer sk-alice"}
BOB = {"Authorization": "Bearer sk-bob"}
WATCH = {"Authorization": "Bearer sk-watch"}
ROOT_KEY = {"Authorization": "Bearer sk-root"}

# Routes llama-swap serves (internal/server/server.go) that load or run a model.
LLAMA_SWAP_MODEL_ROUTES = [
    ("POST", "/v1/responses"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
    ("POST", "/completion"),
    ("POST", "/infill"),
    ("POST", "/v1/rerank"),
    ("POST", "/rerank"),
    ("POST", "/reranking"),
    ("POST", "/v1/reranking"),
    ("POST", "/sdapi/v1/txt2img"),
    ("POST", "/sdapi/v1/img2img"),
    ("POST", "/v1/images/edits"),
    ("POST", "/audioapi/v1/tasks/run"),
    ("POST", "/v/chat/completions"),
    ("POST", "/comfyui/prompt"),
    ("GET", "/comfyui/"),
    ("GET", "/props"),
    ("GET", "/v1/audio/voices"),
    ("GET", "/sdapi/v1/loras"),
    ("GET", "/upstream/model-a/health"),
    ("DELETE", "/upstream/model-a/slots/0"),
]


@pytest.mark.parametrize(("method", "path"), LLAMA_SWAP_MODEL_ROUTES)
def test_every_model_route_of_llama_swap_is_gated_by_default(method: str, path: str) -> None:
    config = parse_config({})
    assert config.is_gated(method, path)


@pytest.mark.parametrize("path", ["/v1/models", "/running", "/health", "/logs", "/api/events"])
def test_read_only_and_management_routes_pass_through(path: str) -> None:
    config = parse_config({})
    assert not config.is_gated("GET", path)
    assert not config.is_gated("POST", path)  # listed in passthrough_paths


def test_gated_requests_through_the_server(make_stack: StackFactory) -> None:
    stack = make_stack()
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        for path in ("/v1/responses", "/completion", "/sdapi/v1/txt2img"):
            response = client.post(path, json=chat())
            assert "x-prioqueue-job" in response.headers, path
        upstream = client.get("/upstream/model-a/props")
        assert "x-prioqueue-job" in upstream.headers
        assert "x-prioqueue-job" not in client.get("/v1/models").headers
    assert stack.fake.requests == 5


def test_an_operator_may_let_a_path_skip_the_queue(make_stack: StackFactory) -> None:
    stack = make_stack({"passthrough_paths": [*DEFAULT_PASSTHROUGH_PATHS, "/v1/embeddings"]})
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        response = client.post("/v1/embeddings", json={"model": "model-a", "input": "x"})
        assert response.status_code == 200
        assert "x-prioqueue-job" not in response.headers


def test_the_lease_of_a_path_is_looked_up_on_the_normalised_path(
    make_stack: StackFactory,
) -> None:
    limits = {"lease_seconds": 60, "lease_seconds_by_path": {"/v1/embeddings": 0.3}}
    stack = make_stack({"limits": limits})
    address = urlsplit(stack.url)
    connection = http.client.HTTPConnection(address.hostname or "", address.port, timeout=10)
    try:
        body = json.dumps({"model": "model-a", "input": "x", "fake": {"seconds": 5}})
        connection.request(
            "POST", "/x/../v1/embeddings", body, {"Content-Type": "application/json"}
        )
        response = connection.getresponse()
        response.read()
        assert response.status == 504  # the 0.3 s lease of /v1/embeddings applied
    finally:
        connection.close()


def test_status_names_only_the_callers_own_jobs(make_stack: StackFactory) -> None:
    stack = make_stack(KEYS)
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        assert client.get("/prioqueue/status").status_code == 401
        job = client.post(CHAT, json=chat(), headers=ALICE).headers["x-prioqueue-job"]
        assert client.get(f"/prioqueue/jobs/{job}", headers=ALICE).json()["member"] == "alice"
        hidden = client.get(f"/prioqueue/jobs/{job}", headers=BOB)
        assert hidden.status_code == 404  # another member's job does not exist for bob
        assert client.get(f"/prioqueue/jobs/{job}", headers=WATCH).json()["member"] == "alice"
        assert client.get(f"/prioqueue/jobs/{job}", headers=ROOT_KEY).status_code == 200
        bob_view = client.get("/prioqueue/status", headers=BOB).json()
        assert bob_view["resident_model"] is None  # it would name what others run
        assert client.get("/prioqueue/status", headers=WATCH).json()["resident_model"] == (
            "model-a"
        )


def test_queued_jobs_of_others_are_counted_not_named(make_stack: StackFactory) -> None:
    import asyncio

    from .gateway_helpers import run, wait_for

    stack = make_stack(KEYS)

    async def go() -> None:
        async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
            holder = asyncio.ensure_future(client.post(CHAT, json=chat(hold="gpu"), headers=ALICE))
            await wait_for(lambda: stack.fake.active == 1)
            urgent = {**ALICE, "X-LlamaSwap-Priority": "interactive"}
            queued = [
                asyncio.ensure_future(client.post(CHAT, json=chat("model-b"), headers=h))
                for h in (urgent, BOB)
            ]

            async def two_queued() -> bool:
                state = (await client.get("/prioqueue/status", headers=BOB)).json()
                return bool(state["queued"] == 2)

            await wait_for(two_queued)
            bob = (await client.get("/prioqueue/status", headers=BOB)).json()
            assert bob["running"] == {"mine": False}
            assert [level["queued"] for level in bob["levels"].values()] == [1, 1]
            (own,) = bob["levels"]["0"]["jobs"]
            assert own["member"] == "bob"
            assert "alice" not in json.dumps(bob)
            explained = (await client.get(f"/prioqueue/jobs/{own['id']}", headers=BOB)).json()
            assert "text" not in explained
            (ahead,) = explained["ahead"]  # alice's interactive job, unnamed
            assert "member" not in ahead
            assert "job_id" not in ahead
            assert ahead["priority"] == 100
            watch = (await client.get("/prioqueue/status", headers=WATCH)).json()
            assert watch["running"]["member"] == "alice"
            assert sum(len(level["jobs"]) for level in watch["levels"].values()) == 2
            stack.fake.release("gpu")
            assert (await holder).status_code == 200
            assert [(await q).status_code for q in queued] == [200, 200]

    run(go())


def test_metrics_need_an_observer_or_the_metrics_key(make_stack: StackFactory) -> None:
    stack = make_stack(KEYS)
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=BOB).status_code == 403
        assert client.get("/metrics", headers=WATCH).status_code == 200
        scrape = {"Authorization": "Bearer sk-scrape"}
        assert client.get("/metrics", headers=scrape).status_code == 200
        assert client.get("/prioqueue/status", headers=scrape).status_code == 401


def test_management_routes_need_an_admin_key(make_stack: StackFactory) -> None:
    stack = make_stack(KEYS)
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        for method, path in (("GET", "/unload"), ("GET", "/logs"), ("POST", "/api/models/unload")):
            refused = client.request(method, path, headers=WATCH)
            assert refused.status_code == 403, path
            assert "admin" in refused.json()["error"]["message"]
        assert client.get("/unload", headers=ROOT_KEY).json() == {"unloaded": True}
    assert stack.fake.requests == 1


def test_what_the_client_must_not_decide_is_not_forwarded(make_stack: StackFactory) -> None:
    stack = make_stack({**KEYS, "upstream_api_key": "up-key"})
    headers = {
        **BOB,
        "X-LlamaSwap-Priority": "interactive",
        "X-Prioqueue-Job": "forged",
        "X-Prioqueue-Member": "alice",
    }
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        response = client.post(CHAT, json=chat(), headers=headers)
        assert response.status_code == 200
    seen = stack.fake.served[0].headers
    assert seen["authorization"] == "Bearer up-key"
    assert seen["x-llamaswap-priority"] == "0"  # the effective priority (bob's ceiling)
    assert seen["x-prioqueue-job"] == response.headers["x-prioqueue-job"]
    assert "x-prioqueue-member" not in seen


def _ask(client: httpx.Client, authorization: str, priority: str) -> httpx.Response:
    """POST a chat request with these Authorization and X-LlamaSwap-Priority headers."""
    headers = {"Authorization": authorization, "X-LlamaSwap-Priority": priority}
    return client.post(CHAT, json=chat(), headers=headers)


def test_bearer_scheme_is_case_insensitive(make_stack: StackFactory) -> None:
    stack = make_stack(KEYS)
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        for scheme in ("bearer", "BEARER", "Bearer"):
            response = _ask(client, f"{scheme} sk-alice", "100")
            assert response.status_code == 200, scheme
            assert response.headers["x-prioqueue-priority"] == "100"
        assert (
            client.post(CHAT, json=chat(), headers={"Authorization": "Basic sk-alice"}).status_code
            == 401
        )


def test_a_ceiling_below_the_policy_minimum_is_honoured(make_stack: StackFactory) -> None:
    config = {
        "policy": {"minimum": -100, "maximum": 100},
        "allow_anonymous": False,
        "keys": {"sk-low": {"member": "low", "max_priority": -200}},
    }
    stack = make_stack(config)
    with httpx.Client(base_url=stack.url, timeout=10) as client:
        for asked in ("interactive", "-1000", ""):
            response = _ask(client, "Bearer sk-low", asked)
            assert response.headers["x-prioqueue-priority"] == "-200", asked


def test_the_example_configuration_refuses_anonymous_callers() -> None:
    config = load_config(ROOT / "examples" / "gateway.toml")
    assert not config.allow_anonymous
    assert any(key.admin for key in config.keys.values())


def test_a_ceiling_below_the_policy_minimum_orders_the_queue(make_stack: StackFactory) -> None:
    """Issue 21 item 8: the dispatcher keeps the ceiling; a -150 key waits behind a -100 batch."""
    import asyncio

    from .gateway_helpers import run, status, wait_for

    config = {
        "policy": {"minimum": -100, "maximum": 100},
        "allow_anonymous": False,
        "anonymous_observer": False,
        "keys": {
            "sk-low": {"member": "low", "max_priority": -150},
            "sk-bob": {"member": "bob", "max_priority": 0, "observer": True},
        },
    }
    stack = make_stack(config)
    low = {"Authorization": "Bearer sk-low"}

    async def go() -> list[str | None]:
        async with httpx.AsyncClient(base_url=stack.url, timeout=10) as client:
            client.headers.update(BOB)

            async def queued(n: int) -> bool:
                return int((await status(client))["queued"]) == n

            async def running() -> bool:
                return (await status(client))["running"] is not None

            holder = asyncio.ensure_future(client.post(CHAT, json=chat(hold="gpu", tag="hold")))
            await wait_for(running)
            first = asyncio.ensure_future(
                client.post(CHAT, json=chat(tag="low"), headers=low)  # asks for normal
            )
            await wait_for(lambda: queued(1))
            second = asyncio.ensure_future(
                client.post(CHAT, json=chat(tag="batch"), headers={"X-LlamaSwap-Priority": "batch"})
            )
            await wait_for(lambda: queued(2))
            levels = (await status(client))["levels"]
            assert [level for level, v in levels.items() if v["queued"]] == ["-100", "-150"]
            stack.fake.release("gpu")
            answers = [await holder, await first, await second]
            assert [a.status_code for a in answers] == [200, 200, 200]
            return [served.tag for served in stack.fake.served]

    assert run(go()) == ["hold", "batch", "low"]
