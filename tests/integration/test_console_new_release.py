"""The console's new-release page in a real browser (issue 17): the params form generated from
GET /mechanisms' schemas, the live preview against the API's own, the service's 422 shown,
the confirmation (one release for a double click) and the keyboard-only pass. The harness
(server, browser, helpers) is tests/integration/console_browser.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.console_browser import (
    Live,
    assert_accessible,
    assert_same_origin,
    publish,
    ready,
    requested_urls,
    script_errors,
    sign_in,
    tab_to,
    type_and_enter,
    wait_until,
)


def api_preview(live: Live, key: str, body: dict[str, Any]) -> Any:
    return live.http.post("/releases/preview", json=body, headers=live.headers(key))


def page_preview(browser: Any) -> tuple[str, float | None]:
    """The preview's state and the σ_x it shows (its exact figure, in data-value)."""
    state = browser.execute_script("return document.getElementById('preview').dataset.state")
    sigma = browser.execute_script(
        "const n = document.getElementById('preview-sigma-x');"
        "return n && !document.getElementById('preview-body').hidden ? n.dataset.value : null"
    )
    return state, None if sigma is None else float(sigma)


def wait_for_sigma(browser: Any, expected: float) -> float:
    def shown() -> float | None:
        state, sigma = page_preview(browser)
        ok = state == "ready" and sigma is not None and sigma == pytest.approx(expected, rel=1e-9)
        return sigma if ok else None

    return float(wait_until(shown, f"the preview to show σ_x {expected}"))


def set_value(browser: Any, element_id: str, text: str) -> None:
    from selenium.webdriver.common.by import By

    field = browser.find_element(By.ID, element_id)
    field.clear()
    if text:
        field.send_keys(text)


def param_labels(browser: Any) -> dict[str, str]:
    """The generated params fields: property name -> its label's text."""
    from selenium.webdriver.common.by import By

    labels = browser.find_elements(By.CSS_SELECTOR, "#params-fields label")
    # textContent: an advanced parameter's label is in a closed <details> (not rendered).
    return {
        label.get_attribute("for").removeprefix("param-"): label.get_attribute("textContent")
        for label in labels
        if label.get_attribute("for")
    }


def fields_are(browser: Any, names: Iterable[str]) -> Callable[[], bool]:
    """A condition: the generated params fields are exactly ``names``."""
    expected = set(names)
    return lambda: set(param_labels(browser)) == expected


def control_for(prop: dict[str, Any]) -> tuple[str, str | None]:
    """The control the generator makes for a property: (tag, input type)."""
    kinds = [s for s in prop.get("anyOf", [prop]) if s.get("type") != "null"]
    schema = kinds[0] if len(kinds) == 1 else {}
    if all(isinstance(v, str) for v in schema.get("enum", [0])):
        return "select", None
    if schema.get("type") in ("integer", "number"):
        return "input", "number"
    if schema.get("type") == "boolean":
        return "input", "checkbox"
    if schema.get("type") == "string":
        return "input", "text"
    return "textarea", None  # objects, arrays, unions: JSON


def test_new_release_form_preview_and_confirm(live: Live, browser: Any, artifacts: Path) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    owner = live.new_key("owner", "Ada")
    # 2 000 rows: every mechanism's defaults are admissible at the ε the test previews (DP-CDA's
    # default DP class counts alone would cost more than ε = 2 on a few hundred rows).
    dataset_id = live.upload(owner, "clinic-visits", rows=2000)
    page = f"{live.url}/console/datasets/{dataset_id}/new-release"
    mechanisms = live.http.get("/mechanisms", headers=live.headers(owner)).json()["items"]
    by_name = {m["name"]: m for m in mechanisms}
    default = next(m for m in mechanisms if m["kind"] != "baseline")

    sign_in(browser, live, page.removeprefix(live.url), owner)
    assert "New release: clinic-visits" in browser.find_element(By.ID, "release-heading").text
    assert (
        Select(browser.find_element(By.ID, "mechanism")).first_selected_option.get_attribute(
            "value"
        )
        == default["name"]
    )
    # Baselines are labelled as such in the select.
    for option in Select(browser.find_element(By.ID, "mechanism")).options:
        baseline = by_name[option.get_attribute("value")]["kind"] == "baseline"
        assert ("(baseline)" in option.text) == baseline

    # One labelled field per property of the mechanism's params schema.
    properties = default["params_schema"]["properties"]
    labels = param_labels(browser)
    assert set(labels) == set(properties)
    for name in properties:
        assert name in labels[name]
        field = browser.find_element(By.ID, f"param-{name}")
        hint = field.get_attribute("aria-describedby")
        assert browser.find_element(By.ID, hint).get_attribute("textContent")
    # The essential parameters are shown; the rest wait, closed, under "Advanced" — and no
    # hint cites a repository path.
    essentials = default["essential_params"]
    assert essentials and all(
        browser.find_element(By.ID, f"param-{n}").is_displayed() for n in essentials
    )
    advanced = browser.find_element(By.ID, "params-advanced")
    assert advanced.get_attribute("open") is None
    others = [n for n in properties if n not in essentials]
    assert f"Advanced parameters ({len(others)})" in advanced.text
    assert not any(browser.find_element(By.ID, f"param-{n}").is_displayed() for n in others)
    form_text = browser.find_element(By.ID, "release-form").get_attribute("textContent")
    assert "docs/" not in form_text and ".md" not in form_text and ".py" not in form_text

    # Only accountants that are valid bounds for releases are offered.
    accountants = [
        o.get_attribute("value") for o in Select(browser.find_element(By.ID, "accountant")).options
    ]
    assert accountants == [
        a["name"] for a in default["accountants"] if a["releases"] and a["valid_bound"]
    ]

    # The live preview against the API's for the same body: σ falls as ε grows.
    base = {"dataset_id": dataset_id, "mechanism": default["name"], "params": {}}
    sigmas = []
    for epsilon in ("0.5", "2"):
        set_value(browser, "epsilon", epsilon)
        expected = api_preview(live, owner, {**base, "epsilon": float(epsilon)})
        assert expected.status_code == 200, expected.text
        sigmas.append(wait_for_sigma(browser, expected.json()["noise"]["sigma_x"]))
    assert sigmas[1] < sigmas[0]
    remaining = browser.find_element(By.ID, "preview-remaining").text
    assert remaining.startswith("4 → ")
    assert browser.find_element(By.ID, "preview-admissible").text == "yes"
    assert browser.find_element(By.ID, "preview-after-meter").get_attribute("max") == "4"
    shot = artifacts / "new-release.png"
    browser.set_window_size(1280, 2000)  # the whole form and its preview
    browser.save_screenshot(str(shot))
    assert_accessible(browser)
    browser.set_window_size(1280, 1000)

    # An invalid value: the service's own 422 message, beside the form; the focus stays.
    field = "mixture_degree" if "mixture_degree" in properties else next(iter(properties))
    set_value(browser, f"param-{field}", "0")
    refused = api_preview(live, owner, {**base, "epsilon": 2.0, "params": {field: 0}})
    assert refused.status_code == 422
    message = refused.json()["error"]["message"]
    error = wait_until(
        lambda: message in browser.find_element(By.ID, "preview-error").text, "the 422 message"
    )
    assert error
    assert browser.find_element(By.ID, "preview-error").get_attribute("role") == "status"
    assert browser.find_element(By.ID, f"param-{field}").get_attribute("aria-invalid") == "true"
    assert browser.switch_to.active_element.get_attribute("id") == f"param-{field}"
    set_value(browser, f"param-{field}", "")
    wait_until(lambda: page_preview(browser)[0] == "ready", "the preview again")
    assert browser.find_element(By.ID, "preview-error").text == ""

    # Another mechanism: the params fields are generated again from its schema.
    other = next(m for m in mechanisms if m["name"] != default["name"] and m["kind"] != "baseline")
    Select(browser.find_element(By.ID, "mechanism")).select_by_value(other["name"])
    wait_until(
        fields_are(browser, other["params_schema"]["properties"]),
        "the other mechanism's params fields",
    )
    expected = api_preview(live, owner, {**base, "mechanism": other["name"], "epsilon": 2.0})
    assert expected.status_code == 200, expected.text
    wait_for_sigma(browser, expected.json()["noise"]["sigma_x"])

    # Every mechanism's form: a control of the property's type for each, or a JSON field.
    for mechanism in mechanisms:
        Select(browser.find_element(By.ID, "mechanism")).select_by_value(mechanism["name"])
        schema = mechanism["params_schema"]["properties"]
        wait_until(fields_are(browser, schema), mechanism["name"])
        for name, prop in schema.items():
            control = browser.find_element(By.ID, f"param-{name}")
            tag, kind = control_for(prop)
            got = (control.tag_name, control.get_attribute("type") if kind else None)
            assert got == (tag, kind), (mechanism["name"], name)
    Select(browser.find_element(By.ID, "mechanism")).select_by_value(other["name"])
    wait_until(lambda: page_preview(browser)[0] in ("ready", "error"), "a preview")

    # Fixed noise: σ as given, ε as the API reports it.
    browser.find_element(By.ID, "mode-noise").click()
    set_value(browser, "sigma_x", "1.5")
    fixed = api_preview(
        live, owner, {**base, "mechanism": other["name"], "noise": {"sigma_x": 1.5}}
    ).json()
    wait_for_sigma(browser, 1.5)
    charge = float(browser.find_element(By.ID, "preview-charge").get_attribute("data-epsilon"))
    assert charge == pytest.approx(fixed["charge"]["epsilon"], rel=1e-9)
    browser.find_element(By.ID, "mode-epsilon").click()
    Select(browser.find_element(By.ID, "mechanism")).select_by_value(default["name"])
    wait_until(fields_are(browser, properties), "the default's fields")

    # "Use recommended" fills the params the preview recommends for this mechanism.
    answer = api_preview(live, owner, {**base, "epsilon": 2.0}).json()
    recommended = next(r for r in answer["recommended"] if r["mechanism"] == default["name"])
    wait_for_sigma(browser, answer["noise"]["sigma_x"])
    # The preview in a sentence, with what the study measured for this mechanism.
    summary = browser.find_element(By.ID, "preview-summary").text
    assert summary and "docs/" not in summary
    if recommended["measured_on"] is not None:
        assert f"{recommended['measured_on']['score']:.2f}" in summary
    # The short list: the mechanisms measured best here, best first, each with a button.
    ranked = sorted(
        (r for r in answer["recommended"] if r["kind"] != "baseline" and r["measured_on"]),
        key=lambda r: -r["measured_on"]["score"],
    )[:3]
    items = browser.find_elements(By.CSS_SELECTOR, "#recommended-list li")
    assert [i.text.split(":")[0] for i in items] == [r["mechanism"] for r in ranked]
    browser.find_element(By.ID, "use-recommended").click()
    for name, value in recommended["params"].items():
        assert browser.find_element(By.ID, f"param-{name}").get_attribute("value") == str(value)
    filled = api_preview(live, owner, {**base, "epsilon": 2.0, "params": recommended["params"]})
    wait_for_sigma(browser, filled.json()["noise"]["sigma_x"])

    # Keyboard only, from the top of a fresh page: Tab through the form to the Request button
    # (every stop shows its focus), Enter opens the confirmation with the focus on its heading.
    browser.get(page)
    ready(browser)
    # The default target ε: half the remaining budget, at most 1.
    assert browser.find_element(By.ID, "epsilon").get_attribute("value") == "1"
    expected = api_preview(live, owner, {**base, "epsilon": 1.0}).json()
    wait_for_sigma(browser, expected["noise"]["sigma_x"])
    reached = tab_to(browser, "request-release", limit=80)
    for stop in ("mechanism", "epsilon", "accountant", "format", "noise_sampler"):
        assert stop in reached
    # The essential parameters, in the schema's order; the closed "Advanced" group is one
    # stop (its summary), its fields none.
    assert [f"param-{name}" for name in properties if name in essentials] == [
        r for r in reached if r.startswith("param-")
    ]
    type_and_enter(browser, "")
    wait_until(lambda: browser.find_element(By.ID, "confirm-panel").is_displayed(), "the panel")
    assert browser.switch_to.active_element.get_attribute("id") == "confirm-heading"
    assert not browser.find_element(By.ID, "release-form").is_displayed()
    assert default["name"] in browser.find_element(By.ID, "confirm-mechanism").text
    shown = float(f"{expected['charge']['epsilon']:.4g}")  # the page's four digits
    assert browser.find_element(By.ID, "confirm-charge").text.startswith(f"ε {shown:g},")
    browser.save_screenshot(str(artifacts / "new-release-confirm.png"))
    assert_accessible(browser)
    # Back (keyboard) returns to the form with the focus on the Request button.
    tab_to(browser, "confirm-back", limit=5)
    type_and_enter(browser, "")
    wait_until(lambda: browser.find_element(By.ID, "release-form").is_displayed(), "the form")
    assert browser.switch_to.active_element.get_attribute("id") == "request-release"
    assert_same_origin(live, requested_urls(browser), key=owner)
    # No script error; the one failed request is the invalid value's preview (its 422).
    refusal = (
        "/releases/preview - Failed to load resource: the server responded with a status of 422"
    )
    errors = [e for e in script_errors(browser) if refusal not in e]
    assert not errors, errors

    # The budget moves while the panel is open (a release of 3.5 through the API): Confirm is
    # refused with the service's 409, shown in the alert, and the form is back.
    type_and_enter(browser, "")
    wait_until(lambda: browser.find_element(By.ID, "confirm-panel").is_displayed(), "the panel")
    elsewhere = live.release(owner, dataset_id, 3.5)
    browser.find_element(By.ID, "confirm-release").click()
    alert = wait_until(lambda: browser.find_element(By.ID, "alert").text, "the 409 alert")
    assert "HTTP 409" in alert and "budget_exceeded" in alert
    assert browser.find_element(By.ID, "release-form").is_displayed()
    assert browser.switch_to.active_element.get_attribute("id") == "request-release"
    wait_until(
        lambda: browser.find_element(By.ID, "preview-admissible").text.startswith("no"),
        "the preview of the budget as it is now",
    )

    # Within what remains, Confirm double-clicked: one release, and the browser on its page.
    set_value(browser, "epsilon", "0.4")
    expected = api_preview(live, owner, {**base, "epsilon": 0.4}).json()
    assert expected["budget"]["admissible"]
    wait_for_sigma(browser, expected["noise"]["sigma_x"])
    type_and_enter(browser, "")  # Enter in the ε field submits the form
    confirm = wait_until(
        lambda: (
            browser.find_element(By.ID, "confirm-panel").is_displayed()
            and browser.find_element(By.ID, "confirm-release")
        ),
        "the Confirm button",
    )
    ActionChains(browser).double_click(confirm).perform()
    wait_until(lambda: "/console/releases/" in browser.current_url, "the release's page")
    releases = live.http.get(
        "/releases", params={"dataset_id": dataset_id}, headers=live.headers(owner)
    ).json()["items"]
    ours = [r for r in releases if r["id"] != elsewhere["id"]]
    assert len(ours) == 1, releases
    release = ours[0]
    assert release["mechanism"] == default["name"]
    assert release["charge"]["epsilon"] == pytest.approx(0.4, rel=1e-3)
    assert browser.current_url == f"{live.url}/console/releases/{release['id']}"
    # The release page takes over: the release's own id, followed to its end.
    ready(browser)
    wait_until(
        lambda: release["id"] in browser.find_element(By.ID, "release-heading").text,
        "the release page",
    )
    assert_same_origin(live, requested_urls(browser), key=owner)
    # The refused Confirm's 409 is the only failed request.
    expected_failures = (
        f"{live.url}/releases - Failed to load resource: the server responded with a status of 409",
    )
    errors = [e for e in script_errors(browser) if not e.startswith(expected_failures)]
    assert not errors, errors
    publish(shot, "new_release.png")


def test_new_release_page_offers_no_form_to_an_analyst(
    live: Live, browser: Any, artifacts: Path
) -> None:
    from selenium.webdriver.common.by import By

    owner = live.new_key("owner", "Grace")
    analyst = live.new_key("analyst", "Alan")
    dataset_id = live.upload(owner, "clinic-visits")
    me = live.http.get("/me", headers=live.headers(analyst)).json()
    r = live.http.post(
        f"/datasets/{dataset_id}/grants",
        json={"principal_id": me["principal_id"]},
        headers=live.headers(owner),
    )
    assert r.status_code == 201, r.text

    sign_in(browser, live, f"/console/datasets/{dataset_id}/new-release", analyst)
    status = browser.find_element(By.ID, "release-status").text
    assert "Only the dataset's owner" in status and "analyst" in status
    assert not browser.find_element(By.ID, "release-form").is_displayed()
    assert not browser.find_element(By.ID, "confirm-panel").is_displayed()
    browser.save_screenshot(str(artifacts / "new-release-analyst.png"))
    assert_accessible(browser)
    assert_same_origin(live, requested_urls(browser), key=analyst)
    assert not script_errors(browser)


def test_new_release_shell_escapes_the_id_under_the_strict_policy(live: Live) -> None:
    r = live.http.get('/console/datasets/x"><img src=x onerror=alert(1)>/new-release')
    assert r.status_code == 200, r.text
    assert 'data-page="new_release"' in r.text
    assert "<img src=x" not in r.text
    assert 'data-dataset-id="x&#34;&gt;&lt;img src=x onerror=alert(1)&gt;"' in r.text
    policy = r.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "style-src 'self'" in policy
    assert "/console/static/pages/new_release.js" in r.text
    assert live.http.get("/console/static/pages/new_release.js").status_code == 200
    # Every control of the shell has a label.
    for control in re.findall(r"<(?:input|select|textarea)\b[^>]*\bid=\"([^\"]+)\"", r.text):
        assert f'for="{control}"' in r.text or control in ("mode-epsilon", "mode-noise"), control
