"""The console in a real browser (issue 17): /docs and /redoc with the network closed, and the
console's first pages keyboard first. The harness (server, browser, helpers) is
tests/integration/console_browser.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.console_browser import (
    Live,
    assert_accessible,
    assert_same_origin,
    axe_violations,
    download_folder,
    downloaded,
    publish,
    ready,
    requested_urls,
    script_errors,
    tab_to,
    type_and_enter,
    wait_until,
)


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
    dataset_id = live.upload(owner, "clinic-visits")
    live.upload(other, "survey-2026", rows=120, seed=1)
    for epsilon in (1.0, 0.5, 0.75):
        live.release(owner, dataset_id, epsilon)
    ledger = live.http.get(f"/budgets/{dataset_id}", headers=live.headers(owner)).json()
    assert len(ledger["entries"]) == 3

    # Keyboard only: Tab to the key field (every stop shows its focus), a wrong key first.
    browser.get(f"{live.url}/console")
    assert browser.find_element(By.ID, "signin").is_displayed()
    assert_accessible(browser)
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
    # In words: what is in use (settled and in flight, counted once) and what is left.
    assert f"in use ε {round(ledger['reserved'], 3):g} of 4" in row.text
    assert f"left {round(ledger['remaining'], 3):g}" in row.text
    browser.save_screenshot(str(artifacts / "datasets.png"))
    assert_accessible(browser)
    # The check can fail: an unlabelled input and an image without a text alternative.
    browser.execute_script(
        "const main = document.getElementById('main');"
        "main.append(Object.assign(document.createElement('input'), {className: 'axe-probe'}));"
        "main.append(Object.assign(document.createElement('img'), {className: 'axe-probe'}));"
    )
    found = " ".join(axe_violations(browser))
    assert "label" in found and "image-alt" in found, found
    browser.execute_script("document.querySelectorAll('.axe-probe').forEach(n => n.remove())")
    assert_accessible(browser)

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
    assert_accessible(browser)
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
    folder = download_folder(browser, artifacts)
    csv_link.click()
    saved = folder / "dprelease-budgets.csv"
    csv_text = downloaded(saved).decode("utf-8")  # as saved: CRLF line ends kept
    lines = csv_text.strip().split("\r\n")
    assert lines[0].startswith("dataset_id,dataset_name,epsilon,spent,reserved,remaining")
    line = next(x for x in lines[1:] if x.startswith(dataset_id))
    cells = line.split(",")
    assert cells[1] == "clinic-visits" and float(cells[2]) == 4.0
    assert float(cells[4]) == pytest.approx(ledger["reserved"])
    assert cells[-1] == "3"
    shot = artifacts / "budgets.png"
    browser.save_screenshot(str(shot))
    assert_accessible(browser)
    assert_same_origin(live, requested_urls(browser), key=live.admin_key)
    # No script error on any page; the one failed request is the wrong key's 401.
    errors = [e for e in script_errors(browser) if "401 (Unauthorized)" not in e]
    assert not errors, errors
    publish(shot, "budgets.png")
