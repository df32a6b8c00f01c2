"""The console end to end in a real browser (issue 17's "Done when"): an owner uploads a dataset
through the upload form, previews a release on the new-release page, confirms it, follows it on
the release page to its end, downloads it, and an admin finds the spend on the budgets page.
Every page on the way passes the axe-core check, sends no request off the API's origin and
puts no key in a URL. The harness (server, browser, helpers) is
tests/integration/console_browser.py.

The data is the MNIST test split shipped in shared/ (10 000 digits; 10 000 synthetic images of
the same shape when it is absent), released by DP-CDA at ε = 1 with the free ``denoise``
post-processing chosen in the generated params form, so the release page's screenshot, which
the README shows, is a grid of released digits like Fig. 1 of the DPMix paper
(``DPRELEASE_UPDATE_SCREENSHOTS=1`` rewrites docs/screenshots/release.png; only from MNIST).
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests import mnist
from tests.integration.console_browser import (
    Live,
    assert_accessible,
    assert_same_origin,
    download_folder,
    publish,
    ready,
    requested_urls,
    script_errors,
    sign_in,
    tab_to,
    type_and_enter,
    wait_until,
)

N_SYNTHETIC = 10_000  # MNIST-10k's shape: DP-CDA's default DP class counts fit ε = 1 at this n
BUDGET_EPSILON = 3.0
RELEASE_EPSILON = 1.0
# DP-CDA: class-centric mixtures, exact labels; its samples look like digits at ε = 1.
MECHANISM = "dpcda"


def digits() -> tuple[np.ndarray, np.ndarray, bool]:
    """(images uint8 (n, 28, 28), labels, from MNIST?)."""
    if mnist.available():
        images, labels = mnist.load_mnist_t10k()
        return images, labels.astype(np.int64), True
    # Without shared/: strokes on a 28 × 28 canvas, one pattern per class, with noise.
    rng = np.random.default_rng(17)
    labels = rng.integers(0, 10, N_SYNTHETIC)
    images = rng.integers(0, 40, (N_SYNTHETIC, 28, 28)).astype(np.uint8)
    for i, c in enumerate(labels):
        images[i, 4 + 2 * c : 8 + 2 * c, 4:24] = 230
        images[i, 4:24, 4 + 2 * c : 7 + 2 * c] = 200
    return images, labels, False


def npz_file(path: Path, X: np.ndarray, y: np.ndarray) -> Path:
    buffer = io.BytesIO()
    np.savez(buffer, X=X, y=y)
    path.write_bytes(buffer.getvalue())
    return path


def test_upload_preview_release_download_budgets(
    live: Live, browser: Any, artifacts: Path, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    owner = live.new_key("owner", "Ada")
    X, y, real = digits()
    data = npz_file(tmp_path / "digits.npz", X, y)

    # Sign in and upload through the form.
    sign_in(browser, live, "/console", owner)
    assert browser.find_element(By.ID, "upload-form").is_displayed()
    browser.find_element(By.ID, "upload-file").send_keys(str(data))
    fields = {
        "upload-name": "mnist-digits",
        "upload-epsilon": str(BUDGET_EPSILON),
        "upload-delta": "1e-5",
        "upload-classes": ", ".join(str(c) for c in range(10)),
        "upload-lo": "0",
        "upload-hi": "255",
    }
    for element_id, text in fields.items():
        field = browser.find_element(By.ID, element_id)
        field.clear()  # some come filled with a suggestion (δ 1e-5)
        field.send_keys(text)
    assert_accessible(browser)
    browser.find_element(By.ID, "upload-submit").click()
    wait_until(lambda: "/console/datasets/" in browser.current_url, "the new dataset's page")
    ready(browser)
    dataset_id = browser.current_url.rsplit("/", 1)[-1]
    dataset = live.http.get(f"/datasets/{dataset_id}", headers=live.headers(owner)).json()
    assert dataset["name"] == "mnist-digits" and dataset["n_rows"] == len(y)
    assert dataset["feature_shape"] == [28, 28]
    assert "mnist-digits" in browser.find_element(By.ID, "dataset-heading").text
    assert_accessible(browser)

    # New release: choose the mechanism and ε; the preview shows the API's σ and charge.
    browser.find_element(By.ID, "new-release").click()
    wait_until(lambda: browser.current_url.endswith("/new-release"), "the new-release page")
    ready(browser)
    Select(browser.find_element(By.ID, "mechanism")).select_by_value(MECHANISM)
    # The params form is generated from the mechanism's schema: pick the free post-processing.
    postprocess = wait_until(lambda: browser.find_element(By.ID, "param-postprocess"), "params")
    # An advanced parameter: open the group first.
    browser.find_element(By.CSS_SELECTOR, "#params-advanced > summary").click()
    Select(postprocess).select_by_value("denoise")
    epsilon = browser.find_element(By.ID, "epsilon")
    epsilon.clear()
    epsilon.send_keys(str(RELEASE_EPSILON))
    body = {
        "dataset_id": dataset_id,
        "mechanism": MECHANISM,
        "params": {"postprocess": "denoise"},
        "epsilon": RELEASE_EPSILON,
    }
    preview = live.http.post("/releases/preview", json=body, headers=live.headers(owner))
    assert preview.status_code == 200, preview.text
    expected = preview.json()

    def shown_sigma() -> float | None:
        value = browser.execute_script(
            "const p = document.getElementById('preview');"
            "const n = document.getElementById('preview-sigma-x');"
            "return p.dataset.state === 'ready' && n ? n.dataset.value : null"
        )
        if value is None or float(value) != pytest.approx(expected["noise"]["sigma_x"], rel=1e-9):
            return None
        return float(value)

    wait_until(shown_sigma, "the preview of ε 1")
    remaining = browser.find_element(By.ID, "preview-remaining").text
    assert remaining.startswith(f"{BUDGET_EPSILON:g} → ")
    assert browser.find_element(By.ID, "preview-admissible").text == "yes"
    assert_accessible(browser)

    # Confirm: one release, and the browser follows it on its page.
    browser.find_element(By.ID, "request-release").click()
    confirm = wait_until(
        lambda: (
            browser.find_element(By.ID, "confirm-panel").is_displayed()
            and browser.find_element(By.ID, "confirm-release")
        ),
        "the confirmation",
    )
    assert_accessible(browser)
    confirm.click()
    wait_until(lambda: "/console/releases/" in browser.current_url, "the release's page")
    release_id = browser.current_url.rsplit("/", 1)[-1]
    ready(browser)
    wait_until(
        lambda: browser.find_element(By.ID, "release-state").text == "succeeded",
        "the release to succeed",
        timeout=180,
    )
    release = live.http.get(f"/releases/{release_id}", headers=live.headers(owner)).json()
    assert release["status"] == "succeeded" and release["mechanism"] == MECHANISM
    assert release["charge"]["epsilon"] == pytest.approx(RELEASE_EPSILON, rel=1e-6)
    assert release["params"]["postprocess"] == "denoise"

    # The sample grid is drawn (a canvas that is not blank) before the screenshot.
    wait_until(
        lambda: browser.execute_script(
            "const c = document.getElementById('sample-grid');"
            "if (!c || c.closest('[hidden]') || !c.width) return false;"
            "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
            "let lit = 0; for (let i = 0; i < d.length; i += 4) if (d[i] > 60) lit++;"
            "return lit > 100;"
        ),
        "the sample grid",
    )

    # Download: the saved file is the release's artifact, byte for byte.
    folder = download_folder(browser, artifacts, "walkthrough-downloads")
    # By keyboard: Tab from the top of the page to the Download button (every stop shows its
    # focus), Enter.
    button = browser.find_element(By.CSS_SELECTOR, "#download-list button")
    browser.execute_script("document.activeElement.blur(); window.scrollTo(0, 0)")
    tab_to(browser, button)
    type_and_enter(browser, "")
    saved = folder / f"release-{release_id}.npz"
    wait_until(
        lambda: saved.is_file() and saved.stat().st_size == release["artifact"]["bytes"],
        "the release's download",
    )
    assert hashlib.sha256(saved.read_bytes()).hexdigest() == release["artifact"]["sha256"]
    # The whole page in one picture (status, download, the grid, charge and noise).
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1280, min(int(height) + 140, 4000))
    browser.execute_script("window.scrollTo(0, 0)")
    shot = artifacts / "walkthrough-release.png"
    browser.save_screenshot(str(shot))
    browser.set_window_size(1280, 1000)
    assert_accessible(browser)
    assert_same_origin(live, requested_urls(browser), key=owner)
    if real:
        publish(shot, "release.png")

    # Budgets, as the admin: the dataset's spend is the release's charge.
    browser.find_element(By.ID, "sign-out").click()
    sign_in(browser, live, "/console/budgets", live.admin_key)
    budget = next(
        b
        for b in live.http.get("/budgets", headers=live.headers(live.admin_key)).json()["items"]
        if b["dataset_id"] == dataset_id
    )
    assert budget["spent"] == pytest.approx(release["charge"]["consumed_epsilon"], rel=1e-9)
    row = browser.find_element(By.CSS_SELECTOR, f"#budgets-body tr[data-dataset-id='{dataset_id}']")
    cells = [c.text for c in row.find_elements(By.CSS_SELECTOR, "th, td")]
    assert cells[0] == "mnist-digits"
    assert float(cells[1]) == BUDGET_EPSILON
    assert float(cells[2]) == pytest.approx(budget["spent"], abs=1e-3)
    assert float(cells[4]) == pytest.approx(budget["remaining"], abs=1e-3)
    browser.save_screenshot(str(artifacts / "walkthrough-budgets.png"))
    assert_accessible(browser)
    assert_same_origin(live, requested_urls(browser), key=live.admin_key)
    assert not script_errors(browser)
