"""The console's browser harness (issue 17): headless Chromium (the Debian ``chromium`` and
``chromium-driver`` packages, driven by Selenium; no browser is downloaded) against the
embedded app served by uvicorn on a free port, and the helpers the browser tests share.

The browser's network is closed: every host name other than the API's resolves to nothing
(``--host-resolver-rules``), and Chrome's own log of every request it sent is checked to hold
same-origin URLs only (:func:`requested_urls`, :func:`assert_same_origin`).

Screenshots (PNG) go to ``$DPRELEASE_TEST_ARTIFACTS/console/`` (else the test's tmp_path),
the last page of each test included; ``DPRELEASE_UPDATE_SCREENSHOTS=1`` lets a test copy a
screenshot to docs/screenshots/ for the README (:func:`publish`). Without chromium,
chromedriver or selenium the fixtures skip, except under CI (``CI`` set), where they fail: CI
never skips the browser tests silently (``.ci/run`` installs the packages).

The fixtures ``live``, ``browser`` and ``artifacts`` reach the tests through
tests/integration/conftest.py.
"""

from __future__ import annotations

import contextlib
import hashlib
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
    # The app's runtime, for tests that need a seam (a dispatcher that queues nothing).
    runtime: Any = None

    def headers(self, key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def new_key(self, role: str, name: str) -> str:
        r = self.http.post(
            "/api-keys", json={"name": name, "role": role}, headers=self.headers(self.admin_key)
        )
        assert r.status_code == 201, r.text
        return str(r.json()["key"])

    def upload(
        self,
        key: str,
        name: str,
        content: bytes | None = None,
        *,
        epsilon: float = 4.0,
        feature_range: Any = (0, 13),
        rows: int = 200,
        seed: int = 0,
    ) -> str:
        """A dataset uploaded through the API: ``content`` (an NPZ; default ``rows`` toy rows
        of three classes, ``seed``) under ``name`` with a budget of ``epsilon`` and δ 1e-5."""
        if content is None:
            content = npz_bytes(*toy_dataset(n=rows, seed=seed))
        meta = {
            "name": name,
            "feature_range": list(feature_range),
            "classes": [0, 1, 2],
            "budget": {"epsilon": epsilon, "delta": 1e-5},
        }
        r = self.http.post(
            "/datasets",
            files={"file": (f"{name}.npz", content)},
            data={"metadata": json.dumps(meta)},
            headers=self.headers(key),
        )
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

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
            yield Live(url, (home / "admin.key").read_text().strip(), http, runtime)
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


def download_folder(driver: Any, artifacts: Path, name: str = "downloads") -> Path:
    """An empty folder ``artifacts/name`` where the browser saves what the page downloads.
    Emptied first: Chrome saves a second file of the same name as "name (1).ext", and
    $DPRELEASE_TEST_ARTIFACTS outlives a run."""
    folder = artifacts / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    driver.execute_cdp_cmd(
        "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(folder)}
    )
    return folder


def downloaded(path: Path) -> bytes:
    """The bytes the browser saved at ``path``, once there are any: Chrome may show the file
    at its final name before its content is written."""
    wait_until(path.is_file, f"the download {path.name}")
    content: bytes = wait_until(path.read_bytes, f"{path.name}'s content")
    return content


def sign_in(driver: Any, live: Live, path: str, key: str) -> None:
    """Open ``path`` signed out (a key left from an earlier sign-in goes first), sign in with
    ``key`` and wait for the page to fill."""
    from selenium.webdriver.common.by import By

    if driver.current_url.startswith(live.url):
        driver.execute_script("sessionStorage.clear()")
    driver.get(f"{live.url}{path}")
    driver.find_element(By.ID, "api-key").send_keys(key)
    driver.find_element(By.CSS_SELECTOR, "#signin-form button[type=submit]").click()
    ready(driver)


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


def publish(shot: Path, name: str) -> None:
    """Copy a screenshot to docs/screenshots/``name`` for the README, when asked to
    (``DPRELEASE_UPDATE_SCREENSHOTS=1``)."""
    if UPDATE_SCREENSHOTS:
        target = ROOT / "docs" / "screenshots" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)


# ------------------------------------------------------------------------ accessibility
AXE = ROOT / "tests" / "vendor" / "axe-core" / "axe.min.js"
# The bundle's sha256, as tests/vendor/axe-core/README.md records it.
AXE_SHA256 = "29348999450cdf2849a8e70b7912fc2da85a849da39c0d0d5394f51d4a9ed95c"
# WCAG 2.0, 2.1 and 2.2 at levels A and AA: what docs/console.md promises.
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa"]


def _axe_source() -> str:
    data = AXE.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    assert digest == AXE_SHA256, f"{AXE} is not the vendored axe-core 4.14.1 ({digest})"
    return data.decode("utf-8")


def axe_violations(driver: Any) -> list[str]:
    """axe-core's WCAG 2.x A/AA violations on the page as it is now, one line per rule with
    the offending nodes' selectors. The bundle is injected through the driver (DevTools
    evaluates it outside the page's Content-Security-Policy): the console serves no test
    code. Hidden parts of the page (the sign-in form once signed in) are not checked, as
    axe skips what is not rendered."""
    if not driver.execute_script("return typeof window.axe === 'object'"):
        driver.execute_script(_axe_source())
    driver.set_script_timeout(60)
    result = driver.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {runOnly: {type: 'tag', values: arguments[0]},"
        " resultTypes: ['violations']})"
        ".then(r => done(r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,"
        " nodes: v.nodes.map(n => n.target.join(' '))}))))"
        ".catch(e => done([{id: 'axe-error', impact: 'critical', help: String(e), nodes: []}]));",
        AXE_TAGS,
    )
    return [f"{v['id']} ({v['impact']}): {v['help']} — {', '.join(v['nodes'][:5])}" for v in result]


def assert_accessible(driver: Any) -> None:
    """No axe-core WCAG 2.x A/AA violation on the page as it is now."""
    violations = axe_violations(driver)
    assert not violations, "accessibility violations:\n" + "\n".join(violations)
