"""The dashboard in a real headless Chromium, against a real broker and a real gateway (issue 19).

A broker subprocess (SQLite store, so it survives a restart) and a gateway with the fake
llama-swap are seeded with jobs of several members and levels and with busy workers; the
page is opened with each kind of key and what it shows is compared with what the API says.
The tests of a module share its services and run in file order (the last ones cancel and
restart). Screenshots go to ``$PRIOQUEUE_UI_SCREENSHOTS`` when it is set (``nox -s docs``).
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.broker_helpers import BrokerProcess, free_port

from .browser import axe_violations, chrome, requests_sent, screenshot, wait_until

__all__ = ["chrome"]

EVIL = "<script>window.pwned=1</script>"
EVIL_MODEL = "<img src=x onerror=window.pwned=2>"
KEYS: dict[str, dict[str, Any]] = {
    "sk-alice": {"role": "submitter", "member": "alice", "tier": "pro", "max_priority": 100},
    "sk-bob": {"role": "submitter", "member": "bob", "max_priority": 0},
    "sk-evil": {"role": "submitter", "member": EVIL, "max_priority": 0},
    "sk-ops": {"role": "submitter", "member": "ops", "observer": True, "admin": True},
    "wk-1": {"role": "worker", "workers_prefix": "gpu-"},
}


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# ---------------------------------------------------------------------------- the page


def login(browser: Any, url: str, key: str) -> None:
    """Open the page, forget any key, type ``key`` and wait for the first render."""
    browser.get(url)
    browser.execute_script("sessionStorage.clear()")
    browser.get(url)
    field = wait_until(lambda: browser.find_element("id", "key"), "the key field")
    wait_until(field.is_displayed, "the key form")
    field.send_keys(key + "\n")
    wait_until(
        lambda: browser.execute_script(
            "return document.documentElement.dataset.updated"
            " && !document.getElementById('dashboard').hidden"
        ),
        "the first render",
    )


def fresh(browser: Any) -> None:
    """Wait for a render that starts after now (the page polls every 2 s)."""
    before = browser.execute_script("return Number(document.documentElement.dataset.updated)")
    wait_until(
        lambda: (
            browser.execute_script("return Number(document.documentElement.dataset.updated)")
            > before
        ),
        "a new poll",
    )


def column(browser: Any, selector: str, attribute: str | None = None) -> list[str]:
    """The text (or a data attribute) of every element matching ``selector``."""
    script = (
        "return [...document.querySelectorAll(arguments[0])]"
        ".map(e => arguments[1] ? e.dataset[arguments[1]] : e.textContent)"
    )
    values: list[str] = browser.execute_script(script, selector, attribute)
    return values


def no_injection(browser: Any) -> None:
    assert browser.execute_script("return window.pwned") is None
    assert (
        browser.execute_script("return document.querySelectorAll('main script, main img').length")
        == 0
    )


# ---------------------------------------------------------------------------- the broker


def _write_config(
    path: Path, port: int, store: Path, keys: Mapping[str, Mapping[str, Any]]
) -> Path:
    lines = [
        f'listen = "127.0.0.1:{port}"',
        f'store = "sqlite:///{store}"',
        "worker_timeout_seconds = 0",  # the seeded workers stay silent: never time them out
    ]
    for name, entry in keys.items():
        lines.append(f"[keys.{json.dumps(name)}]")
        lines.extend(f"{k} = {json.dumps(v)}" for k, v in entry.items())
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _wait_serving(proc: BrokerProcess, timeout: float = 60.0, key: str = "wk-1") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.proc is not None
        if proc.proc.poll() is not None:
            raise AssertionError(f"the broker exited: {proc.log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            r = httpx.get(f"{proc.url}/v1/status", headers=_bearer(key), timeout=1.0)
            if r.status_code == 200:
                return
        time.sleep(0.1)
    raise AssertionError(f"the broker did not serve: {proc.log.read_text()[-2000:]}")


def _serving(
    root: Path, keys: Mapping[str, Mapping[str, Any]], key: str, seed: Callable[[str], None]
) -> Iterator[BrokerProcess]:
    """A broker under ``root`` with ``keys``, serving (``key``: a worker key) and seeded."""
    port = free_port()
    config = _write_config(root / "broker.toml", port, root / "broker.db", keys)
    proc = BrokerProcess(config, port, root / "broker.log").start()
    try:
        _wait_serving(proc, key=key)
        seed(proc.url)
        yield proc
    finally:
        proc.kill()


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    yield from _serving(tmp_path_factory.mktemp("ui-broker"), KEYS, "wk-1", _seed)


def _seed(url: str) -> None:
    with httpx.Client(base_url=url, timeout=10.0) as client:

        def submit(key: str, **body: Any) -> str:
            r = client.post("/v1/jobs", json=body, headers=_bearer(key))
            assert r.status_code == 201, r.text
            job_id: str = r.json()["id"]
            return job_id

        def pop(worker: str, **body: Any) -> dict[str, Any]:
            r = client.post(f"/v1/workers/{worker}/pop", json=body, headers=_bearer("wk-1"))
            assert r.status_code == 200, r.text
            granted: dict[str, Any] = r.json()
            return granted

        first = submit("sk-alice", model="m1", group="film-1", estimate=30.0, priority=5)
        for _ in range(3):
            submit("sk-alice", model="m1", group="film-1", estimate=30.0)
        submit("sk-alice", model="m2", estimate=20.0, priority=2)
        for _ in range(2):
            submit("sk-bob", model="m1", estimate=30.0, labels={"team": "bob", "shot": "7"})
        bobs = submit("sk-bob", model="m3", estimate=30.0)
        submit("sk-evil", model=EVIL_MODEL, estimate=10.0)
        done = pop("gpu-1")
        assert done["id"] == first
        r = client.post(
            f"/v1/jobs/{first}/complete",
            json={"worker": "gpu-1", "attempt": done["attempt"], "result": None},
            headers=_bearer("wk-1"),
        )
        assert r.status_code == 200, r.text
        pop("gpu-1")
        pop("gpu-2", slots=2)
        pop("gpu-2", slots=2)  # its second job is prefetched
        assert pop("gpu-3", models=["m3"])["id"] == bobs


def _dashboard(url: str, key: str, **params: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/dashboard", headers=_bearer(key), params=params, timeout=10.0)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def _job_ids(data: dict[str, Any]) -> set[str]:
    ids: set[str] = set()
    for lane in data["lanes"]:
        ids.update(j["id"] for j in lane["jobs"] if "id" in j)
    for worker in data["workers"]:
        for j in [worker["running"], *worker["prefetched"]]:
            if j and "id" in j:
                ids.add(j["id"])
    return ids


def test_observer_sees_every_member_worker_and_film(chrome: Any, broker: BrokerProcess) -> None:
    api = _dashboard(broker.url, "sk-ops")
    login(chrome, f"{broker.url}/ui", "sk-ops")
    members = column(chrome, "#lanes tbody tr", "member")
    assert set(members) == {lane["member"] for lane in api["lanes"]} >= {"alice", "bob", EVIL}
    shown = set(column(chrome, "button.job", "job"))
    assert shown == _job_ids(api)
    assert column(chrome, "#gpus tbody tr", "worker") == ["gpu-1", "gpu-2", "gpu-3"]
    gpu2 = chrome.find_element("css selector", '#gpus tr[data-worker="gpu-2"]').text
    assert "lease" in gpu2
    assert (
        len(
            chrome.find_elements(
                "css selector", '#gpus tr[data-worker="gpu-2"] td:nth-child(4) button.job'
            )
        )
        == 1
    )
    # One bar per member lane, labelled with its service against the fair share.
    bars = column(chrome, "#lanes tbody tr .share .bar")
    assert len(bars) == len(members)
    labels = [
        e.get_attribute("aria-label")
        for e in chrome.find_elements("css selector", "#lanes .share .bar")
    ]
    assert all("fair share" in label for label in labels)
    film = chrome.find_element("css selector", '#films tr[data-group="film-1"]').text
    expected = next(g for g in api["groups"] if g["group"] == "film-1")
    assert expected["done"] == 1
    assert expected["forecast_in"] is not None
    counts = (
        f"{expected['done']} done · {expected['running']} running · {expected['queued']} queued"
    )
    assert counts in film
    forecast = chrome.find_element("css selector", '#films tr[data-group="film-1"] .forecast').text
    assert forecast.startswith("in "), forecast
    levels = column(chrome, "#levels tbody tr", "level")
    assert levels == [str(level["level"]) for level in api["levels"]] == ["5", "2", "0"]
    # Levels an alias of the policy names show that name beside the number.
    assert column(chrome, "#levels tbody th") == ["5", "2", "normal (0)"]
    # The finished shot ran for a few milliseconds: its GPU time is not shown as nothing.
    gpu = chrome.find_element("css selector", '#films tr[data-group="film-1"] td.gpu').text
    assert expected["gpu_seconds"] > 0
    assert gpu == chrome.execute_script(
        "return prioqueueSeconds(arguments[0])", expected["gpu_seconds"]
    )
    assert gpu != "0.0 s"
    causes = column(chrome, '#levels tr[data-level="0"] li', "cause")
    assert {"aging", "affinity", "tier", "fair_share"} <= set(causes)
    no_injection(chrome)
    screenshot(chrome, "broker-observer")


def test_hostile_names_render_as_text(chrome: Any, broker: BrokerProcess) -> None:
    login(chrome, f"{broker.url}/ui", "sk-ops")
    assert EVIL in column(chrome, "#lanes th.member")
    assert any(EVIL_MODEL in text for text in column(chrome, "button.job"))
    no_injection(chrome)


def test_clicking_a_job_explains_it(chrome: Any, broker: BrokerProcess) -> None:
    login(chrome, f"{broker.url}/ui", "sk-ops")
    queued = [
        j["id"]
        for lane in _dashboard(broker.url, "sk-ops")["lanes"]
        if lane["member"] == "bob"
        for j in lane["jobs"]  # a lane lists its queued jobs
    ]
    chrome.find_element("css selector", f'#lanes button.job[data-job="{queued[0]}"]').click()
    panel = wait_until(
        lambda: (
            "Score terms" in chrome.find_element("id", "job").text
            and chrome.find_element("id", "job").text
        ),
        "the job panel",
    )
    assert f"Job {queued[0]}" in panel
    assert "Position" in panel
    assert "Forecast start" in panel
    assert "aging" in panel
    assert "Ahead (" in panel
    assert "Overtaken by (" in panel
    explained = _dashboard(broker.url, "sk-ops", job=queued[0])["job"]["explain"]
    assert f"Ahead ({len(explained['ahead'])})" in panel
    assert "team=bob, shot=7" in panel  # the job's labels
    screenshot(chrome, "broker-job")


def test_keyboard_and_accessibility(chrome: Any, broker: BrokerProcess) -> None:
    from selenium.webdriver.common.keys import Keys

    login(chrome, f"{broker.url}/ui", "sk-ops")
    job_id = sorted(_job_ids(_dashboard(broker.url, "sk-ops")))[0]
    body = chrome.find_element("tag name", "body")
    body.click()
    for _ in range(80):  # Tab through the page to the search box: everything is reachable
        chrome.switch_to.active_element.send_keys(Keys.TAB)
        if chrome.switch_to.active_element.get_attribute("id") == "job-id":
            break
    assert chrome.switch_to.active_element.get_attribute("id") == "job-id"
    chrome.switch_to.active_element.send_keys(job_id + Keys.ENTER)
    wait_until(lambda: f"Job {job_id}" in chrome.find_element("id", "job").text, "the panel")
    violations = axe_violations(chrome)
    assert violations == [], json.dumps(violations, indent=1)
    # The key form too.
    chrome.execute_script("sessionStorage.clear()")
    chrome.get(f"{broker.url}/ui")
    wait_until(lambda: chrome.find_element("id", "key").is_displayed(), "the key form")
    assert axe_violations(chrome) == []


def test_submitter_sees_only_its_own_member(chrome: Any, broker: BrokerProcess) -> None:
    everything = _dashboard(broker.url, "sk-ops")
    bobs = {
        j["id"] for lane in everything["lanes"] if lane["member"] == "bob" for j in lane["jobs"]
    }
    login(chrome, f"{broker.url}/ui", "sk-alice")
    assert set(column(chrome, "#lanes tbody tr", "member")) == {"alice"}
    assert column(chrome, "#films tbody tr", "member") == ["alice"]
    source = chrome.page_source
    assert "bob" not in source
    assert EVIL not in source
    assert "&lt;script&gt;window" not in source
    assert not bobs & set(column(chrome, "button.job", "job"))
    assert (
        column(chrome, "#gpus tbody tr td:nth-child(2)") == ["\N{EN DASH}"] * 3
    )  # no resident models
    assert "another member's job" in chrome.find_element("id", "gpus").text
    screenshot(chrome, "broker-submitter")
    # Asking for bob's job by id says it is unknown, as GET /v1/jobs/{id} does.
    search = chrome.find_element("id", "job-id")
    search.send_keys(sorted(bobs)[0] + "\n")
    wait_until(lambda: "no job" in chrome.find_element("id", "job").text, "the refusal")


def test_worker_key_sees_only_held_jobs(chrome: Any, broker: BrokerProcess) -> None:
    login(chrome, f"{broker.url}/ui", "wk-1")
    assert column(chrome, "#lanes tbody tr", "member") == [None]  # the "no lanes" row
    assert "A worker key sees no lanes." in chrome.find_element("id", "lanes").text
    assert column(chrome, "#gpus tbody tr", "worker") == ["gpu-1", "gpu-2", "gpu-3"]
    held = {
        j["id"]
        for w in _dashboard(broker.url, "wk-1")["workers"]
        for j in [w["running"], *w["prefetched"]]
        if j
    }
    assert set(column(chrome, "button.job", "job")) == held
    assert "alice" not in chrome.page_source
    assert "bob" not in chrome.page_source
    assert not chrome.find_element("id", "job-section").is_displayed()


def test_a_bad_key_asks_again(chrome: Any, broker: BrokerProcess) -> None:
    chrome.get(f"{broker.url}/ui")
    chrome.execute_script("sessionStorage.clear()")
    chrome.get(f"{broker.url}/ui")
    field = wait_until(lambda: chrome.find_element("id", "key"), "the key field")
    field.send_keys("sk-nobody\n")
    wait_until(lambda: "401" in chrome.find_element("id", "banner").text, "the refusal")
    time.sleep(2.5)  # past a poll period: the page stopped polling and kept the message
    assert "401" in chrome.find_element("id", "banner").text
    assert chrome.find_element("id", "key").is_displayed()
    assert chrome.execute_script("return sessionStorage.length") == 0
    assert "sk-nobody" not in chrome.current_url


def test_the_key_travels_only_as_a_bearer_header(chrome: Any, broker: BrokerProcess) -> None:
    requests_sent(chrome)  # forget earlier tests' requests
    login(chrome, f"{broker.url}/ui", "sk-alice")
    fresh(chrome)
    sent = requests_sent(chrome)
    polls = [r for r in sent if "/v1/dashboard" in r["url"]]
    assert len(polls) >= 2
    assert all(r["headers"].get("Authorization") == "Bearer sk-alice" for r in polls)
    assert all(r["url"].startswith(broker.url) for r in sent)  # nothing from elsewhere
    assert not [r["url"] for r in sent if "sk-alice" in r["url"]]
    assert chrome.get_cookies() == []
    stored = chrome.execute_script(
        "return [Object.keys(localStorage).length, Object.values(sessionStorage)]"
    )
    assert stored == [0, ["sk-alice"]]


def test_the_page_survives_a_broker_restart(chrome: Any, broker: BrokerProcess) -> None:
    login(chrome, f"{broker.url}/ui", "sk-ops")
    before = set(column(chrome, "#lanes tbody tr", "member"))
    broker.signal(signal.SIGKILL)
    assert broker.proc is not None
    broker.proc.wait(timeout=10)
    wait_until(lambda: "unreachable" in chrome.find_element("id", "banner").text, "the outage")
    broker.start()
    _wait_serving(broker)
    wait_until(lambda: chrome.find_element("id", "banner").text == "", "the recovery")
    fresh(chrome)
    assert set(column(chrome, "#lanes tbody tr", "member")) == before


def test_cancelling_a_film_from_the_page(chrome: Any, broker: BrokerProcess) -> None:
    login(chrome, f"{broker.url}/ui", "sk-alice")
    chrome.find_element("css selector", '#films tr[data-group="film-1"] button.cancel').click()
    wait_until(lambda: "cancelled" in chrome.find_element("id", "banner").text, "the answer")
    r = httpx.get(f"{broker.url}/v1/groups/film-1", headers=_bearer("sk-alice"), timeout=10.0)
    group = r.json()
    assert (group["queued"], group["running"]) == (0, 0), group
    assert group["cancelled"] >= 2, group
    wait_until(
        lambda: (
            "0 queued" in chrome.find_element("css selector", '#films tr[data-group="film-1"]').text
        ),
        "the film's new progress",
    )


# ------------------------------------------------------------- a real-looking fleet (README)

FLEET_KEYS: dict[str, dict[str, Any]] = {
    "sk-kiri": {"role": "submitter", "member": "kiri-chat", "tier": "pro", "max_priority": 100},
    "sk-northlight": {
        "role": "submitter", "member": "northlight-studio", "tier": "max", "max_priority": 100,
    },
    "sk-nightly": {"role": "submitter", "member": "nightly-renders", "max_priority": 0},
    "sk-ops": {"role": "submitter", "member": "ops", "observer": True, "admin": True},
    "wk-fleet": {"role": "worker", "workers_prefix": "gpu-"},
}  # fmt: skip
FILM = "lighthouse-teaser"
SHOT_SECONDS = 1.5  # how long the film's first shot holds its GPU (wall time: a real broker)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """A broker that looks like a fleet in use: three members on three levels, a film, four
    GPUs with their models. Its page is the README's screenshot."""
    yield from _serving(tmp_path_factory.mktemp("ui-fleet"), FLEET_KEYS, "wk-fleet", _seed_fleet)


def _seed_fleet(url: str) -> None:
    with httpx.Client(base_url=url, timeout=10.0) as client:

        def submit(key: str, model: str, priority: str, estimate: float, **body: Any) -> str:
            body.update(model=model, priority=priority, estimate=estimate)
            r = client.post("/v1/jobs", json=body, headers=_bearer(key))
            assert r.status_code == 201, r.text
            job_id: str = r.json()["id"]
            return job_id

        def pop(worker: str, models: list[str], **body: Any) -> dict[str, Any]:
            r = client.post(
                f"/v1/workers/{worker}/pop",
                json={"models": models, **body},
                headers=_bearer("wk-fleet"),
            )
            assert r.status_code == 200, r.text
            granted: dict[str, Any] = r.json()
            return granted

        video = ["wan2.1-t2v"]
        shots = [
            submit("sk-northlight", "wan2.1-t2v", "normal", 240.0, group=FILM) for _ in range(6)
        ]
        first = pop("gpu-h100-1", video)
        started = time.monotonic()
        assert first["id"] == shots[0]
        for _ in range(3):
            submit("sk-kiri", "sdxl-turbo", "interactive", 6.0)
        submit("sk-kiri", "llama-3.1-8b", "interactive", 12.0)
        for _ in range(2):
            submit("sk-northlight", "flux-dev", "normal", 60.0)
        for _ in range(5):
            submit("sk-nightly", "flux-dev", "batch", 90.0)
        pop("gpu-a100-1", ["sdxl-turbo", "flux-dev"], slots=2)
        pop("gpu-a100-1", ["sdxl-turbo", "flux-dev"], slots=2)  # prefetched
        pop("gpu-4090-1", ["sdxl-turbo"])
        pop("gpu-4090-2", ["llama-3.1-8b"])
        time.sleep(max(0.0, SHOT_SECONDS - (time.monotonic() - started)))  # the shot runs
        r = client.post(
            f"/v1/jobs/{first['id']}/complete",
            json={"worker": "gpu-h100-1", "attempt": first["attempt"], "result": None},
            headers=_bearer("wk-fleet"),
        )
        assert r.status_code == 200, r.text
        assert pop("gpu-h100-1", video)["id"] == shots[1]


def test_a_real_looking_fleet_reads_as_a_person_expects(chrome: Any, fleet: BrokerProcess) -> None:
    api = _dashboard(fleet.url, "sk-ops")
    login(chrome, f"{fleet.url}/ui", "sk-ops")
    assert column(chrome, "#levels tbody th") == [
        "interactive (100)",
        "normal (0)",
        "batch (-100)",
    ]
    assert column(chrome, "#lanes tbody td:first-child") == [
        "interactive (100)",
        "normal (0)",
        "batch (-100)",
    ]
    film = next(g for g in api["groups"] if g["group"] == FILM)
    assert (film["done"], film["running"], film["queued"]) == (1, 1, 4)
    assert film["gpu_seconds"] >= SHOT_SECONDS
    gpu = chrome.find_element("css selector", f'#films tr[data-group="{FILM}"] td.gpu').text
    assert gpu == chrome.execute_script(
        "return prioqueueSeconds(arguments[0])", film["gpu_seconds"]
    )
    assert gpu.endswith(" s")
    assert float(gpu.removesuffix(" s")) >= SHOT_SECONDS
    text = chrome.find_element("tag name", "main").text
    assert not re.search(r"\b60 (s|min)\b", text), text
    assert re.search(r"lease 1[45] min \d\d? s left", text), text  # 900 s leases
    assert column(chrome, "#gpus tbody tr", "worker") == [
        "gpu-4090-1",
        "gpu-4090-2",
        "gpu-a100-1",
        "gpu-h100-1",
    ]
    screenshot(chrome, "broker-fleet")


# Each shown form, parsed back to seconds: (value, half of the unit shown).
_SHOWN = (
    (re.compile(r"< 0\.1 s"), lambda m: (0.025, 0.025)),
    (re.compile(r"(\d)\.(\d) s"), lambda m: (int(m[1]) + int(m[2]) / 10, 0.05)),
    (re.compile(r"([1-5]\d) s"), lambda m: (int(m[1]), 0.5)),
    (re.compile(r"([1-9]|[1-5]\d) min ([1-5]?\d) s"), lambda m: (60 * int(m[1]) + int(m[2]), 0.5)),
    (re.compile(r"([1-9]\d*) h ([1-5]?\d) min"), lambda m: (3600 * int(m[1]) + 60 * int(m[2]), 30)),
)


def _shown_seconds(shown: str) -> tuple[float, float]:
    for pattern, value in _SHOWN:
        match = pattern.fullmatch(shown)
        if match:
            return value(match)
    raise AssertionError(f"not a duration the page shows: {shown!r}")


@settings(max_examples=40)
@given(st.lists(st.floats(0, 10**7, allow_nan=False), min_size=1, max_size=40))
def test_the_duration_formatter_never_shows_60_and_never_runs_backwards(
    chrome: Any, fleet: BrokerProcess, values: list[float]
) -> None:
    if not chrome.current_url.startswith(fleet.url):
        chrome.get(f"{fleet.url}/ui")
    edges = [0.04, 9.95, 59.5, 59.6, 899.6, 3599.4, 3599.5, 3599.6, 86399.9]
    xs = sorted([*values, *edges])
    shown: list[str] = chrome.execute_script("return arguments[0].map(prioqueueSeconds)", xs)
    parsed = [_shown_seconds(text) for text in shown]  # no "60 s", no "60 min": no match
    for x, text, (value, half) in zip(xs, shown, parsed, strict=True):
        if text == "< 0.1 s":
            assert 0 < x < 0.05
        else:
            assert abs(value - x) <= half + 1e-9, (x, text)
    assert [v for v, _ in parsed] == sorted(v for v, _ in parsed)  # longer never reads shorter
    assert shown[xs.index(899.6)] == "15 min 0 s"  # was "14 min 60 s"


# ---------------------------------------------------------------------------- the gateway


@pytest.fixture(scope="module")
def gateway() -> Iterator[tuple[str, Any, list[threading.Thread]]]:
    from prioqueue.gateway import Gateway, parse_config
    from prioqueue.gateway.fake_upstream import FakeLlamaSwap, ServerThread

    fake = FakeLlamaSwap()
    up = ServerThread(fake).start()
    keys = {
        "sk-alice": {"member": "alice"},
        "sk-bob": {"member": "bob"},
        "sk-evil": {"member": EVIL},
        "sk-ops": {"member": "ops", "observer": True, "admin": True},
    }
    config = {
        "keys": keys,
        "estimate_seconds": 20.0,
        "upstreams": [{"name": "gpu-a", "url": up.url}, {"name": "gpu-b", "url": up.url}],
    }
    gw = Gateway(parse_config(config))
    server = ServerThread(gw, limits=gw.config.limits).start()
    threads = []

    def ask(key: str, group: str | None) -> None:
        headers = _bearer(key) | ({"X-Prioqueue-Group": group} if group else {})
        body = {"model": "model-a", "messages": [{"role": "user", "content": "hi"}],
                "fake": {"hold": "release"}}  # fmt: skip
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=60)

    for key, group in [("sk-alice", "film-g")] * 3 + [("sk-bob", None)] * 2 + [("sk-evil", None)]:
        thread = threading.Thread(target=ask, args=(key, group), daemon=True)
        thread.start()
        threads.append(thread)
        time.sleep(0.05)

    def queued() -> bool:
        r = httpx.get(f"{server.url}/prioqueue/dashboard", headers=_bearer("sk-ops"), timeout=5)
        return bool(r.json()["queued"] == 4 and r.json()["running"] == 2)

    wait_until(queued, "six requests, two running")
    try:
        yield server.url, fake, threads
    finally:
        fake.release("release")
        for thread in threads:
            thread.join(timeout=10)
        server.stop()
        up.stop()


def test_gateway_page_for_an_observer(chrome: Any, gateway: tuple[str, Any, Any]) -> None:
    url, _, _ = gateway
    login(chrome, f"{url}/prioqueue/ui", "sk-ops")
    assert column(chrome, "#gpus tbody tr", "worker") == ["gpu-a", "gpu-b"]
    assert set(column(chrome, "#lanes tbody tr", "member")) == {"alice", "bob", EVIL}
    assert chrome.find_element("id", "service").text == "gateway"
    running = chrome.find_elements("css selector", "#gpus td:nth-child(3) button.job")
    assert len(running) == 2
    film = chrome.find_element("css selector", '#films tr[data-group="film-g"]').text
    assert "alice" in film
    assert "queued" in film
    no_injection(chrome)
    screenshot(chrome, "gateway-observer")
    assert axe_violations(chrome) == []


def test_gateway_submitter_sees_its_own_and_cancels_its_film(
    chrome: Any, gateway: tuple[str, Any, Any]
) -> None:
    url, _, _ = gateway
    login(chrome, f"{url}/prioqueue/ui", "sk-bob")
    assert set(column(chrome, "#lanes tbody tr", "member")) == {"bob"}
    assert "alice" not in chrome.page_source
    assert EVIL not in chrome.page_source
    login(chrome, f"{url}/prioqueue/ui", "sk-alice")
    assert set(column(chrome, "#lanes tbody tr", "member")) == {"alice"}
    chrome.find_element("css selector", '#films tr[data-group="film-g"] button.cancel').click()
    wait_until(lambda: "cancelled" in chrome.find_element("id", "banner").text, "the answer")
    r = httpx.get(f"{url}/prioqueue/groups/film-g", headers=_bearer("sk-alice"), timeout=5)
    status = r.json()
    assert (status["queued"], status["running"], status["cancelled"]) == (0, 0, 3), status
