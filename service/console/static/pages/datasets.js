// dprelease console: the datasets page and the upload form (docs/console.md).
(() => {
  "use strict";

  const { $, api, ApiError, el, errorText, gauge, idempotencyKey, setStatus } = window.dprelease;

  async function datasetsPage(me) {
    const { items } = await api("/datasets");
    const body = $("datasets-body");
    body.replaceChildren();
    for (const ds of items) {
      const link = el("a", { href: `/console/datasets/${encodeURIComponent(ds.id)}` }, ds.name);
      body.append(
        el(
          "tr",
          { "data-dataset-id": ds.id },
          el("th", { scope: "row" }, link),
          el("td", { class: "num" }, ds.n_rows),
          el("td", { class: "num" }, ds.n_features),
          el("td", {}, ds.status),
          el("td", {}, gauge(ds.budget, `Budget ε in use, ${ds.name}`)),
        ),
      );
    }
    $("datasets-table").hidden = items.length === 0;
    setStatus(
      "datasets-status",
      items.length ? `${items.length} dataset${items.length === 1 ? "" : "s"}.` : "No datasets yet.",
    );
    // POST /datasets admits owner keys only: the others get a line saying so, not a form
    // that would only answer 403.
    const owner = me.role === "owner";
    $("upload-form").hidden = !owner;
    $("upload-who").hidden = owner;
  }

  // ------------------------------------------------------------------------- the upload
  const trimmed = (id) => $(id).value.trim();

  // A number field as the service will read it: empty is left out, anything else is sent
  // as typed (NaN goes as null) so that the service's own message explains what is wrong.
  function numberOf(text) {
    return text === "" ? undefined : Number(text);
  }

  // "0, 1, 2" → [0, 1, 2]; labels that are not whole numbers stay text.
  function classesOf(text) {
    if (!text) return undefined;
    return text
      .split(",")
      .map((c) => c.trim())
      .filter((c) => c !== "")
      .map((c) => (/^-?\d+$/.test(c) ? Number(c) : c));
  }

  function advancedOf(text) {
    if (!text) return {};
    let value;
    try {
      value = JSON.parse(text);
    } catch (error) {
      throw new Error(`Advanced metadata is not valid JSON: ${error.message}`);
    }
    if (value === null || typeof value !== "object" || Array.isArray(value)) {
      throw new Error("Advanced metadata must be a JSON object, e.g. {\"columns\": [...]}");
    }
    return value;
  }

  // The metadata part of POST /datasets: the fields that were filled, then the advanced
  // JSON over them. The service validates the whole (service/datasets/schemas.py).
  function metadataOf() {
    const meta = { name: trimmed("upload-name") };
    const epsilon = numberOf(trimmed("upload-epsilon"));
    const delta = numberOf(trimmed("upload-delta"));
    if (epsilon !== undefined || delta !== undefined) meta.budget = { epsilon, delta };
    const label = trimmed("upload-label");
    if (label) meta.label_column = label;
    const classes = classesOf(trimmed("upload-classes"));
    if (classes) meta.classes = classes;
    const lo = numberOf(trimmed("upload-lo"));
    const hi = numberOf(trimmed("upload-hi"));
    if (lo !== undefined || hi !== undefined) meta.feature_range = [lo ?? null, hi ?? null];
    return Object.assign(meta, advancedOf(trimmed("upload-advanced")));
  }

  // The service's message, and its detail items when it gives them (a validation error's
  // {"errors": [{"loc", "msg"}]}), in the form's alert, which takes the focus.
  function showUploadError(error) {
    const alert = $("upload-alert");
    alert.replaceChildren();
    if (error instanceof ApiError) {
      alert.append(el("p", {}, errorText(error)));
      const items = detailItems(error.detail);
      if (items.length) alert.append(el("ul", {}, ...items.map((text) => el("li", {}, text))));
    } else {
      alert.append(el("p", {}, error && error.message ? error.message : String(error)));
    }
    alert.focus();
  }

  function detailItems(detail) {
    if (!detail || typeof detail !== "object") return [];
    if (Array.isArray(detail.errors)) {
      return detail.errors.map((e) => `${(e.loc || []).join(".")}: ${e.msg}`);
    }
    return Object.entries(detail).map(([name, value]) => `${name}: ${JSON.stringify(value)}`);
  }

  async function upload(event) {
    event.preventDefault();
    const button = $("upload-submit");
    if (button.disabled) return;
    $("upload-alert").replaceChildren();
    let form;
    try {
      form = new FormData();
      const file = $("upload-file").files[0];
      if (file) form.append("file", file, file.name);
      form.append("metadata", JSON.stringify(metadataOf()));
    } catch (error) {
      showUploadError(error);
      return;
    }
    button.disabled = true;
    $("upload-form").setAttribute("aria-busy", "true");
    setStatus("upload-status", "Uploading…");
    try {
      const ds = await api("/datasets", { form, headers: { "Idempotency-Key": idempotencyKey() } });
      setStatus("upload-status", `Uploaded ${ds.name}. Opening its page…`);
      window.location.assign(`/console/datasets/${encodeURIComponent(ds.id)}`);
    } catch (error) {
      // The input stays as typed: the user corrects it and submits again.
      setStatus("upload-status", "");
      showUploadError(error);
    } finally {
      button.disabled = false;
      $("upload-form").removeAttribute("aria-busy");
    }
  }

  $("upload-form").addEventListener("submit", upload);

  window.dprelease.pages.datasets = datasetsPage;
})();
