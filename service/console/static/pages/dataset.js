// dprelease console: a dataset's page: facts, gauge, releases, ledger burn-down and its CSV,
// grants and their management (docs/console.md).
(() => {
  "use strict";

  const {
    $,
    api,
    blobUrl,
    el,
    errorText,
    fmt,
    fmtDelta,
    fmtTime,
    gauge,
    ledgerCsv,
    setStatus,
    svg,
  } = window.dprelease;

  const enc = encodeURIComponent;
  const releaseHref = (releaseId) => `/console/releases/${enc(releaseId)}`;

  async function datasetPage(me) {
    const id = document.body.dataset.datasetId;
    const ds = await api(`/datasets/${enc(id)}`);
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
    // An owner key sees only its own datasets: an owner reading this page owns it.
    const owner = me.role === "owner";
    if (owner && ds.status === "active") {
      $("new-release").href = `/console/datasets/${enc(ds.id)}/new-release`;
      $("dataset-actions").hidden = false;
    }
    $("dataset-detail").hidden = false;

    renderReleases((await api(`/releases?dataset_id=${enc(id)}`)).items);
    if (me.role === "analyst") {
      setStatus("ledger-status", "The ledger is shown to the dataset's owner and to admins.");
      return;
    }
    const [ledger, grants] = await Promise.all([
      api(`/budgets/${enc(id)}`),
      api(`/datasets/${enc(id)}/grants`),
    ]);
    renderLedger(ledger);
    offerLedgerCsv(ds, ledger);
    grantsOf = { id: ds.id, owner };
    renderGrants(grants.items);
    $("grant-form").hidden = !owner;
  }

  // ---------------------------------------------------------------------------- releases
  function renderReleases(items) {
    const body = $("releases-body");
    body.replaceChildren();
    for (const r of items) {
      body.append(
        el(
          "tr",
          { "data-release-id": r.id },
          el("th", { scope: "row" }, el("a", { href: releaseHref(r.id) }, el("code", {}, r.id))),
          el("td", {}, r.status),
          el("td", {}, r.mechanism),
          el("td", { class: "num" }, fmt(r.charge.epsilon)),
          el("td", {}, fmtTime(r.created_at)),
        ),
      );
    }
    $("releases-table").hidden = items.length === 0;
    setStatus(
      "releases-status",
      items.length ? `${items.length} release${items.length === 1 ? "" : "s"}.` : "No releases yet.",
    );
  }

  // The dataset's ledger entries as CSV, built from the GET /budgets/{id} answer already in
  // the page: no second request, no key in a URL.
  function offerLedgerCsv(ds, ledger) {
    const link = $("ledger-csv");
    link.href = blobUrl(ledgerCsv([{ dataset: ds, entries: ledger.entries }]));
    link.download = `dprelease-ledger-${ds.id}.csv`;
    link.hidden = false;
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
          el("td", {}, el("a", { href: releaseHref(e.release_id) }, el("code", {}, e.release_id))),
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

  // ------------------------------------------------------------------------------ grants
  // The dataset whose grants are shown, and whether this key owns it (only the owner may
  // grant and revoke; an admin reads them).
  let grantsOf = null;

  function renderGrants(items) {
    $("grants-section").hidden = false;
    const list = $("grants-list");
    list.replaceChildren();
    for (const g of items) {
      const item = el(
        "li",
        { "data-grant-id": g.id },
        "analyst ",
        el("code", {}, g.principal_id),
        ` since ${fmtTime(g.created_at)}`,
      );
      if (grantsOf.owner) {
        const button = el(
          "button",
          { type: "button", class: "secondary", "aria-label": `Revoke analyst ${g.principal_id}` },
          "Revoke",
        );
        button.addEventListener("click", () => revoke(g));
        item.append(" ", button);
      }
      list.append(item);
    }
    setStatus(
      "grants-status",
      items.length
        ? `${items.length} grant${items.length === 1 ? "" : "s"}.`
        : "No analyst has been granted this dataset's releases.",
    );
  }

  async function refreshGrants() {
    renderGrants((await api(`/datasets/${enc(grantsOf.id)}/grants`)).items);
  }

  // The service's message in the grants' alert, which takes the focus.
  function showGrantError(error) {
    const alert = $("grants-alert");
    alert.textContent = errorText(error);
    alert.focus();
  }

  async function grant(event) {
    event.preventDefault();
    const button = $("grant-submit");
    if (button.disabled) return;
    $("grants-alert").textContent = "";
    button.disabled = true;
    try {
      const principalId = $("grant-principal").value.trim();
      const made = await api(`/datasets/${enc(grantsOf.id)}/grants`, {
        json: { principal_id: principalId },
      });
      $("grant-principal").value = "";
      await refreshGrants();
      setStatus("grants-status", `Granted analyst ${made.principal_id}.`);
    } catch (error) {
      showGrantError(error);
    } finally {
      button.disabled = false;
    }
  }

  async function revoke(g) {
    const question = `Revoke analyst ${g.principal_id}'s access to this dataset's releases?`;
    if (!window.confirm(question)) return;
    $("grants-alert").textContent = "";
    try {
      await api(`/datasets/${enc(grantsOf.id)}/grants/${enc(g.id)}`, { method: "DELETE" });
      await refreshGrants();
      setStatus("grants-status", `Revoked analyst ${g.principal_id}.`);
      $("grant-principal").focus(); // the focused button is gone
    } catch (error) {
      showGrantError(error);
    }
  }

  $("grant-form").addEventListener("submit", grant);

  window.dprelease.pages.dataset = datasetPage;
})();
