// dprelease console: the budgets page and its CSV export (docs/console.md).
(() => {
  "use strict";

  const { $, api, blobUrl, csvCell, el, fmt, fmtDelta, gauge, setStatus } = window.dprelease;

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
        ),
      );
    }
    $("budgets-table").hidden = items.length === 0;
    const scope = me.role === "admin" ? "every dataset" : "your datasets";
    setStatus("budgets-status", `${items.length} dataset${items.length === 1 ? "" : "s"} (${scope}).`);
    const link = $("budgets-csv");
    link.href = blobUrl(new Blob([budgetsCsv(items)], { type: "text/csv;charset=utf-8" }));
    link.hidden = false;
  }

  window.dprelease.pages.budgets = budgetsPage;
})();
