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

  // ------------------------------------------------------------------ declared columns
  // A table's columns declared with a form, not JSON: one row per column (name, type,
  // bounds or categories, what a missing entry means). "Read the names from the file" reads
  // a CSV's header line in this browser (nothing is sent): the column names only, never a
  // value, since bounds and categories must be the owner's public declaration, not facts read
  // off the private rows.
  const COLUMN_TYPES = [
    ["numeric", "Number"],
    ["integer", "Whole number"],
    ["categorical", "Category"],
  ];
  const MISSING = [
    ["", "Refuse the upload"],
    ["indicator", "Mark as missing (kept in releases)"],
    ["constant", "Replace with a value"],
  ];
  let columnSeq = 0;

  function selectOf(id, options) {
    return el(
      "select",
      { id },
      ...options.map(([value, text]) => el("option", { value }, text)),
    );
  }

  function field(id, text, control, hint) {
    const parts = [el("label", { for: id }, text), control];
    if (hint) {
      control.setAttribute("aria-describedby", `${id}-hint`);
      parts.push(el("p", { id: `${id}-hint`, class: "hint" }, hint));
    }
    return el("div", { class: "column-field" }, ...parts);
  }

  function addColumn(name) {
    const k = ++columnSeq;
    const id = (part) => `column-${k}-${part}`;
    const nameInput = el("input", { id: id("name"), type: "text", autocomplete: "off", value: name || "" });
    const type = selectOf(id("type"), COLUMN_TYPES);
    const lo = el("input", { id: id("lo"), type: "number", step: "any", inputmode: "decimal" });
    const hi = el("input", { id: id("hi"), type: "number", step: "any", inputmode: "decimal" });
    const categories = el("input", { id: id("categories"), type: "text", autocomplete: "off" });
    const missing = selectOf(id("missing"), MISSING);
    const fill = el("input", { id: id("fill"), type: "text", autocomplete: "off" });
    const remove = el("button", { type: "button", class: "secondary", id: id("remove") }, "Remove column");
    const bounds = el(
      "div",
      { class: "column-bounds" },
      field(id("lo"), "Lowest value", lo),
      field(id("hi"), "Highest value", hi, "Public bounds: values outside are clipped."),
    );
    const cats = field(id("categories"), "Categories", categories, "Every category the column may hold, comma-separated (public).");
    const fillField = field(id("fill"), "Value for a missing entry", fill, "A number within the bounds, or one of the categories; empty with 'Mark as missing': the middle of the bounds (none for a category).");
    const row = el(
      "fieldset",
      { class: "column", "data-column": String(k) },
      el("legend", {}, name ? `Column ${name}` : "Column"),
      field(id("name"), "Name", nameInput),
      field(id("type"), "Type", type),
      bounds,
      cats,
      field(id("missing"), "Missing entries", missing),
      fillField,
      remove,
    );
    const sync = () => {
      const categorical = type.value === "categorical";
      bounds.hidden = categorical;
      cats.hidden = !categorical;
      fillField.hidden = missing.value === "";
      row.querySelector("legend").textContent = nameInput.value.trim() ? `Column ${nameInput.value.trim()}` : "Column";
    };
    for (const control of [type, missing, nameInput]) control.addEventListener("input", sync);
    for (const control of [type, missing]) control.addEventListener("change", sync);
    remove.addEventListener("click", () => {
      row.remove();
      setStatus("columns-status", "Column removed.");
    });
    sync();
    $("columns-list").append(row);
    return row;
  }

  // "0, 1, 2" → [0, 1, 2] (whole numbers as numbers, the rest as text).
  const listOf = (text) => classesOf(text) || [];

  function columnOf(row) {
    const k = row.dataset.column;
    const value = (part) => $(`column-${k}-${part}`).value.trim();
    const name = value("name");
    const type = value("type");
    const column = { name, type: type === "categorical" ? "categorical" : "numeric" };
    if (type === "categorical") {
      column.categories = listOf(value("categories")).map((c) => c);
    } else {
      column.bounds = [numberOf(value("lo")) ?? null, numberOf(value("hi")) ?? null];
      if (type === "integer") column.integer = true;
    }
    const policy = value("missing");
    const fill = value("fill");
    const fillValue = fill === "" ? null : type === "categorical" ? listOf(fill)[0] : Number(fill);
    if (policy === "indicator") column.missing = fillValue === null ? { policy } : { policy, fill: fillValue };
    if (policy === "constant") column.missing = { policy, value: fillValue };
    return column;
  }

  function declaredColumns() {
    const rows = [...document.querySelectorAll("#columns-list fieldset.column")];
    return rows.length ? rows.map(columnOf) : undefined;
  }

  // The header line of a CSV file, split as RFC 4180 quotes it.
  function headerOf(text) {
    const line = text.split(/\r?\n/, 1)[0] || "";
    const names = [];
    let cell = "";
    let quoted = false;
    for (let i = 0; i < line.length; i++) {
      const ch = line[i];
      if (quoted) {
        if (ch === '"' && line[i + 1] === '"') {
          cell += '"';
          i++;
        } else if (ch === '"') quoted = false;
        else cell += ch;
      } else if (ch === '"') quoted = true;
      else if (ch === ",") {
        names.push(cell.trim());
        cell = "";
      } else cell += ch;
    }
    names.push(cell.trim());
    return names.filter((n) => n !== "");
  }

  async function readNames() {
    const file = $("upload-file").files[0];
    if (!file || !/\.csv$/i.test(file.name)) {
      setStatus("columns-status", "Choose a CSV file first: its header line gives the names (add Parquet columns by hand).");
      return;
    }
    // The first 64 KiB hold any sane header line; only the names are read.
    const names = headerOf(await file.slice(0, 65536).text());
    const label = trimmed("upload-label");
    const taken = new Set([...document.querySelectorAll("#columns-list fieldset.column")].map((r) => $(`column-${r.dataset.column}-name`).value.trim()));
    const added = names.filter((n) => n !== label && !taken.has(n));
    for (const name of added) addColumn(name);
    setStatus("columns-status", added.length ? `Added ${added.length} column${added.length === 1 ? "" : "s"}: set each one's type and bounds or categories.` : "No new column names in the file's header.");
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
    const columns = declaredColumns();
    if (columns) meta.columns = columns;
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
  $("columns-read").addEventListener("click", () => readNames().catch((e) => setStatus("columns-status", String(e))));
  $("columns-add").addEventListener("click", () => {
    addColumn("");
    setStatus("columns-status", "Column added.");
  });

  window.dprelease.pages.datasets = datasetsPage;
})();
