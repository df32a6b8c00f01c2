"""The console's management pages in a real browser (issue 17): the upload form with the
service's validation messages, a dataset's releases, grants and ledger CSV, the budgets page's
ledger entries and their CSV, and the admin's audit trail with filters and paging. The harness
(server, browser, helpers) is tests/integration/console_browser.py.
"""

from __future__ import annotations

import csv
import io
import json
import re
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.config import Settings
from tests.conftest import npz_bytes, toy_dataset
from tests.integration.console_browser import (
    Live,
    assert_accessible,
    assert_same_origin,
    download_folder,
    downloaded,
    ready,
    requested_urls,
    script_errors,
    sign_in,
    tab_to,
    type_and_enter,
    wait_until,
)

# Failed requests the tests cause on purpose (a refused upload, a refused grant): Chrome logs
# each as a console error.
EXPECTED_FAILURES = ("422 (Unprocessable",)


def _principal_id(live: Live, key: str) -> str:
    return str(live.http.get("/me", headers=live.headers(key)).json()["principal_id"])


def _read_csv(path: Path) -> list[dict[str, str]]:
    text = downloaded(path).decode("utf-8")
    return list(csv.DictReader(io.StringIO(text, newline="")))


def _audit_rows(browser: Any) -> list[list[str]]:
    from selenium.webdriver.common.by import By

    return [
        [cell.text for cell in row.find_elements(By.TAG_NAME, "td")]
        for row in browser.find_elements(By.CSS_SELECTOR, "#audit-body tr")
    ]


def _grew_or_ended(browser: Any, before: int) -> bool:
    """The audit page shows more rows than before, or no more Load more button."""
    from selenium.webdriver.common.by import By

    more = browser.find_element(By.ID, "audit-more")
    return len(_audit_rows(browser)) > before or not more.is_displayed()


def _no_script_errors(browser: Any) -> None:
    errors = [e for e in script_errors(browser) if not any(f in e for f in EXPECTED_FAILURES)]
    assert not errors, errors


def _upload_through_the_form(browser: Any, npz: Path) -> None:
    """Keyboard first: Tab to the form's fields and type; a budget ε ≤ 0 first."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    form = browser.find_element(By.ID, "upload-form")
    assert form.is_displayed()
    assert not browser.find_element(By.ID, "upload-who").is_displayed()
    # Nothing filled in: the service's message and its detail items (the missing file).
    browser.find_element(By.ID, "upload-submit").click()
    alert = wait_until(lambda: browser.find_element(By.ID, "upload-alert").text, "the alert")
    assert "HTTP 422" in alert
    items = browser.find_elements(By.CSS_SELECTOR, "#upload-alert li")
    assert "body.file: Field required" in [i.text for i in items]
    tab_to(browser, "upload-file")
    browser.find_element(By.ID, "upload-file").send_keys(str(npz))
    for field, text in (
        ("upload-name", "ward-admissions"),
        ("upload-epsilon", "-1"),
        ("upload-classes", "0, 1, 2"),
        ("upload-lo", "0"),
        ("upload-hi", "13"),
    ):
        tab_to(browser, field)
        ActionChains(browser).send_keys(text).perform()
    tab_to(browser, "upload-submit")
    type_and_enter(browser, "")


@pytest.mark.parametrize(
    ("path", "page"),
    [
        ("/console", "datasets"),
        ("/console/datasets/d1", "dataset"),
        ("/console/budgets", "budgets"),
        ("/console/audit", "audit"),
    ],
)
def test_every_control_has_a_label_and_the_audit_page_its_policy(path: str, page: str) -> None:
    client = TestClient(create_app(Settings.model_construct()))  # shells only: no runtime
    r = client.get(path)
    assert r.status_code == 200, r.text
    assert f'data-page="{page}"' in r.text
    assert r.headers["content-security-policy"].startswith("default-src 'self'")
    assert r.headers["referrer-policy"] == "no-referrer"
    controls = re.findall(r"<(?:input|select|textarea)\b[^>]*\bid=\"([^\"]+)\"", r.text)
    assert controls
    for control in controls:
        assert f'<label for="{control}">' in r.text, control
    assert 'id="nav-audit"' in r.text  # hidden until an admin signs in


def test_upload_grants_releases_and_ledger_csv(
    live: Live, browser: Any, artifacts: Path, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    owner = live.new_key("owner", "Ada")
    analyst = live.new_key("analyst", "Lin")
    analyst_id = _principal_id(live, analyst)
    npz = tmp_path / "admissions.npz"
    npz.write_bytes(npz_bytes(*toy_dataset(n=160)))

    # The upload: a refused budget ε shows the service's message; the input stays.
    browser.get(f"{live.url}/console")
    tab_to(browser, "api-key")
    type_and_enter(browser, owner)
    ready(browser)
    assert not browser.find_element(By.ID, "nav-audit").is_displayed()
    _upload_through_the_form(browser, npz)
    alert = browser.find_element(By.ID, "upload-alert")
    text = wait_until(lambda: alert.text, "the upload's alert")
    assert "budget.epsilon" in text and "greater than 0" in text and "HTTP 422" in text
    assert browser.switch_to.active_element == alert
    assert browser.find_element(By.ID, "upload-name").get_attribute("value") == "ward-admissions"
    assert browser.find_element(By.ID, "upload-classes").get_attribute("value") == "0, 1, 2"
    assert browser.find_element(By.ID, "upload-submit").is_enabled()
    browser.save_screenshot(str(artifacts / "upload-refused.png"))
    assert_accessible(browser)

    # Corrected: it lands on the new dataset's page.
    epsilon = browser.find_element(By.ID, "upload-epsilon")
    epsilon.clear()
    epsilon.send_keys("3")
    browser.find_element(By.ID, "upload-submit").click()
    wait_until(lambda: "/console/datasets/" in browser.current_url, "the dataset's page")
    ready(browser)
    dataset_id = browser.current_url.rsplit("/", 1)[1]
    got = live.http.get(f"/datasets/{dataset_id}", headers=live.headers(owner)).json()
    assert got["name"] == "ward-admissions" and got["n_rows"] == 160
    assert got["budget"]["epsilon"] == 3.0 and got["classes"] == [0, 1, 2]
    assert "ward-admissions" in browser.find_element(By.ID, "dataset-heading").text
    new_release = browser.find_element(By.ID, "new-release")
    assert new_release.get_attribute("href").endswith(f"/console/datasets/{dataset_id}/new-release")

    # A release: the releases table and the ledger link to its page (not built here: the
    # links are only checked).
    release = live.release(owner, dataset_id, 0.5)
    browser.refresh()
    ready(browser)
    rows = browser.find_elements(By.CSS_SELECTOR, "#releases-body tr")
    assert len(rows) == 1 and "succeeded" in rows[0].text and "dpmix" in rows[0].text
    href = f"/console/releases/{release['id']}"
    assert rows[0].find_element(By.TAG_NAME, "a").get_attribute("href").endswith(href)
    ledger_link = browser.find_element(By.CSS_SELECTOR, "#ledger-body a")
    assert ledger_link.get_attribute("href").endswith(href)

    # The ledger CSV, downloaded and read back: the entries of GET /budgets/{id}.
    downloads = download_folder(browser, artifacts)
    browser.find_element(By.ID, "ledger-csv").click()
    lines = _read_csv(downloads / f"dprelease-ledger-{dataset_id}.csv")
    ledger = live.http.get(f"/budgets/{dataset_id}", headers=live.headers(owner)).json()
    assert [x["release_id"] for x in lines] == [e["release_id"] for e in ledger["entries"]]
    for line, entry in zip(lines, ledger["entries"], strict=True):
        assert line["dataset_id"] == dataset_id and line["dataset_name"] == "ward-admissions"
        assert float(line["epsilon"]) == pytest.approx(entry["epsilon"])
        assert float(line["running_total"]) == pytest.approx(entry["running_total"])
        assert line["state"] == entry["state"]
        assert json.loads(line["params"]) == entry["params"]

    # Grants: a principal that is no analyst is refused with the service's message; the
    # analyst is granted, then revoked.
    grant_path = f"/datasets/{dataset_id}/grants"
    field = browser.find_element(By.ID, "grant-principal")
    field.send_keys(_principal_id(live, owner))
    browser.find_element(By.ID, "grant-submit").click()
    refused = wait_until(lambda: browser.find_element(By.ID, "grants-alert").text, "refusal")
    assert "is not an analyst" in refused and "HTTP 422" in refused
    field.clear()
    field.send_keys(analyst_id)
    browser.find_element(By.ID, "grant-submit").click()
    item = wait_until(
        lambda: browser.find_element(By.CSS_SELECTOR, "#grants-list li[data-grant-id]"), "grant"
    )
    assert analyst_id in item.text
    assert browser.find_element(By.ID, "grants-alert").text == ""
    grants = live.http.get(grant_path, headers=live.headers(owner)).json()["items"]
    assert [g["principal_id"] for g in grants] == [analyst_id]
    browser.save_screenshot(str(artifacts / "dataset-manage.png"))
    assert_accessible(browser)
    item.find_element(By.TAG_NAME, "button").click()
    browser.switch_to.alert.accept()
    wait_until(
        lambda: not browser.find_elements(By.CSS_SELECTOR, "#grants-list li"), "the revocation"
    )
    assert live.http.get(grant_path, headers=live.headers(owner)).json()["items"] == []
    assert_same_origin(live, requested_urls(browser), key=owner)
    _no_script_errors(browser)

    # The analyst, granted again: the releases, but no grant form, no ledger, no Audit link.
    r = live.http.post(grant_path, json={"principal_id": analyst_id}, headers=live.headers(owner))
    assert r.status_code == 201, r.text
    sign_in(browser, live, f"/console/datasets/{dataset_id}", analyst)
    rows = browser.find_elements(By.CSS_SELECTOR, "#releases-body tr")
    assert len(rows) == 1 and release["id"] in rows[0].text
    assert not browser.find_element(By.ID, "grant-form").is_displayed()
    assert not browser.find_element(By.ID, "grants-section").is_displayed()
    assert not browser.find_element(By.ID, "new-release").is_displayed()
    assert not browser.find_element(By.ID, "nav-audit").is_displayed()
    browser.save_screenshot(str(artifacts / "dataset-analyst.png"))
    assert_accessible(browser)

    # The analyst's datasets page: no upload form, a line saying who may upload.
    browser.get(f"{live.url}/console")
    ready(browser)
    assert not browser.find_element(By.ID, "upload-form").is_displayed()
    assert "owner keys" in browser.find_element(By.ID, "upload-who").text
    assert_same_origin(live, requested_urls(browser), key=analyst)
    _no_script_errors(browser)


def test_budgets_ledger_entries_and_the_audit_trail(
    live: Live, browser: Any, artifacts: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.select import Select

    owner = live.new_key("owner", "Grace")
    analyst = live.new_key("analyst", "Sam")
    analyst_id = _principal_id(live, analyst)
    dataset_id = live.upload(owner, "survey-2026", rows=120, seed=1, epsilon=2.0)
    live.release(owner, dataset_id, 0.25)
    grant_path = f"/datasets/{dataset_id}/grants"
    grant = live.http.post(
        grant_path, json={"principal_id": analyst_id}, headers=live.headers(owner)
    ).json()
    gone = live.http.delete(f"{grant_path}/{grant['id']}", headers=live.headers(owner))
    assert gone.status_code == 204

    # The budgets page: a dataset's entries on demand, every dataset's entries in one CSV.
    sign_in(browser, live, "/console/budgets", live.admin_key)
    assert browser.find_element(By.ID, "nav-audit").is_displayed()
    button = browser.find_element(By.CSS_SELECTOR, f"button[data-entries-for='{dataset_id}']")
    assert button.get_attribute("aria-expanded") == "false"
    button.click()
    entries = wait_until(lambda: browser.find_element(By.ID, f"entries-{dataset_id}"), "entries")
    assert button.get_attribute("aria-expanded") == "true"
    assert "dpmix" in entries.text and "committed" in entries.text
    browser.save_screenshot(str(artifacts / "budgets-entries.png"))
    assert_accessible(browser)
    downloads = download_folder(browser, artifacts)
    browser.find_element(By.ID, "ledger-csv-build").click()
    link = wait_until(lambda: browser.find_element(By.ID, "ledger-csv"), "the ledger CSV link")
    wait_until(link.is_displayed, "the ledger CSV link shown")
    assert browser.switch_to.active_element == link
    link.click()
    lines = _read_csv(downloads / "dprelease-ledger.csv")
    budgets = live.http.get("/budgets", headers=live.headers(live.admin_key)).json()["items"]
    expected = []
    for b in budgets:
        ledger = live.http.get(
            f"/budgets/{b['dataset_id']}", headers=live.headers(live.admin_key)
        ).json()
        expected += [
            (b["dataset_id"], b["dataset_name"], e["release_id"]) for e in ledger["entries"]
        ]
    assert [(x["dataset_id"], x["dataset_name"], x["release_id"]) for x in lines] == expected
    assert any(x["dataset_name"] == "survey-2026" for x in lines)

    # The audit trail, keyboard to the filter: grants only, one event a page.
    browser.find_element(By.ID, "nav-audit").click()
    ready(browser)
    assert browser.find_element(By.ID, "audit-table").is_displayed()
    tab_to(browser, "audit-object-type")
    Select(browser.find_element(By.ID, "audit-object-type")).select_by_value("grant")
    limit = browser.find_element(By.ID, "audit-limit")
    limit.clear()
    limit.send_keys("1")
    browser.find_element(By.ID, "audit-apply").click()
    wait_until(lambda: "object_type=grant" in browser.current_url, "the filters in the URL")
    wait_until(lambda: len(_audit_rows(browser)) == 1, "one event")
    more = browser.find_element(By.ID, "audit-more")
    pages = 1
    while more.is_displayed():
        before = len(_audit_rows(browser))
        more.click()
        wait_until(partial(_grew_or_ended, browser, before), "the next page")
        pages += 1
    every = live.http.get(
        "/audit", params={"object_type": "grant"}, headers=live.headers(live.admin_key)
    ).json()["items"]
    shown = [(cells[2], cells[4]) for cells in _audit_rows(browser)]
    assert shown == [(e["action"], e["object_id"]) for e in every]
    assert pages > len(every)  # one event a page, and the last page empty
    assert ("grant.created", grant["id"]) in shown and ("grant.revoked", grant["id"]) in shown
    assert {cells[3] for cells in _audit_rows(browser)} == {"grant"}
    browser.save_screenshot(str(artifacts / "audit.png"))
    assert_accessible(browser)

    # Its CSV: the loaded rows.
    browser.find_element(By.ID, "audit-csv").click()
    lines = _read_csv(downloads / "dprelease-audit.csv")
    assert [(x["action"], x["object_id"]) for x in lines] == shown
    assert json.loads(lines[0]["detail"]) == every[0]["detail"]

    # The filters survive a reload (they are in the address; the key is not).
    browser.refresh()
    ready(browser)
    assert (
        Select(
            browser.find_element(By.ID, "audit-object-type")
        ).first_selected_option.get_attribute("value")
        == "grant"
    )
    wait_until(lambda: len(_audit_rows(browser)) == 1, "the first page again")
    assert_same_origin(live, requested_urls(browser), key=live.admin_key)

    # A local "since" goes to the API as RFC 3339 UTC: nothing after the year 2999.
    browser.execute_script("document.getElementById('audit-since').value = '2999-01-01T00:00'")
    browser.find_element(By.ID, "audit-apply").click()
    wait_until(lambda: not _audit_rows(browser), "no event")
    assert "No events match" in browser.find_element(By.ID, "audit-status").text
    # (the browser's time zone shifts the day by up to one)
    assert re.search(r"since=(2998-12-31|2999-01-01)T\d\d%3A\d\d%3A00\.000Z", browser.current_url)
    assert browser.find_element(By.ID, "alert").text == ""

    # An owner sees no Audit link, and the page says it is for admins.
    sign_in(browser, live, "/console/audit", owner)
    assert not browser.find_element(By.ID, "nav-audit").is_displayed()
    assert "admins only" in browser.find_element(By.ID, "audit-who").text
    assert not browser.find_element(By.ID, "audit-main").is_displayed()
    assert_same_origin(live, requested_urls(browser), key=owner)
    _no_script_errors(browser)
