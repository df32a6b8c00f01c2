// dprelease console: the audit trail (admin): filters, pages by cursor, CSV of the loaded
// events (docs/console.md).
(() => {
  "use strict";

  const { $, api, blobUrl, clearError, csvCell, el, fmtTime, setStatus, showError } = window.dprelease;
  const enc = encodeURIComponent;

  const TEXT_FILTERS = {
    object_type: "audit-object-type",
    object_id: "audit-object-id",
    actor: "audit-actor",
  };
  const CSV_COLUMNS = ["id", "at", "actor", "action", "object_type", "object_id", "detail"];

  // The events loaded so far under the current filters, and the cursor of the next page.
  let events = [];
  let nextCursor = null;
  let filters = {};

  // ------------------------------------------------------------------ filters and the URL
  // datetime-local holds a local time without offset; the API takes RFC 3339 with one.
  function sinceUtc(local) {
    if (!local) return null;
    const time = new Date(local);
    return Number.isNaN(time.getTime()) ? local : time.toISOString();
  }

  function localOf(iso) {
    const time = new Date(iso);
    if (Number.isNaN(time.getTime())) return "";
    const local = new Date(time.getTime() - time.getTimezoneOffset() * 60000);
    return local.toISOString().slice(0, 19);
  }

  function filtersFromForm() {
    const out = {};
    for (const [name, id] of Object.entries(TEXT_FILTERS)) {
      const value = $(id).value.trim();
      if (value) out[name] = value;
    }
    const since = sinceUtc($("audit-since").value);
    if (since) out.since = since;
    const limit = $("audit-limit").value.trim();
    if (limit) out.limit = limit;
    return out;
  }

  // The filters of the page's address (a bookmark, a reload) into the form.
  function filtersToForm(params) {
    for (const [name, id] of Object.entries(TEXT_FILTERS)) $(id).value = params.get(name) || "";
    $("audit-since").value = params.has("since") ? localOf(params.get("since")) : "";
    if (params.has("limit")) $("audit-limit").value = params.get("limit");
  }

  const query = (params) =>
    Object.entries(params)
      .map(([name, value]) => `${enc(name)}=${enc(value)}`)
      .join("&");

  // --------------------------------------------------------------------------- the events
  function detailText(detail) {
    return detail && Object.keys(detail).length ? JSON.stringify(detail) : "";
  }

  // Datasets and releases have console pages: their ids link there.
  function objectCell(e) {
    const code = el("code", {}, e.object_id);
    if (e.object_type === "dataset") return el("a", { href: `/console/datasets/${enc(e.object_id)}` }, code);
    if (e.object_type === "release") return el("a", { href: `/console/releases/${enc(e.object_id)}` }, code);
    return code;
  }

  function row(e) {
    return el(
      "tr",
      { "data-event-id": e.id },
      el("td", {}, fmtTime(e.at)),
      el("td", {}, el("code", {}, e.actor)),
      el("td", {}, e.action),
      el("td", {}, e.object_type),
      el("td", {}, objectCell(e)),
      el("td", { class: "detail" }, el("code", {}, detailText(e.detail))),
    );
  }

  function auditCsv() {
    const lines = [CSV_COLUMNS.join(",")];
    for (const e of events) {
      const line = { ...e, detail: JSON.stringify(e.detail) };
      lines.push(CSV_COLUMNS.map((c) => csvCell(line[c])).join(","));
    }
    return new Blob([`${lines.join("\r\n")}\r\n`], { type: "text/csv;charset=utf-8" });
  }

  function showLoaded() {
    $("audit-table").hidden = events.length === 0;
    $("audit-more").hidden = nextCursor === null;
    const count = `${events.length} event${events.length === 1 ? "" : "s"}`;
    const more = nextCursor ? "; more may follow" : "";
    setStatus("audit-status", events.length ? `${count} loaded${more}.` : "No events match.");
    const link = $("audit-csv");
    link.hidden = events.length === 0;
    if (events.length) link.href = blobUrl(auditCsv());
  }

  // One page of GET /audit: the first one (cursor null) replaces what is shown.
  async function load(cursor) {
    const params = cursor ? { ...filters, cursor } : filters;
    const page = await api(`/audit${Object.keys(params).length ? `?${query(params)}` : ""}`);
    if (!cursor) {
      events = [];
      $("audit-body").replaceChildren();
    }
    events.push(...page.items);
    $("audit-body").append(...page.items.map(row));
    nextCursor = page.next_cursor;
    showLoaded();
  }

  async function busy(button, work) {
    button.disabled = true;
    clearError();
    try {
      await work();
    } catch (error) {
      showError(error);
    } finally {
      button.disabled = false;
    }
  }

  async function auditPage(me) {
    if (me.role !== "admin") {
      $("audit-who").hidden = false;
      return;
    }
    $("audit-main").hidden = false;
    filtersToForm(new URLSearchParams(window.location.search));
    filters = filtersFromForm();
    await load(null);
  }

  $("audit-filters").addEventListener("submit", (event) => {
    event.preventDefault();
    filters = filtersFromForm();
    // The filters (no secret) in the address, for a bookmark; the key never is.
    const search = query(filters);
    window.history.replaceState(null, "", `/console/audit${search ? `?${search}` : ""}`);
    busy($("audit-apply"), () => load(null));
  });

  // Once the last page is in, the button goes: the focus moves to the table, not the page's top.
  $("audit-more").addEventListener("click", async () => {
    await busy($("audit-more"), () => load(nextCursor));
    if ($("audit-more").hidden) $("audit-table").focus();
  });

  window.dprelease.pages.audit = auditPage;
})();
