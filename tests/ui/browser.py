"""A real headless Chromium for the dashboard tests (Debian's ``chromium`` + ``chromium-driver``).

The tests skip, saying why, where Chromium, its driver or Selenium is missing, unless
``CI=true`` or ``PRIOQUEUE_REQUIRE_BROWSER=1``: then they fail (CI installs Chromium in
``.ci/run``). ``PRIOQUEUE_UI_SCREENSHOTS=DIR`` (set by ``nox -s docs``) makes them write
their screenshots to ``DIR``.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REQUIRE_BROWSER = (
    os.environ.get("CI", "").lower() == "true" or os.environ.get("PRIOQUEUE_REQUIRE_BROWSER") == "1"
)
AXE = Path(__file__).parent / "vendor" / "axe-core" / "axe.min.js"
SCREENSHOTS = os.environ.get("PRIOQUEUE_UI_SCREENSHOTS")


def _find(*names: str) -> str | None:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    return None


def browser_unavailable() -> tuple[str, str, str]:
    """``(reason, chromium, driver)``: reason is "" when everything is there."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (the test dependency group has it)", "", ""
    chromium = _find("chromium", "chromium-browser")
    driver = _find("chromedriver", "chromium-driver")
    if chromium is None or driver is None:
        missing = "chromium" if chromium is None else "chromedriver"
        return (
            f"{missing} is not installed (apt-get install -y chromium chromium-driver)",
            "",
            "",
        )
    return "", chromium, driver


def need_browser() -> tuple[str, str]:
    reason, chromium, driver = browser_unavailable()
    if reason:
        if REQUIRE_BROWSER:
            pytest.fail(f"CI=true or PRIOQUEUE_REQUIRE_BROWSER=1 but {reason}")
        pytest.skip(reason)
    return chromium, driver


@pytest.fixture(scope="module")
def chrome() -> Iterator[Any]:
    """One headless Chromium per test module."""
    chromium, driver = need_browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1800",
        "--force-device-scale-factor=1",
        "--disable-extensions",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})  # network events
    browser = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    browser.set_page_load_timeout(30)
    browser.set_script_timeout(60)
    try:
        yield browser
    finally:
        browser.quit()


def wait_until(probe: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    """Poll ``probe`` until it returns something truthy; fail naming ``what``.

    ``timeout`` means "hung", never "slow" (a busy machine must not fail a test)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except Exception as exc:  # a stale element while the page re-renders
            last = exc
        else:
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def requests_sent(browser: Any) -> list[dict[str, Any]]:
    """The HTTP requests the page sent since the last call: ``{"url", "headers"}``."""
    import json

    sent = []
    for entry in browser.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] == "Network.requestWillBeSent":
            request = message["params"]["request"]
            sent.append({"url": request["url"], "headers": request.get("headers", {})})
    return sent


def screenshot(browser: Any, name: str) -> None:
    """Save a screenshot to ``$PRIOQUEUE_UI_SCREENSHOTS/name.png`` when that is set."""
    if not SCREENSHOTS:
        return
    folder = Path(SCREENSHOTS)
    folder.mkdir(parents=True, exist_ok=True)
    height = browser.execute_script("return document.body.scrollHeight")
    browser.set_window_size(1280, min(4000, max(900, int(height) + 40)))
    browser.save_screenshot(str(folder / f"{name}.png"))
    browser.set_window_size(1280, 1800)


def axe_violations(browser: Any) -> list[dict[str, Any]]:
    """Run the vendored axe-core in the page; return its violations (WCAG 2 A/AA rules)."""
    browser.execute_script(AXE.read_text(encoding="utf-8"))
    result: dict[str, Any] = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a',"
        " 'wcag21aa', 'best-practice']}}).then(r => done(r), e => done({error: String(e)}));"
    )
    assert "error" not in result, result
    return [
        {"id": v["id"], "help": v["help"], "nodes": [n["html"] for n in v["nodes"][:3]]}
        for v in result["violations"]
    ]
