// dprelease console: the budgets page and its CSV export (docs/console.md).
(() => {
  "use strict";

  const { $, api, blobUrl, csvCell, el, fmt, fmtDelta, fmtTime, gauge, ledgerCsv, setStatus, showError } =
    window.dprelease;
  const enc = encodeURIComponent;

  const BUDGET_COLUMNS = [
    "dataset_id",
    "dataset_name",
    "epsilon",
    "spent",
    "reserved",
    "remaining",
    "delta",
    "delta_spent",
    "delta_reserved",
    "delta_remaining",
    "release_count",
  ];

  function budgetsCsv(items) {
    const lines = [BUDGET_COLUMNS.join(",")];
    for (const item of items) lines.push(BUDGET_COLUMNS.map((c) => csvCell(item[c])).join(","));
    return `${lines.join("\r\n")}\r\n`;
  }

  async function budgetsPage(me) {
    if (me.role === "analyst") {
      setStatus("budgets-status", "Budgets are shown to owners (their datasets) and admins (every dataset).");
      return;
    }
    const { items } = await api("/budgets");
    const body = $("budgets-body");
    body.replaceChildren();
    for (const b of items) {
      const link = el("a", { href: `/console/datasets/${encodeURIComponent(b.dataset_id)}` }, b.dataset_name);
      body.append(
        el(
          "tr",
          { "data-dataset-id": b.dataset_id },
          el("th", { scope: "row" }, link),
          el("td", { class: "num" }, fmt(b.epsilon)),
          el("td", { class: "num" }, fmt(b.spent)),
          el("td", { class: "num" }, fmt(b.reserved)),
          el("td", { class: "num" }, fmt(b.remaining)),
          el("td", { class: "num" }, fmtDelta(b.delta)),
          el("td", { class: "num" }, fmtDelta(b.delta_spent)),
          el("td", { class: "num" }, fmtDelta(b.delta_remaining)),
          el("td", { class: "num" }, b.release_count),
          el("td", {}, gauge(b, `Budget ε in use, ${b.dataset_name}`)),
          el("td", {}, entriesButton(b)),
        ),
      );
    }
    $("budgets-table").hidden = items.length === 0;
    const scope = me.role === "admin" ? "every dataset" : "your datasets";
    setStatus("budgets-status", `${items.length} dataset${items.length === 1 ? "" : "s"} (${scope}).`);
    const link = $("budgets-csv");
    link.href = blobUrl(new Blob([budgetsCsv(items)], { type: "text/csv;charset=utf-8" }));
    link.hidden = false;
    budgets = items;
    $("ledger-csv-build").hidden = items.length === 0;
  }

  // ------------------------------------------------------------------- ledger entries
  let budgets = [];

  // A button per dataset that loads its ledger (GET /budgets/{id}) on demand into a row
  // under the dataset's, and hides it again.
  function entriesButton(b) {
    const rowId = `entries-${b.dataset_id}`;
    const button = el(
      "button",
      {
        type: "button",
        class: "secondary",
        "aria-expanded": "false",
        "aria-controls": rowId,
        "aria-label": `Ledger entries of ${b.dataset_name}`,
        "data-entries-for": b.dataset_id,
      },
      // One visible name whatever the state (aria-expanded tells it), contained in the
      // accessible name as WCAG 2.5.3 asks.
      "Ledger entries",
    );
    button.addEventListener("click", () => toggleEntries(button, b, rowId));
    return button;
  }

  async function toggleEntries(button, b, rowId) {
    const shown = document.getElementById(rowId);
    if (shown) {
      shown.remove();
      button.setAttribute("aria-expanded", "false");
      return;
    }
    button.disabled = true;
    try {
      const ledger = await api(`/budgets/${enc(b.dataset_id)}`);
      const cell = el("td", { colspan: 11 }, entriesTable(b, ledger));
      button.closest("tr").after(el("tr", { id: rowId, class: "entries-row" }, cell));
      button.setAttribute("aria-expanded", "true");
    } catch (error) {
      showError(error);
    } finally {
      button.disabled = false;
    }
  }

  const headCell = (text, i) => el("th", { scope: "col", class: i > 3 ? "num" : null }, text);

  function entriesTable(b, ledger) {
    if (!ledger.entries.length) return el("p", {}, `No ledger entries for ${b.dataset_name} yet.`);
    const head = ["Created", "Release", "Mechanism", "State", "ε", "Charged ε", "Composed spend ε"];
    const table = el(
      "table",
      { class: "data entries" },
      el("caption", {}, `Ledger entries of ${b.dataset_name}, oldest first`),
      el("thead", {}, el("tr", {}, ...head.map(headCell))),
    );
    const body = el("tbody");
    for (const e of ledger.entries) {
      const link = el("a", { href: `/console/releases/${enc(e.release_id)}` }, el("code", {}, e.release_id));
      body.append(
        el(
          "tr",
          {},
          el("td", {}, fmtTime(e.created_at)),
          el("td", {}, link),
          el("td", {}, e.mechanism),
          el("td", {}, e.state),
          el("td", { class: "num" }, fmt(e.epsilon)),
          el("td", { class: "num" }, fmt(e.consumed_epsilon)),
          el("td", { class: "num" }, fmt(e.running_total)),
        ),
      );
    }
    table.append(body);
    return table;
  }

  // Every dataset's entries in one CSV: the ledgers are read when asked for (one request per
  // dataset), then offered as a download link, which takes the focus.
  async function buildLedgerCsv() {
    const button = $("ledger-csv-build");
    button.disabled = true;
    setStatus("ledger-csv-status", "Reading every dataset's ledger…");
    try {
      const ledgers = await Promise.all(
        budgets.map(async (b) => ({
          dataset: { id: b.dataset_id, name: b.dataset_name },
          entries: (await api(`/budgets/${enc(b.dataset_id)}`)).entries,
        })),
      );
      const count = ledgers.reduce((n, l) => n + l.entries.length, 0);
      const link = $("ledger-csv");
      link.href = blobUrl(ledgerCsv(ledgers));
      link.textContent = `Download ledger CSV (${count} entr${count === 1 ? "y" : "ies"})`;
      link.hidden = false;
      setStatus("ledger-csv-status", `The ledger CSV is ready: ${count} entr${count === 1 ? "y" : "ies"}.`);
      link.focus();
    } catch (error) {
      setStatus("ledger-csv-status", "");
      showError(error);
    } finally {
      button.disabled = false;
    }
  }

  $("ledger-csv-build").addEventListener("click", buildLedgerCsv);

  window.dprelease.pages.budgets = budgetsPage;
})();
