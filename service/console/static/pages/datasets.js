// dprelease console: the datasets page (docs/console.md).
(() => {
  "use strict";

  const { $, api, el, gauge, setStatus } = window.dprelease;

  async function datasetsPage() {
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
  }

  window.dprelease.pages.datasets = datasetsPage;
})();
