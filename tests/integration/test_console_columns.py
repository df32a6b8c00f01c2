"""The upload form declares a table's columns without JSON: names read from the CSV's header
(in the browser, names only), each column's type, bounds or categories and missing-value
policy set with form controls; the dataset is stored with exactly that declaration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.integration.console_browser import (
    Live,
    assert_accessible,
    ready,
    script_errors,
    sign_in,
    wait_until,
)

CSV = "site,visits,weight,outcome\n" + "".join(
    f"{'AB'[i % 2]},{'' if i % 7 == 0 else i % 20},{40 + i % 80}.5,{i % 3 == 0:d}\n"
    for i in range(200)
)


def _set(browser: Any, element_id: str, text: str) -> None:
    from selenium.webdriver.common.by import By

    field = browser.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(text)


def test_columns_are_declared_with_the_form(live: Live, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    owner = live.new_key("owner", "Ada")
    data = tmp_path / "visits.csv"
    data.write_text(CSV)
    sign_in(browser, live, "/console", owner)
    browser.find_element(By.ID, "upload-file").send_keys(str(data))
    for element_id, text in {
        "upload-name": "visits",
        "upload-epsilon": "3",
        "upload-delta": "1e-5",
        "upload-label": "outcome",
        "upload-classes": "0, 1",
    }.items():
        _set(browser, element_id, text)
    # The header's names, the label column left out; nothing else is read off the file.
    browser.find_element(By.ID, "columns-read").click()
    rows = wait_until(
        lambda: browser.find_elements(By.CSS_SELECTOR, "#columns-list fieldset.column") or None,
        "the columns read from the header",
    )
    names = [r.find_element(By.CSS_SELECTOR, "input[id$='-name']") for r in rows]
    assert [n.get_attribute("value") for n in names] == ["site", "visits", "weight"]
    assert all(
        r.find_element(By.CSS_SELECTOR, "input[id$='-categories']").get_attribute("value") == ""
        for r in rows
    )
    ids = [r.get_attribute("data-column") for r in rows]
    site, visits, weight = (lambda part, k=k: f"column-{k}-{part}" for k in ids)
    Select(browser.find_element(By.ID, site("type"))).select_by_value("categorical")
    assert not browser.find_element(By.ID, site("lo")).is_displayed()
    _set(browser, site("categories"), "A, B, C")
    Select(browser.find_element(By.ID, visits("type"))).select_by_value("integer")
    _set(browser, visits("lo"), "0")
    _set(browser, visits("hi"), "20")
    Select(browser.find_element(By.ID, visits("missing"))).select_by_value("indicator")
    _set(browser, weight("lo"), "40")
    _set(browser, weight("hi"), "120")
    assert_accessible(browser)
    browser.find_element(By.ID, "upload-submit").click()
    wait_until(lambda: "/console/datasets/" in browser.current_url, "the new dataset's page")
    ready(browser)
    dataset_id = browser.current_url.rsplit("/", 1)[-1]
    dataset = live.http.get(f"/datasets/{dataset_id}", headers=live.headers(owner)).json()
    assert dataset["columns"] == [
        {"name": "site", "type": "categorical", "categories": ["A", "B", "C"], "missing": None},
        {
            "name": "visits",
            "type": "numeric",
            "bounds": [0.0, 20.0],
            "integer": True,
            "missing": {"policy": "indicator", "fill": None},
        },
        {
            "name": "weight",
            "type": "numeric",
            "bounds": [40.0, 120.0],
            "integer": False,
            "missing": None,
        },
    ]
    assert script_errors(browser) == []


def test_csv_cells_that_read_as_formulas_are_defused(live: Live, browser: Any) -> None:
    """The console's CSV exports prefix an apostrophe to text a spreadsheet would run as a
    formula (OWASP's prefixes), leading whitespace included; numbers and plain text stay."""
    owner = live.new_key("owner", "Ada")
    sign_in(browser, live, "/console", owner)
    cell = "return window.dprelease.csvCell(arguments[0]);"
    for text in ("=1+1", " =1+1", "\t=1+1", "+1", "-1", "@SUM(A1)", "  @x", "\r=1"):
        assert browser.execute_script(cell, text).lstrip('"').startswith("'"), repr(text)
    assert browser.execute_script(cell, "clinic visits") == "clinic visits"
    assert browser.execute_script(cell, -1.5) == "-1.5"
