"""The console in a real browser (issue 17): headless Chromium (the Debian ``chromium`` and
``chromium-driver`` packages, driven by Selenium; no browser is downloaded) against the
embedded app served by uvicorn on a free port.

The browser's network is closed: every host name other than the API's resolves to nothing
(``--host-resolver-rules``), and Chrome's own log of every request it sent is checked to hold
same-origin URLs only, so /docs and /redoc are seen to render from the vendored assets.

Screenshots (PNG) go to ``$DPRELEASE_TEST_ARTIFACTS/console/`` (else the test's tmp_path),
the last page of each test included;
``DPRELEASE_UPDATE_SCREENSHOTS=1`` also copies the budgets page to docs/screenshots/ for the
README. Without chromium, chromedriver or selenium the test skips, except under CI (``CI``
set), where it fails: CI never skips it silently (``.ci/run`` installs the packages).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from service.app import create_app
from service.releases.status import TERMINAL
from tests.conftest import _embedded_runtime, free_port, npz_bytes, toy_dataset

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("DPRELEASE_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("DPRELEASE_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
UPDATE_SCREENSHOTS = os.environ.get("DPRELEASE_UPDATE_SCREENSHOTS") == "1"
IN_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
WAIT_S = 20.0


def _require_browser() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("the selenium package (dev extra)")
    if missing:
        why = (
            f"browser tests need {', '.join(missing)}: apt-get install chromium "
            "chromium-driver (.ci/run does)"
        )
        if IN_CI:
            pytest.fail(f"{why}; CI must not skip them", pytrace=False)
        pytest.skip(why)


# ------------------------------------------------------------------------------ the server
@dataclass
class Live:
    url: str
    admin_key: str
    http: httpx.Client

    def headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def new_key(self, role: str, name: str) -> str:
        r = self.http.post(
            "/api-keys", json={"name": name, "role": role}, headers=self.headers(self.admin_key)
        )
        assert r.status_code == 201, r.text
        return str(r.json()["key"])

    def release(self, key: str, dataset_id: str, epsilon: float) -> dict[str, Any]:
        body = {
            "dataset_id": dataset_id,
            "mechanism": "dpmix",
            "params": {"mixture_degree": 8, "n_samples": 300},
            "epsilon": epsilon,
            "format": "npz",
        }
        r = self.http.post("/releases", json=body, headers=self.headers(key))
        assert r.status_code == 202, r.text
        release_id = r.json()["id"]
        deadline = time.monotonic() + 120
        while True:
            got = self.http.get(f"/releases/{release_id}", headers=self.headers(key)).json()
            if got["status"] in TERMINAL:
                assert got["status"] == "succeeded", got
                return dict(got)
            assert time.monotonic() < deadline, got
            time.sleep(0.05)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    _require_browser()
    with pytest.MonkeyPatch.context() as mp:
        for var in [v for v in os.environ if v.startswith("DPRELEASE_") and "TEST" not in v]:
            mp.delenv(var)
        home = tmp_path_factory.mktemp("console") / "home"
        runtime = _embedded_runtime(home)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(runtime=runtime), host="127.0.0.1", port=port, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, name="console-uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=url, timeout=30) as http:
            yield Live(url, (home / "admin.key").read_text().strip(), http)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        runtime.dispatcher.shutdown()
        runtime.engine.dispose()


# ----------------------------------------------------------------------------- the browser
@pytest.fixture
def browser(
    live: Live, monkeypatch: pytest.MonkeyPatch, artifacts: Path, request: pytest.FixtureRequest
) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,1000",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        # The network is closed: no host name but the API's resolves.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    ):
        options.add_argument(arg)
    # Chrome's log of every request it sends (Network.requestWillBeSent), failed ones included.
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    monkeypatch.setenv("SE_OFFLINE", "true")  # Selenium Manager: never download anything
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        # The page as the test left it: what to look at first when it failed.
        with contextlib.suppress(Exception):
            driver.save_screenshot(str(artifacts / f"last-{request.node.name}.png"))
        driver.quit()


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    where = os.environ.get("DPRELEASE_TEST_ARTIFACTS")
    folder = Path(where) / "console" if where else tmp_path / "artifacts"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def wait_until(condition: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except Exception:  # not there yet (stale element, no such element)
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def ready(driver: Any) -> None:
    """The page's script has filled it (body[data-ready]); no error shown."""
    wait_until(
        lambda: (
            driver.execute_script("return document.body.dataset.ready === 'true'")
            or driver.find_element("id", "alert").text
        ),
        "the console page to load",
    )
    assert driver.find_element("id", "alert").text == ""


def requested_urls(driver: Any) -> list[str]:
    """Every URL the browser asked for since the last call: Chrome's request log (failed
    requests included), the page's navigation and its resource timing entries. A request that
    the page's Content-Security-Policy stopped (``blockedReason: csp``) never left the
    browser and is not counted."""
    sent: dict[str, str] = {}
    blocked: set[str] = set()
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        params = message.get("params", {})
        if message.get("method") == "Network.requestWillBeSent":
            sent[params["requestId"]] = params["request"]["url"]
        elif (
            message.get("method") == "Network.loadingFailed"
            and params.get("blockedReason") == "csp"
        ):
            blocked.add(params["requestId"])
    urls = [url for request_id, url in sent.items() if request_id not in blocked]
    stopped = {sent[request_id] for request_id in blocked if request_id in sent} - set(urls)
    # Resource timing lists the stopped requests too (as failed fetches): not counted either.
    urls += [
        url
        for url in driver.execute_script(
            "return [location.href].concat("
            "performance.getEntriesByType('navigation').map(e => e.name),"
            "performance.getEntriesByType('resource').map(e => e.name))"
        )
        if url not in stopped
    ]
    return urls


def script_errors(driver: Any) -> list[str]:
    """The page's console errors, but for the policy refusing ReDoc's footer logo (the one
    foreign URL a vendored bundle asks for: service/console/docs.py)."""
    return [
        e["message"]
        for e in driver.get_log("browser")
        if e["level"] == "SEVERE" and "https://cdn.redoc.ly/redoc/logo-mini.svg" not in e["message"]
    ]


def assert_same_origin(live: Live, urls: list[str], *, key: str | None = None) -> None:
    assert urls
    foreign = [u for u in urls if not u.startswith((live.url + "/", "data:", "blob:"))]
    assert not foreign, f"requests that left the API: {foreign}"
    if key is not None:
        assert not [u for u in urls if key in u], "the API key appeared in a URL"


def tab_to(driver: Any, target: str | Any, limit: int = 30) -> list[str]:
    """Press Tab until ``target`` (an element, or an element's id) has the focus; every
    element reached on the way shows a focus outline. Returns what was reached."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    reached = []
    for _ in range(limit):
        ActionChains(driver).send_keys(Keys.TAB).perform()
        focused = driver.switch_to.active_element
        name = focused.get_attribute("id") or f"{focused.tag_name}:{focused.text}"
        reached.append(name)
        style, width = driver.execute_script(
            "const s = getComputedStyle(document.activeElement);"
            "return [s.outlineStyle, s.outlineWidth];"
        )
        assert style != "none" and width != "0px", f"no visible focus on {name}"
        if focused == target or (isinstance(target, str) and focused.get_attribute("id") == target):
            return reached
    raise AssertionError(f"Tab never reached {target}: {reached}")


def type_and_enter(driver: Any, text: str) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    ActionChains(driver).send_keys(text).send_keys(Keys.ENTER).perform()


# --------------------------------------------------------------------------------- the tests
def test_docs_and_redoc_render_with_the_network_closed(
    live: Live, browser: Any, artifacts: Path
) -> None:
    browser.get(f"{live.url}/docs")
    wait_until(
        lambda: browser.find_elements("css selector", ".swagger-ui .opblock"),
        "Swagger UI to render the operations",
    )
    assert browser.find_elements("css selector", ".swagger-ui .info .title")
    browser.save_screenshot(str(artifacts / "docs.png"))
    assert_same_origin(live, requested_urls(browser))
    assert not script_errors(browser)

    browser.get(f"{live.url}/redoc")
    wait_until(
        lambda: browser.find_elements("xpath", "//h1[contains(., 'dprelease')]"),
        "ReDoc to render the API's title",
    )
    wait_until(
        lambda: browser.find_elements("xpath", "//h2[contains(., 'Budget, spend and release')]"),
        "ReDoc to render the operations",
    )
    browser.save_screenshot(str(artifacts / "redoc.png"))
    assert_same_origin(live, requested_urls(browser))
    assert not script_errors(browser)


def test_console_end_to_end_keyboard_first(live: Live, browser: Any, artifacts: Path) -> None:
    from selenium.webdriver.common.by import By

    owner = live.new_key("owner", "Ada")
    other = live.new_key("owner", "Grace")
    X, y = toy_dataset(n=200)
    meta = {
        "name": "clinic-visits",
        "feature_range": [0, 13],
        "classes": [0, 1, 2],
        "budget": {"epsilon": 4.0, "delta": 1e-5},
    }
    r = live.http.post(
        "/datasets",
        files={"file": ("visits.npz", npz_bytes(X, y))},
        data={"metadata": json.dumps(meta)},
        headers=live.headers(owner),
    )
    assert r.status_code == 201, r.text
    dataset_id = r.json()["id"]
    theirs = live.http.post(
        "/datasets",
        files={"file": ("survey.npz", npz_bytes(*toy_dataset(n=120, seed=1)))},
        data={"metadata": json.dumps({**meta, "name": "survey-2026"})},
        headers=live.headers(other),
    )
    assert theirs.status_code == 201, theirs.text
    for epsilon in (1.0, 0.5, 0.75):
        live.release(owner, dataset_id, epsilon)
    ledger = live.http.get(f"/budgets/{dataset_id}", headers=live.headers(owner)).json()
    assert len(ledger["entries"]) == 3

    # Keyboard only: Tab to the key field (every stop shows its focus), a wrong key first.
    browser.get(f"{live.url}/console")
    assert browser.find_element(By.ID, "signin").is_displayed()
    tab_to(browser, "api-key")
    type_and_enter(browser, "dpr_not-a-key")
    alert = wait_until(lambda: browser.find_element(By.ID, "alert").text, "the 401 alert")
    assert "HTTP 401" in alert
    assert browser.find_element(By.ID, "alert").get_attribute("role") == "alert"
    assert browser.switch_to.active_element.get_attribute("id") == "api-key"
    type_and_enter(browser, owner)
    ready(browser)
    assert browser.execute_script("return sessionStorage.getItem('dprelease.apiKey')") == owner
    assert "Signed in as Ada (owner)" in browser.find_element(By.ID, "who-text").text

    # Datasets: the row with its gauge (reserved 2.25 of 4 under the filter, as the API says).
    row = browser.find_element(By.CSS_SELECTOR, f"tr[data-dataset-id='{dataset_id}']")
    assert "clinic-visits" in row.text and "200" in row.text
    assert "survey-2026" not in browser.find_element(By.ID, "datasets-table").text
    meter = row.find_element(By.TAG_NAME, "meter")
    assert float(meter.get_attribute("max")) == 4.0
    assert float(meter.get_attribute("value")) == pytest.approx(ledger["reserved"], abs=1e-9)
    assert meter.get_attribute("aria-label") == "Budget ε in use, clinic-visits"
    assert f"remaining {round(ledger['remaining'], 3):g}" in row.text
    browser.save_screenshot(str(artifacts / "datasets.png"))

    # On to the dataset by keyboard: Tab to its link, Enter.
    link = row.find_element(By.TAG_NAME, "a")
    tab_to(browser, link)
    type_and_enter(browser, "")
    wait_until(lambda: browser.current_url.endswith(f"/console/datasets/{dataset_id}"), "page")
    ready(browser)
    chart = browser.find_element(By.ID, "ledger-svg")
    assert chart.get_attribute("role") == "img"
    assert chart.find_elements(By.CSS_SELECTOR, "path.composed-line")
    assert chart.find_elements(By.CSS_SELECTOR, "path.basic-line")
    assert "Ledger burn-down" in browser.find_element(By.ID, "ledger-svg-title").get_attribute(
        "textContent"
    )
    rows = browser.find_elements(By.CSS_SELECTOR, "#ledger-body tr")
    assert len(rows) == 3
    last = rows[-1].find_elements(By.TAG_NAME, "td")
    assert float(last[6].text) == pytest.approx(ledger["entries"][-1]["running_total"], abs=1e-3)
    assert float(last[7].text) == pytest.approx(2.25)  # basic composition: 1 + 0.5 + 0.75
    browser.save_screenshot(str(artifacts / "dataset.png"))
    assert_same_origin(live, requested_urls(browser), key=owner)

    # Sign out: the key is gone; sign in as the admin for the budgets.
    browser.find_element(By.ID, "sign-out").click()
    assert browser.execute_script("return sessionStorage.getItem('dprelease.apiKey')") is None
    assert browser.find_element(By.ID, "signin").is_displayed()
    browser.get(f"{live.url}/console/budgets")
    field = browser.find_element(By.ID, "api-key")
    field.send_keys(live.admin_key)
    browser.find_element(By.CSS_SELECTOR, "#signin-form button[type=submit]").click()
    ready(browser)
    budgets = browser.find_element(By.ID, "budgets-table")
    assert "clinic-visits" in budgets.text and "survey-2026" in budgets.text
    assert "every dataset" in browser.find_element(By.ID, "budgets-status").text
    csv_link = browser.find_element(By.ID, "budgets-csv")
    assert csv_link.is_displayed() and csv_link.get_attribute("href").startswith("blob:")
    # Download it as a user would (the page's policy keeps scripts from reading blob: URLs).
    downloads = artifacts / "downloads"
    downloads.mkdir(exist_ok=True)
    browser.execute_cdp_cmd(
        "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}
    )
    csv_link.click()
    saved = downloads / "dprelease-budgets.csv"
    wait_until(saved.is_file, "the CSV download")
    csv_text = saved.read_bytes().decode("utf-8")  # as saved: CRLF line ends kept
    lines = csv_text.strip().split("\r\n")
    assert lines[0].startswith("dataset_id,dataset_name,epsilon,spent,reserved,remaining")
    line = next(x for x in lines[1:] if x.startswith(dataset_id))
    cells = line.split(",")
    assert cells[1] == "clinic-visits" and float(cells[2]) == 4.0
    assert float(cells[4]) == pytest.approx(ledger["reserved"])
    assert cells[-1] == "3"
    shot = artifacts / "budgets.png"
    browser.save_screenshot(str(shot))
    assert_same_origin(live, requested_urls(browser), key=live.admin_key)
    # No script error on any page; the one failed request is the wrong key's 401.
    errors = [e for e in script_errors(browser) if "401 (Unauthorized)" not in e]
    assert not errors, errors
    if UPDATE_SCREENSHOTS:
        target = ROOT / "docs" / "screenshots" / "budgets.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)
