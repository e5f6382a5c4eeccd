"""The gateway in front of the real llama-swap (issue 27).

llama-swap runs as a user runs it (``-config FILE -listen 127.0.0.1:PORT``) with a generated
configuration: every model's ``cmd`` starts ``standin.py`` (a stand-in for llama-server) on
``${PORT}``, so swaps start and stop real processes. The gateway runs in this process, in
front. The module starts two llama-swaps: ``swap_a`` (a swapping group, a persistent group,
a short-TTL model, two crashing models, a slow loader with ``sendLoadingState``) and
``swap_b`` (``apiKeys``). Skipped, saying why, where the binary is absent (see
``llama_swap.py``); ``PRIOQUEUE_REQUIRE_LLAMA_SWAP=1`` makes that a failure.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.gateway_helpers import CHAT, wait_for
from prioqueue.gateway import Gateway, parse_config
from prioqueue.gateway.fake_upstream import ServerThread

from .llama_swap import ROOT, Events, LlamaSwap, binary, model

KEYS = {
    "k-alice": {"member": "alice", "max_priority": 100},
    "k-bob": {"member": "bob", "max_priority": 100},
    "k-root": {"member": "root", "admin": True, "max_priority": 100},
}
ALICE = {"authorization": "Bearer k-alice"}
BOB = {"authorization": "Bearer k-bob"}
ROOT_KEY = {"authorization": "Bearer k-root"}
MAIN = ["qwen", "llama", "brief", "crashy", "dies", "slow"]


@pytest.fixture(scope="module")
def swap_a(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaSwap]:
    binary()
    work = tmp_path_factory.mktemp("swap_a")
    events = Events(work / "events.log")
    models = {
        "qwen": model("qwen", events.path),
        "llama": model("llama", events.path),
        "embed": model("embed", events.path),
        "brief": model("brief", events.path, ttl=1),
        "crashy": model("crashy", events.path, crash_at_start=True),
        "dies": model("dies", events.path, crash_after=0, work=0.3),
        "slow": model("slow", events.path, load=1.0, sendLoadingState=True),
    }
    groups = {
        "main": {"swap": True, "exclusive": True, "members": MAIN},
        "always": {"persistent": True, "swap": False, "exclusive": False, "members": ["embed"]},
    }
    swap = LlamaSwap(work, models, groups=groups, sendLoadingState=False)
    try:
        yield swap.start(events)
    finally:
        swap.stop()


@pytest.fixture(scope="module")
def swap_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaSwap]:
    binary()
    work = tmp_path_factory.mktemp("swap_b")
    events = Events(work / "events.log")
    models = {"qwen": model("qwen", events.path), "llama": model("llama", events.path)}
    groups = {"main": {"swap": True, "exclusive": True, "members": ["qwen", "llama"]}}
    swap = LlamaSwap(work, models, groups=groups, apiKeys=["sk-b"])
    try:
        yield swap.start(events)
    finally:
        swap.stop()


@pytest.fixture
def front() -> Iterator[Any]:
    """``front(config, upstream=None, **gateway_options) -> (gateway, url)``."""
    servers: list[ServerThread] = []

    def make(
        config: dict[str, Any], upstream: LlamaSwap | None = None, **options: Any
    ) -> tuple[Gateway, str]:
        data = {"allow_anonymous": False, "keys": KEYS, **config}
        parsed = parse_config(data, upstream=None if upstream is None else upstream.url)
        gateway = Gateway(parsed, **options)
        server = ServerThread(gateway, limits=gateway.config.limits).start()
        servers.append(server)
        return gateway, server.url

    yield make
    for server in reversed(servers):
        server.stop()


def run(coro: Any, timeout: float = 40.0) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(coro, timeout)

    return asyncio.run(bounded())


def ask(model_name: str, tag: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": model_name,
        "tag": tag,
        "messages": [{"role": "user", "content": "hi"}],
        **extra,
    }


def direct(swap: LlamaSwap, body: dict[str, Any]) -> httpx.Response:
    headers = {"authorization": f"Bearer {swap.keys[0]}"} if swap.keys else {}
    return httpx.post(swap.url + CHAT, json=body, headers=headers, timeout=30)


async def _queued(gateway: Gateway, count: int) -> None:
    await wait_for(lambda: len(gateway.dispatcher) == count)


async def _status(client: httpx.AsyncClient) -> dict[str, Any]:
    return dict((await client.get("/prioqueue/status", headers=ROOT_KEY)).json())


# -- priorities, one at a time, streaming ------------------------------------------------------


def test_priorities_under_a_busy_gpu_one_at_a_time(swap_a: LlamaSwap, front: Any) -> None:
    gateway, url = front({}, swap_a)
    direct(swap_a, ask("qwen", "warm"))
    mark = len(swap_a.events.lines())

    async def main() -> list[int]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            hold = asyncio.ensure_future(
                client.post(CHAT, json=ask("qwen", "hold", work=1.0), headers=ALICE)
            )
            await wait_for(lambda: "hold" in swap_a.events.begun(mark))
            waiting = []
            for tag, level in (("b", "batch"), ("n", "normal"), ("i", "interactive")):
                headers = {**BOB, "x-llamaswap-priority": level}
                waiting.append(
                    asyncio.ensure_future(client.post(CHAT, json=ask("qwen", tag), headers=headers))
                )
                await _queued(gateway, len(waiting))
            answers = await asyncio.gather(hold, *waiting)
            return [a.status_code for a in answers]

    assert run(main()) == [200, 200, 200, 200]
    assert swap_a.events.begun(mark) == ["hold", "i", "n", "b"]
    assert swap_a.events.most_at_once(mark) == 1


def test_streaming_is_passed_byte_for_byte(swap_a: LlamaSwap, front: Any) -> None:
    _gateway, url = front({}, swap_a)
    body = ask("qwen", "s", stream=True, work=0.1)
    direct(swap_a, ask("qwen", "warm"))
    expected = direct(swap_a, body).content
    through = httpx.post(url + CHAT, json=body, headers=ALICE, timeout=30)
    assert through.status_code == 200
    assert through.headers["content-type"].startswith("text/event-stream")
    assert through.content == expected
    assert expected.count(b"data: ") == 6


def test_a_client_that_leaves_stops_the_model_and_frees_the_gpu(
    swap_a: LlamaSwap, front: Any
) -> None:
    # Not `aborts`: plain llama-swap reports no requests in flight, so the gateway keeps the
    # GPU for one poll after the close (1 s here), long enough for the stand-in to stop even
    # on a busy machine (llama-swap closes its upstream connection when the client leaves).
    _gateway, url = front({"health_seconds": 1.0}, swap_a)
    direct(swap_a, ask("qwen", "warm"))
    mark = len(swap_a.events.lines())

    async def main() -> int:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            long = asyncio.ensure_future(
                client.post(CHAT, json=ask("qwen", "gone", work=20.0), headers=ALICE)
            )
            await wait_for(lambda: "gone" in swap_a.events.begun(mark))
            long.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await long
            answer = await client.post(CHAT, json=ask("qwen", "next"), headers=BOB)
            return answer.status_code

    def ends() -> dict[str, str]:
        return {f[2]: f[4] for f in swap_a.events.lines()[mark:] if f[0] == "end"}

    assert run(main()) == 200
    # The stand-in logs a request that left when it notices (a poll): wait for it, bounded.
    run(wait_for(lambda: "gone" in ends(), timeout=30))
    assert ends() == {"gone": "left", "next": "done"}  # llama-server stops when its client left
    assert swap_a.events.most_at_once(mark) == 1


# -- several models loaded: a persistent group, swaps, affinity ---------------------------------


def test_swaps_counted_equal_llama_swaps_process_starts(swap_a: LlamaSwap, front: Any) -> None:
    direct(swap_a, ask("embed", "warm"))
    direct(swap_a, ask("qwen", "warm"))
    resident = {"poll_seconds": 0.1, "persistent": ["embed"]}
    gateway, url = front({"resident": resident}, swap_a)
    mark = len(swap_a.events.lines())
    # 4 qwen and 3 llama behind a running embedding request, embeddings in between.
    mixed = ["llama", "qwen", "embed", "llama", "qwen", "embed", "qwen", "llama", "qwen"]

    async def main() -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            await wait_for(lambda: gateway.loaded.models == {"embed", "qwen"})
            assert gateway.dispatcher.resident_model == "qwen"  # not "embed", listed first
            hold = asyncio.ensure_future(
                client.post(CHAT, json=ask("embed", "hold", work=0.8), headers=ALICE)
            )
            await wait_for(lambda: "hold" in swap_a.events.begun(mark))
            queued = []
            for index, name in enumerate(mixed):
                body = ask(name, f"{name}{index}")
                queued.append(asyncio.ensure_future(client.post(CHAT, json=body, headers=BOB)))
                await _queued(gateway, len(queued))
            answers = await asyncio.gather(hold, *queued)
            assert [a.status_code for a in answers] == [200] * (len(mixed) + 1)
            return await _status(client)

    status = run(main())
    starts = swap_a.events.starts(mark)
    assert starts == ["llama"]  # affinity: the qwen requests first, then one swap to llama
    assert status["swaps"] == len(starts)
    begun = swap_a.events.begun(mark)
    assert [t for t in begun if t.startswith(("qwen", "llama"))][:4] == [
        "qwen1",
        "qwen4",
        "qwen6",
        "qwen8",
    ]
    assert swap_a.events.most_at_once(mark) == 1


def test_upstream_route_takes_the_model_from_the_path(swap_a: LlamaSwap, front: Any) -> None:
    gateway, url = front({}, swap_a)
    mark = len(swap_a.events.lines())
    with httpx.Client(base_url=url, timeout=30) as client:
        ignored = client.post(
            "/upstream/llama/v1/chat/completions", json=ask("ignored", "u1"), headers=ALICE
        )
        empty = client.post(
            "/upstream/llama/v1/chat/completions", json=ask("", "u2"), headers=ALICE
        )
        bare = client.get("/upstream/llama", headers=ALICE)
    assert ignored.status_code == 200, ignored.text
    assert empty.status_code == 200, empty.text
    assert gateway.explain(ignored.headers["x-prioqueue-job"])["model"] == "llama"
    assert gateway.explain(empty.headers["x-prioqueue-job"])["model"] == "llama"
    assert [f[1] for f in swap_a.events.lines()[mark:] if f[0] == "begin"] == ["llama", "llama"]
    assert bare.status_code == 301
    assert bare.headers["location"] == "/upstream/llama/"


def test_ttl_unload_is_read_from_running(swap_a: LlamaSwap, front: Any) -> None:
    gateway, url = front({"resident": {"poll_seconds": 0.1}}, swap_a)
    answer = httpx.post(url + CHAT, json=ask("brief", "t"), headers=ALICE, timeout=30)
    assert answer.status_code == 200

    async def main() -> None:
        await wait_for(lambda: "brief" in gateway.loaded.models, timeout=5)
        await wait_for(lambda: "brief" not in gateway.loaded.models, timeout=8)  # ttl: 1

    run(main())
    assert gateway.dispatcher.resident_model != "brief"


def test_a_crashing_model_is_a_502_with_its_reason(swap_a: LlamaSwap, front: Any) -> None:
    gateway, url = front({"limits": {"breaker_failures": 2}}, swap_a)
    with httpx.Client(base_url=url, timeout=30) as client:
        at_start = client.post(CHAT, json=ask("crashy", "c1"), headers=ALICE)
        mid_request = client.post(CHAT, json=ask("dies", "c2"), headers=ALICE)
        after = client.post(CHAT, json=ask("qwen", "c3"), headers=ALICE)
    assert at_start.status_code == 502
    assert at_start.headers["x-prioqueue-upstream-status"] == "500"
    assert "exited prematurely" in at_start.json()["error"]["message"]
    assert mid_request.status_code == 502
    assert mid_request.json()["error"]["message"].startswith("the upstream answered 502")
    assert after.status_code == 200
    assert gateway.breaker.state == "closed"


# -- sendLoadingState --------------------------------------------------------------------------


class ListRecorder:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def record(self, **fields: Any) -> None:
        self.rows.append(fields)

    def close(self) -> None:
        pass


def test_loading_state_is_not_taken_for_the_first_byte(swap_a: LlamaSwap, front: Any) -> None:
    direct(swap_a, ask("qwen", "unload-slow"))
    recorder = ListRecorder()
    gateway, url = front({}, swap_a, recorder=recorder)
    answer = httpx.post(url + CHAT, json=ask("slow", "l", stream=True), headers=ALICE, timeout=30)
    assert answer.status_code == 200
    assert b"llama-swap loading model: " not in answer.content  # it comes in 5-letter chunks
    assert "\u2501" * 5 in answer.content.decode()
    assert b"chat.completion.chunk" in answer.content
    run(wait_for(lambda: len(recorder.rows) == 1))  # written as the handler ends
    (row,) = recorder.rows
    assert row["swap"]
    assert row["load"] >= 1.0
    # A stuck load: first_byte_timeout ends the stream with an error event.
    direct(swap_a, ask("qwen", "unload-slow"))
    gateway, url = front({"limits": {"first_byte_timeout": 0.4}}, swap_a)
    cut = httpx.post(url + CHAT, json=ask("slow", "l2", stream=True), headers=ALICE, timeout=30)
    last = cut.content.rstrip().split(b"\n\n")[-1]
    assert last.startswith(b"event: error")
    assert json.loads(last.split(b"data: ", 1)[1])["error"]["type"] == "upstream_timeout"
    # Counted once the handler is past the stream's end (the client may see the end first).
    run(wait_for(lambda: gateway.breaker.consecutive == 1))


# -- apiKeys -----------------------------------------------------------------------------------


def test_api_keys_with_upstream_api_key(swap_b: LlamaSwap, front: Any) -> None:
    gateway, url = front({"upstream_api_key": "sk-b", "resident": {"poll_seconds": 0.1}}, swap_b)
    wrong, wrong_url = front(
        {"upstream_api_key": "sk-nope", "resident": {"poll_seconds": 0.1}}, swap_b
    )

    async def main() -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            answer = await client.post(CHAT, json=ask("qwen", "k"), headers=ALICE)
            assert answer.status_code == 200
            await wait_for(lambda: gateway.loaded.models == {"qwen"}, timeout=5)
            running = await client.get("/running", headers=ROOT_KEY)
            assert running.status_code == 200
            assert running.json()["running"][0]["model"] == "qwen"
            await wait_for(lambda: wrong.poll_error is not None, timeout=5)
        async with httpx.AsyncClient(base_url=wrong_url, timeout=30) as client:
            return await _status(client)

    status = run(main())
    assert gateway.poll_error is None
    assert "401" in status["upstream"]["poll_error"]
    assert "upstream_api_key" in status["upstream"]["poll_error"]


def test_two_llama_swaps_one_with_api_keys(
    swap_a: LlamaSwap, swap_b: LlamaSwap, front: Any
) -> None:
    entries: list[dict[str, Any]] = [
        {"url": swap_a.url, "name": "a", "models": ["qwen", "llama", "embed"]},
        {"url": swap_b.url, "name": "b", "upstream_api_key": "sk-b"},
    ]
    gateway, url = front({"upstreams": entries, "health_seconds": 0.1})
    bad = [entries[0], {**entries[1], "upstream_api_key": "sk-wrong"}]
    _wrong, wrong_url = front({"upstreams": bad, "health_seconds": 0.1})
    marks = len(swap_a.events.lines()), len(swap_b.events.lines())

    async def main() -> tuple[list[int], dict[str, Any], list[int]]:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            await wait_for(lambda: all(u.up for u in gateway.upstreams.values()), timeout=5)
            bodies = [ask(m, f"f{i}", work=0.3) for i, m in enumerate(["qwen", "llama"] * 3)]
            answers = await asyncio.gather(
                *(client.post(CHAT, json=b, headers=ALICE) for b in bodies)
            )
        async with httpx.AsyncClient(base_url=wrong_url, timeout=30) as client:
            served = await asyncio.gather(
                *(client.post(CHAT, json=ask("qwen", f"w{i}"), headers=ALICE) for i in range(2))
            )
            return (
                [a.status_code for a in answers],
                await _status(client),
                [s.status_code for s in served],
            )

    codes, status, served = run(main())
    assert codes == [200] * 6
    assert swap_a.events.begun(marks[0])
    assert swap_b.events.begun(marks[1])
    assert swap_a.events.most_at_once(marks[0]) == 1
    assert swap_b.events.most_at_once(marks[1]) == 1
    fleet = {u["name"]: u for u in status["fleet"]}
    assert fleet["a"]["state"] == "up"
    assert fleet["b"]["state"] == "down"
    assert "401" in fleet["b"]["last_error"]
    assert "upstream_api_key" in fleet["b"]["last_error"]
    assert served == [200, 200]  # by a


# -- llama-swap's own UI, in Chromium ----------------------------------------------------------


def test_llama_swap_ui_through_the_gateway_in_chromium(swap_a: LlamaSwap, front: Any) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from ui.browser import need_browser  # type: ignore[import-not-found,unused-ignore]
    finally:
        sys.path.remove(str(ROOT / "tests"))
    chromium, driver_path = need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    # The UI keeps /api/events open through the gateway: a short grace at shutdown.
    _gateway, url = front({"limits": {"shutdown_grace_seconds": 0.5}}, swap_a)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        host = url.removeprefix("http://")
        # The browser logs in once (Basic, the admin key as password) and keeps the login
        # for the realm: the UI's own calls to /api/*, /running and /logs carry it.
        driver.get(f"http://admin:k-root@{host}/ui/")
        driver.get(f"{url}/ui/")
        deadline = time.monotonic() + 15
        while "llama-swap" not in driver.page_source.lower() and time.monotonic() < deadline:
            time.sleep(0.1)
        page = driver.page_source.lower()
        probe = "return fetch(location.origin + arguments[0]).then(r => r.status)"
        statuses = {
            path: driver.execute_script(probe, path)
            for path in ("/api/version", "/running", "/logs", "/api/metrics/activity")
        }
    finally:
        driver.quit()
    assert "llama-swap" in page
    assert statuses == dict.fromkeys(statuses, 200), statuses
    member = base64.b64encode(b"x:k-alice").decode()
    refused = httpx.get(url + "/api/version", headers={"authorization": f"Basic {member}"})
    assert refused.status_code == 403


# -- the documentation's pair of files ---------------------------------------------------------


def test_the_documented_llama_swap_config_loads(tmp_path: Path) -> None:
    from prioqueue._service.config import _load_toml

    binary()
    page = (ROOT / "docs" / "llama-swap.md").read_text(encoding="utf-8")
    yaml = re.search(r"<!-- llama-swap-config -->\n```yaml\n(.*?)^```", page, re.M | re.S)
    toml = re.search(r"<!-- gateway-config -->\n```toml\n(.*?)^```", page, re.M | re.S)
    assert yaml is not None
    assert toml is not None
    config = parse_config(_load_toml(toml[1]))
    swap = LlamaSwap(tmp_path, {}, text=yaml[1])
    swap.keys = [str(config.upstream_api_key)]
    try:
        swap.start(Events(tmp_path / "events.log"))
        headers = config.poll_headers()
        listed = httpx.get(swap.url + "/v1/models", headers=headers, timeout=10).json()
        assert sorted(m["id"] for m in listed["data"]) == ["embed", "llama", "qwen"]
        assert httpx.get(swap.url + "/running", timeout=10).status_code == 401
    finally:
        swap.stop()
    assert config.resident_persistent == {"embed"}
