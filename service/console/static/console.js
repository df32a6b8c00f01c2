// dprelease console: the one script of the server-rendered pages (docs/console.md).
// No framework, no build step. It keeps the API key in sessionStorage (this tab only), sends it
// as `Authorization: Bearer <key>` to the JSON API of the same origin, and fills the page the
// server rendered (body[data-page]). It never puts the key in a URL.
(() => {
  "use strict";

  const KEY = "dprelease.apiKey";
  const SVG = "http://www.w3.org/2000/svg";
  const page = document.body.dataset.page;
  const $ = (id) => document.getElementById(id);

  // ------------------------------------------------------------------ the key and the API
  const storedKey = () => sessionStorage.getItem(KEY);

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(path) {
    const response = await fetch(path, {
      headers: { Authorization: `Bearer ${storedKey()}`, Accept: "application/json" },
      cache: "no-store",
      credentials: "omit",
      referrerPolicy: "no-referrer",
    });
    let body = null;
    try {
      body = await response.json();
    } catch (_) {
      body = null;
    }
    if (!response.ok) {
      // The service's error shape: {"error": {"code", "message", "detail"}}.
      const error = (body && body.error) || {};
      throw new ApiError(
        response.status,
        error.code || `http_${response.status}`,
        error.message || response.statusText || "request failed",
      );
    }
    return body;
  }

  // ------------------------------------------------------------------------- DOM helpers
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "text") node.textContent = value;
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  function svg(tag, attrs, text) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  const fmt = (x, digits = 3) =>
    typeof x === "number" && Number.isFinite(x) ? Number(x.toFixed(digits)).toString() : "–";
  const fmtDelta = (x) => {
    if (typeof x !== "number" || !Number.isFinite(x)) return "–";
    return x === 0 ? "0" : x.toExponential(2);
  };
  const fmtTime = (iso) => (iso ? new Date(iso).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "–");

  function setStatus(id, text) {
    const node = $(id);
    if (node) node.textContent = text;
  }

  function showError(error) {
    const alert = $("alert");
    if (error instanceof ApiError) {
      alert.textContent = `${error.message} (${error.code}, HTTP ${error.status})`;
      if (error.status === 401) alert.append(" Sign out and sign in with a valid key.");
    } else {
      alert.textContent = `Something went wrong: ${error && error.message ? error.message : error}`;
    }
  }

  const clearError = () => {
    $("alert").textContent = "";
  };

  // A budget gauge: a <meter> of the ε in use (reserved: committed and in flight) with the
  // same figures in words beside it.
  function gauge(budget, label) {
    const id = `gauge-${Math.random().toString(36).slice(2, 10)}`;
    const meter = el("meter", {
      id,
      min: 0,
      max: budget.epsilon,
      value: Math.min(budget.reserved, budget.epsilon),
      low: budget.epsilon * 0.5,
      high: budget.epsilon * 0.8,
      optimum: 0,
      "aria-label": label,
      "aria-describedby": `${id}-text`,
    });
    meter.textContent = `${fmt(budget.reserved)} of ${fmt(budget.epsilon)}`;
    const text = el("span", {
      id: `${id}-text`,
      class: "gauge-text",
      text:
        `spent ${fmt(budget.spent)} · reserved ${fmt(budget.reserved)} · ` +
        `remaining ${fmt(budget.remaining)} of ε ${fmt(budget.epsilon)}`,
    });
    return el("div", { class: "gauge" }, meter, text);
  }

  // ---------------------------------------------------------------------------- pages
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

  async function datasetPage(me) {
    const id = document.body.dataset.datasetId;
    const ds = await api(`/datasets/${encodeURIComponent(id)}`);
    document.title = `${ds.name} · dprelease console`;
    $("dataset-heading").textContent = `Dataset: ${ds.name}`;
    const facts = $("dataset-facts");
    facts.replaceChildren();
    const rows = [
      ["Id", ds.id],
      ["Format", ds.format],
      ["Rows", ds.n_rows],
      ["Features", ds.n_features],
      ["Classes", ds.classes ? ds.classes.join(", ") : "–"],
      ["Status", ds.status],
      ["Created", fmtTime(ds.created_at)],
      ["Budget", `ε ${fmt(ds.budget.epsilon)}, δ ${fmtDelta(ds.budget.delta)}`],
    ];
    for (const [term, value] of rows) facts.append(el("dt", {}, term), el("dd", {}, value));
    $("dataset-gauges").replaceChildren(gauge(ds.budget, `Budget ε in use, ${ds.name}`));
    setStatus("dataset-status", "");
    $("dataset-detail").hidden = false;

    if (me.role === "analyst") {
      setStatus("ledger-status", "The ledger is shown to the dataset's owner and to admins.");
      return;
    }
    const [ledger, grants] = await Promise.all([
      api(`/budgets/${encodeURIComponent(id)}`),
      api(`/datasets/${encodeURIComponent(id)}/grants`),
    ]);
    renderLedger(ledger);
    renderGrants(grants.items);
  }

  // The spend after each entry: the filter's composed spend (running_total, what the ledger
  // charges) and basic composition (the entries' own ε added up). Refunded and research
  // entries hold nothing.
  function ledgerSeries(ledger) {
    let basic = 0;
    const points = [];
    for (const entry of ledger.entries) {
      const holds = entry.state === "committed" || entry.state === "reserved";
      if (holds) basic += entry.epsilon;
      points.push({
        entry,
        holds,
        time: Date.parse(entry.created_at),
        composed: entry.running_total,
        basic,
      });
    }
    return points;
  }

  function renderLedger(ledger) {
    const points = ledgerSeries(ledger);
    const body = $("ledger-body");
    body.replaceChildren();
    for (const p of points) {
      const e = p.entry;
      body.append(
        el(
          "tr",
          {},
          el("td", {}, fmtTime(e.created_at)),
          el("td", {}, el("code", {}, e.release_id)),
          el("td", {}, e.mechanism),
          el("td", {}, e.state),
          el("td", { class: "num" }, fmt(e.epsilon)),
          el("td", { class: "num" }, fmt(e.consumed_epsilon)),
          el("td", { class: "num" }, fmt(p.composed)),
          el("td", { class: "num" }, fmt(p.basic)),
        ),
      );
    }
    $("ledger-table").hidden = points.length === 0;
    if (!points.length) {
      setStatus("ledger-status", "No release has been charged to this dataset yet.");
      return;
    }
    setStatus("ledger-status", `${points.length} ledger entr${points.length === 1 ? "y" : "ies"}.`);
    $("ledger-chart").replaceChildren(chart(ledger, points));
    $("ledger-figure").hidden = false;
  }

  // The burn-down chart as inline SVG: step lines of spend over time against the budget.
  function chart(ledger, points) {
    const W = 720;
    const H = 300;
    const m = { left: 56, right: 16, top: 16, bottom: 48 };
    const t0 = points[0].time;
    const t1 = Math.max(points[points.length - 1].time, t0 + 1000);
    const span = t1 - t0;
    const tMin = t0 - span * 0.05;
    const tMax = t1 + span * 0.05;
    const yMax = Math.max(ledger.epsilon, ...points.map((p) => p.basic), ...points.map((p) => p.composed)) * 1.08;
    const x = (t) => m.left + ((t - tMin) / (tMax - tMin)) * (W - m.left - m.right);
    const y = (v) => H - m.bottom - (v / yMax) * (H - m.top - m.bottom);

    const root = svg("svg", {
      viewBox: `0 0 ${W} ${H}`,
      width: W,
      height: H,
      role: "img",
      "aria-labelledby": "ledger-svg-title ledger-svg-desc",
      id: "ledger-svg",
    });
    const last = points[points.length - 1];
    root.append(
      svg("title", { id: "ledger-svg-title" }, "Ledger burn-down"),
      svg(
        "desc",
        { id: "ledger-svg-desc" },
        `${points.length} entries from ${fmtTime(points[0].entry.created_at)} to ` +
          `${fmtTime(last.entry.created_at)}: composed spend ε ${fmt(last.composed)}, basic ` +
          `composition ε ${fmt(last.basic)}, budget ε ${fmt(ledger.epsilon)}. The table below ` +
          "lists every entry.",
      ),
    );
    const axes = svg("g", { stroke: "#1a1a1a", "stroke-width": 1 });
    axes.append(
      svg("line", { x1: m.left, y1: y(0), x2: W - m.right, y2: y(0) }),
      svg("line", { x1: m.left, y1: m.top, x2: m.left, y2: y(0) }),
    );
    root.append(axes);
    const labels = svg("g", { fill: "#1a1a1a", "font-size": 12 });
    for (const v of [0, ledger.epsilon / 2, ledger.epsilon]) {
      labels.append(svg("text", { x: m.left - 6, y: y(v) + 4, "text-anchor": "end" }, fmt(v, 2)));
      root.append(svg("line", { x1: m.left - 4, y1: y(v), x2: m.left, y2: y(v), stroke: "#1a1a1a" }));
    }
    labels.append(
      svg("text", { x: m.left, y: H - m.bottom + 18, "text-anchor": "start" }, fmtTime(points[0].entry.created_at)),
      svg("text", { x: W - m.right, y: H - m.bottom + 18, "text-anchor": "end" }, fmtTime(last.entry.created_at)),
      svg("text", { x: (m.left + W - m.right) / 2, y: H - 8, "text-anchor": "middle" }, "time"),
      svg("text", { x: 14, y: m.top + 8, "text-anchor": "start" }, "ε"),
    );
    root.append(labels);
    root.append(
      svg("line", {
        x1: m.left,
        y1: y(ledger.epsilon),
        x2: W - m.right,
        y2: y(ledger.epsilon),
        stroke: "#333333",
        "stroke-width": 2,
        "stroke-dasharray": "2 4",
        class: "budget-line",
      }),
    );
    const step = (key) => {
      let d = `M ${x(tMin)} ${y(0)} L ${x(points[0].time)} ${y(0)}`;
      let prev = 0;
      for (const p of points) {
        d += ` L ${x(p.time)} ${y(prev)} L ${x(p.time)} ${y(p[key])}`;
        prev = p[key];
      }
      return `${d} L ${x(tMax)} ${y(prev)}`;
    };
    // The composed line first, thick: where the filter charges what basic composition adds
    // up (a basic-charged mechanism), the dashed line stays visible on top of it.
    root.append(
      svg("path", { d: step("composed"), fill: "none", stroke: "#0b5cad", "stroke-width": 4, class: "composed-line" }),
      svg("path", {
        d: step("basic"),
        fill: "none",
        stroke: "#a33b00",
        "stroke-width": 2,
        "stroke-dasharray": "8 5",
        class: "basic-line",
      }),
    );
    return root;
  }

  function renderGrants(items) {
    $("grants-section").hidden = false;
    const list = $("grants-list");
    list.replaceChildren();
    for (const g of items) {
      list.append(el("li", {}, "analyst ", el("code", {}, g.principal_id), ` since ${fmtTime(g.created_at)}`));
    }
    setStatus("grants-status", items.length ? "" : "No analyst has been granted this dataset's releases.");
  }

  // CSV: RFC 4180 quoting; a text cell that a spreadsheet would read as a formula is prefixed
  // with an apostrophe (dataset names are the owners' text).
  function csvCell(value) {
    let text = value === null || value === undefined ? "" : String(value);
    if (typeof value === "string" && /^[=+\-@\t\r]/.test(text)) text = `'${text}`;
    return /[",\r\n]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
  }

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

  let csvUrl = null;

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
    if (csvUrl) URL.revokeObjectURL(csvUrl);
    csvUrl = URL.createObjectURL(new Blob([budgetsCsv(items)], { type: "text/csv;charset=utf-8" }));
    const link = $("budgets-csv");
    link.href = csvUrl;
    link.hidden = false;
  }

  const PAGES = { datasets: datasetsPage, dataset: datasetPage, budgets: budgetsPage };

  // ---------------------------------------------------------------------- signing in and out
  // On a page's first load the focus stays at the top (skip link, navigation); after a
  // sign-out or a refused key it moves to the key field.
  function showSignIn(focus) {
    $("content").hidden = true;
    $("who").hidden = true;
    $("signin").hidden = false;
    $("api-key").value = "";
    if (focus) $("api-key").focus();
  }

  async function start() {
    clearError();
    let me;
    try {
      me = await api("/me");
    } catch (error) {
      if (error instanceof ApiError && error.status === 401) sessionStorage.removeItem(KEY);
      showSignIn(true);
      showError(error);
      return;
    }
    $("signin").hidden = true;
    $("who-text").textContent = `Signed in as ${me.name} (${me.role})`;
    $("who").hidden = false;
    $("nav-budgets").parentElement.hidden = me.role === "analyst";
    $("content").hidden = false;
    try {
      await PAGES[page](me);
      document.body.dataset.ready = "true";
    } catch (error) {
      showError(error);
    }
  }

  $("signin-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("api-key").value.trim();
    if (!key) return;
    sessionStorage.setItem(KEY, key);
    $("api-key").value = "";
    start();
  });

  $("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    if (csvUrl) URL.revokeObjectURL(csvUrl);
    delete document.body.dataset.ready;
    clearError();
    showSignIn(true);
  });

  if (storedKey()) start();
  else showSignIn(false);
})();
