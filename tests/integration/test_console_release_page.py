"""The console's release page in a real browser (issue 17): an image-shaped release followed
to succeeded, its charge and noise as the API says, the sample grid drawn, its file downloaded
byte for byte; a tabular release's histograms; a queued release cancelled from the page. The
harness is tests/integration/console_browser.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest

from tests.conftest import npz_bytes
from tests.integration.console_browser import (
    Live,
    assert_accessible,
    assert_same_origin,
    download_folder,
    ready,
    requested_urls,
    script_errors,
    sign_in,
    wait_until,
)
from tests.integration.test_access_matrix import Held

SIDE = 12


def _glyphs(n: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Three classes of 12 × 12 grey images in [0, 1]: a ring, a vertical bar, a cross, each
    drawn with a little jitter and noise (something a reader recognises in the grid)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:SIDE, :SIDE] - (SIDE - 1) / 2
    ring = (np.abs(np.hypot(yy, xx) - 3.5) < 1.2).astype(float)
    bar = (np.abs(xx) < 1.5).astype(float)
    cross = ((np.abs(xx) < 1.2) | (np.abs(yy) < 1.2)).astype(float)
    shapes = np.stack([ring, bar, cross])
    y = rng.integers(0, 3, size=n)
    X = np.clip(shapes[y] * rng.uniform(0.7, 1.0, size=(n, 1, 1)), 0, 1)
    X = np.clip(X + rng.normal(0, 0.05, size=X.shape), 0, 1)
    return X, y


def _request(live: Live, key: str, dataset_id: str, **overrides: Any) -> str:
    body = {
        "dataset_id": dataset_id,
        "mechanism": "dpmix",
        "params": {"mixture_degree": 8, "n_samples": 200},
        "epsilon": 2.0,
        "format": "npz",
        **overrides,
    }
    r = live.http.post("/releases", json=body, headers=live.headers(key))
    assert r.status_code == 202, r.text
    release_id: str = r.json()["id"]
    return release_id


def _settled(browser: Any, status: str) -> None:
    wait_until(
        lambda: browser.execute_script("return document.body.dataset.releaseSettled") == status,
        f"the release page to show {status}",
        timeout=120,
    )


def _confirm(browser: Any) -> Any:
    """The cancel's confirm dialog, once the page has read the release afresh and asked."""

    def present() -> Any:
        return browser.switch_to.alert  # raises until it is open

    return wait_until(present, "the cancel's confirm dialog")


def _facts(browser: Any, list_id: str) -> dict[str, str]:
    from selenium.webdriver.common.by import By

    terms = browser.find_elements(By.CSS_SELECTOR, f"#{list_id} dt")
    values = browser.find_elements(By.CSS_SELECTOR, f"#{list_id} dd")
    return {t.text: v.text for t, v in zip(terms, values, strict=True)}


def test_image_release_page_grid_and_download(live: Live, browser: Any, artifacts: Path) -> None:
    from selenium.webdriver.common.by import By

    owner = live.new_key("owner", "Ada")
    dataset_id = live.upload(
        owner, "glyphs", npz_bytes(*_glyphs()), feature_range=[0, 1], epsilon=10.0
    )
    # A generous ε, so the grid shows the shapes through the noise.
    release_id = _request(
        live, owner, dataset_id, epsilon=8.0, params={"mixture_degree": 16, "n_samples": 200}
    )

    # Opened at once: the progress bar while it is queued or running, else the final state.
    sign_in(browser, live, f"/console/releases/{release_id}", owner)
    seen_progress = browser.find_element(By.ID, "release-progress-box").is_displayed()
    _settled(browser, "succeeded")
    release = live.http.get(f"/releases/{release_id}", headers=live.headers(owner)).json()
    assert release["status"] == "succeeded"
    assert browser.find_element(By.ID, "release-state").text == "succeeded"
    assert not browser.find_element(By.ID, "release-progress-box").is_displayed()
    assert not browser.find_element(By.ID, "release-cancel-box").is_displayed()
    if seen_progress:  # the change was announced in the polite status region
        assert "succeeded" in browser.find_element(By.ID, "release-live").text

    # Charge and noise as the API says.
    charge = _facts(browser, "charge-facts")
    assert float(charge["ε charged"]) == pytest.approx(release["charge"]["epsilon"], abs=1e-4)
    assert float(charge["σ_x"]) == pytest.approx(release["noise"]["sigma_x"], abs=1e-4)
    assert charge["Noise sampler"] == release["noise"]["sampler"]
    assert charge["Charged as"] == release["charge"]["charged_as"]
    assert charge["Holds for"] == release["neighbour_relation"] == "replace-one (n public)"
    assert charge["Charge"] == release["settlement"]["state"] == "committed"
    noise_rows = browser.find_elements(By.CSS_SELECTOR, "#noise-body tr")
    assert len(noise_rows) == len(release["noise"]["scales"])
    facts = _facts(browser, "release-facts")
    assert facts["Mechanism"] == "dpmix" and facts["Format"] == "npz"
    assert _facts(browser, "artifact-facts")["sha256"] == release["artifact"]["sha256"]

    # The grid: drawn (pixels that are neither blank white nor all one grey), with its text.
    wait_until(lambda: browser.find_element(By.ID, "grid-figure").is_displayed(), "the sample grid")
    levels = browser.execute_script(
        "const c = document.getElementById('sample-grid');"
        "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
        "const seen = new Set(); for (let i = 0; i < d.length; i += 4) seen.add(d[i]);"
        "return [c.width, c.height, seen.size];"
    )
    width, height, distinct = levels
    assert width > 8 * SIDE and height > 8 * SIDE and distinct > 16, levels
    caption = browser.find_element(By.ID, "grid-caption").text
    assert (
        "64 of the release's" in caption
        and "spread evenly" in caption
        and f"{SIDE}×{SIDE}" in caption
    )
    # Image rows get the label columns' histograms only.
    titles = [
        t.get_attribute("textContent")
        for t in browser.find_elements(By.CSS_SELECTOR, "#histograms svg title")
    ]
    assert titles == [f"Histogram of label={k}" for k in range(3)]

    # Download: fetched with the key, saved from a Blob; the same bytes as the API's.
    folder = download_folder(browser, artifacts, "release-downloads")
    browser.find_element(By.ID, "download-release").click()
    saved = folder / f"release-{release_id}.npz"
    wait_until(saved.is_file, "the release download")
    api = live.http.get(f"/releases/{release_id}/download", headers=live.headers(owner))
    assert api.status_code == 200
    wait_until(lambda: saved.read_bytes() == api.content, "the whole file saved")
    assert "Saved" in browser.find_element(By.ID, "download-status").text

    browser.execute_script("window.scrollTo(0, 0)")
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1280, min(2600, height + 40))
    shot = artifacts / "release.png"
    browser.save_screenshot(str(shot))
    assert_accessible(browser)
    assert_same_origin(live, requested_urls(browser), key=owner)
    assert not script_errors(browser)


def test_tabular_histograms_and_cancel_from_the_page(
    live: Live, browser: Any, artifacts: Path
) -> None:
    from selenium.webdriver.common.by import By

    owner = live.new_key("owner", "Grace")
    dataset_id = live.upload(owner, "visits", epsilon=10.0)
    held_out = live.upload(owner, "held-out", rows=100, seed=1, epsilon=10.0)
    release_id = _request(live, owner, dataset_id, format="csv", report_test_dataset_id=held_out)
    sign_in(browser, live, f"/console/releases/{release_id}", owner)
    _settled(browser, "succeeded")
    summary = live.http.get(f"/releases/{release_id}/summary", headers=live.headers(owner))
    histograms = summary.json()["histograms"]
    wait_until(
        lambda: (
            len(browser.find_elements(By.CSS_SELECTOR, "#histograms figure")) == len(histograms)
        ),
        "a histogram per column",
    )
    # What the bars leave out is said in words beside them.
    for figure, hist in zip(
        browser.find_elements(By.CSS_SELECTOR, "#histograms figure"), histograms, strict=True
    ):
        notes = figure.find_elements(By.CLASS_NAME, "histogram-notes")
        if hist["missing"]:
            assert f"{hist['missing']} missing" in notes[0].text
        if not (hist["missing"] or hist["below"] or hist["above"]):
            assert not notes
    assert browser.find_element(By.ID, "grid-figure").is_displayed() is False
    first = browser.find_element(By.CSS_SELECTOR, "#histograms figure svg")
    assert first.get_attribute("role") == "img"
    assert first.find_elements(By.TAG_NAME, "rect")
    # The counts' table (the chart's text alternative) in its disclosure.
    figure = browser.find_element(By.CSS_SELECTOR, "#histograms figure")
    figure.find_element(By.TAG_NAME, "summary").click()
    cells = figure.find_elements(By.CSS_SELECTOR, "tbody td")
    counts = summary.json()["histograms"][0]["counts"]
    assert [int(c.text) for c in cells] == counts
    # The metadata.json beside a CSV release is listed for download too.
    assert browser.find_elements(By.XPATH, "//button[.='Download metadata.json']")
    # The owner's utility report: a row per classifier, as the API's report says.
    report = live.http.get(f"/releases/{release_id}/report", headers=live.headers(owner)).json()
    wait_until(
        lambda: browser.find_element(By.ID, "report-table").is_displayed(), "the report table"
    )
    rows = browser.find_elements(By.CSS_SELECTOR, "#report-body tr")
    assert [r.find_element(By.TAG_NAME, "th").text for r in rows] == list(report["accuracy"])
    first_accuracy = rows[0].find_elements(By.TAG_NAME, "td")[0].text
    assert float(first_accuracy) == pytest.approx(next(iter(report["accuracy"].values())), abs=1e-3)
    assert "owner only" in browser.find_element(By.ID, "report-visibility").text

    browser.execute_script("document.getElementById('samples-heading').scrollIntoView()")
    browser.save_screenshot(str(artifacts / "release-tabular.png"))
    assert_accessible(browser)

    # A release that stays queued (a dispatcher that hands nothing over), cancelled from its
    # page after the confirm step: refunded, shown as cancelled.
    dispatcher = live.runtime.dispatcher
    live.runtime.dispatcher = Held()
    try:
        queued = _request(live, owner, dataset_id)
    finally:
        live.runtime.dispatcher = dispatcher
    browser.get(f"{live.url}/console/releases/{queued}")
    ready(browser)
    assert browser.find_element(By.ID, "release-state").text == "queued"
    assert browser.find_element(By.ID, "release-progress-box").is_displayed()
    # The page and the confirm say what a cancel now does with the charge: no job read the
    # data yet, so it is refunded (the release's if_cancelled).
    assert "refunds its charge" in browser.find_element(By.ID, "release-cancel-charge").text
    button = browser.find_element(By.ID, "release-cancel")
    button.click()
    dialog = _confirm(browser)
    assert "refunds its charge (ε = 2" in dialog.text
    dialog.dismiss()  # thought better of it: nothing happens
    time.sleep(0.3)
    assert (
        live.http.get(f"/releases/{queued}", headers=live.headers(owner)).json()["status"]
        == "queued"
    )
    button.click()
    _confirm(browser).accept()
    _settled(browser, "cancelled")
    assert browser.find_element(By.ID, "release-state").text == "cancelled"
    assert "refunded" in browser.find_element(By.ID, "release-live").text
    assert _facts(browser, "charge-facts")["Charge"] == "refunded"
    assert not browser.find_element(By.ID, "release-cancel-box").is_displayed()
    after = live.http.get(f"/releases/{queued}", headers=live.headers(owner)).json()
    assert after["status"] == "cancelled"
    browser.save_screenshot(str(artifacts / "release-cancelled.png"))
    assert_accessible(browser)
    assert_same_origin(live, requested_urls(browser), key=owner)
    assert not script_errors(browser)


# ------------------------------------------------------------------------ without a browser
def test_release_shell_escapes_its_id_and_keeps_the_strict_policy() -> None:
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.config import Settings

    client = TestClient(create_app(Settings.model_construct()))  # no runtime: no lifespan
    r = client.get('/console/releases/x"><img src=x onerror=alert(1)>')
    assert r.status_code == 200
    assert 'data-page="release"' in r.text and "/console/static/pages/release.js" in r.text
    assert "<img src=x" not in r.text
    assert 'data-release-id="x&#34;&gt;&lt;img src=x onerror=alert(1)&gt;"' in r.text
    assert "connect-src 'self';" in r.headers["content-security-policy"]
    assert client.get("/console/static/pages/release.js").status_code == 200


@pytest.mark.parametrize(("mode", "admitted"), [("presigned", True), ("stream", False)])
def test_presigned_downloads_admit_the_object_stores_public_origin(
    mode: Literal["presigned", "stream"], admitted: bool
) -> None:
    """A presigned download redirects the page's fetch to the object store: the policy's
    connect-src names that origin (the public endpoint's), and only in that mode."""
    from types import SimpleNamespace

    from service.config import Settings
    from service.console.endpoints import _headers
    from service.storage import S3ObjectStore

    settings = Settings(  # type: ignore[call-arg]
        s3_endpoint_url="http://minio:9000",
        s3_public_endpoint_url="https://objects.example.org:8443",
        s3_bucket="releases",
        s3_access_key_id="key",
        s3_secret_access_key="secret",  # type: ignore[arg-type]
        download_mode=mode,
    )
    runtime = SimpleNamespace(settings=settings, store=S3ObjectStore(settings))
    request = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(runtime=runtime)))
    policy = _headers(request)["Content-Security-Policy"]  # type: ignore[arg-type]
    expected = "connect-src 'self' https://objects.example.org:8443;"
    assert (expected in policy) is admitted
    assert ("connect-src 'self';" in policy) is not admitted
    assert "minio" not in policy
