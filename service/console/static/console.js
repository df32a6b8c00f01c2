// dprelease console: the core script of the server-rendered pages (docs/console.md).
// No framework, no build step. It keeps the API key in sessionStorage (this tab only), sends it
// as `Authorization: Bearer <key>` to the JSON API of the same origin, signs in and out, and
// runs the page's own script (static/pages/<page>.js, which registers itself in
// window.dprelease.pages under body[data-page]) once the document is parsed. It never puts the
// key in a URL.
(() => {
  "use strict";

  const KEY = "dprelease.apiKey";
  const SVG = "http://www.w3.org/2000/svg";
  const page = document.body.dataset.page;
  const $ = (id) => document.getElementById(id);

  // ------------------------------------------------------------------ the key and the API
  const storedKey = () => sessionStorage.getItem(KEY);

  class ApiError extends Error {
    constructor(status, code, message, detail) {
      super(message);
      this.status = status;
      this.code = code;
      this.detail = detail;
    }
  }

  // The JSON API with the key. options: method, json (a body sent as JSON), form (a FormData
  // body), raw (answer the Response itself when it is ok: a file to save), headers (more
  // request headers, e.g. Idempotency-Key; they cannot replace the key's).
  async function api(path, options = {}) {
    const headers = {
      ...(options.headers || {}),
      Authorization: `Bearer ${storedKey()}`,
      Accept: "application/json",
    };
    let body;
    if (options.json !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(options.json);
    } else if (options.form !== undefined) {
      body = options.form; // the browser sets the multipart boundary
    }
    const response = await fetch(path, {
      method: options.method || (body === undefined ? "GET" : "POST"),
      headers,
      body,
      cache: "no-store",
      credentials: "omit",
      referrerPolicy: "no-referrer",
    });
    if (options.raw && response.ok) return response;
    let payload = null;
    try {
      payload = await response.json();
    } catch (_) {
      payload = null;
    }
    if (!response.ok) {
      // The service's error shape: {"error": {"code", "message", "detail"}}.
      const error = (payload && payload.error) || {};
      throw new ApiError(
        response.status,
        error.code || `http_${response.status}`,
        error.message || response.statusText || "request failed",
        error.detail,
      );
    }
    return payload;
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

  // How every alert words an error: the service's message with its code and status, or
  // what went wrong in the page.
  function errorText(error) {
    if (error instanceof ApiError) return `${error.message} (${error.code}, HTTP ${error.status})`;
    return `Something went wrong: ${error && error.message ? error.message : error}`;
  }

  function showError(error) {
    const alert = $("alert");
    alert.textContent = errorText(error);
    if (error instanceof ApiError && error.status === 401) {
      alert.append(" Sign out and sign in with a valid key.");
    }
  }

  // A fresh Idempotency-Key (a random UUID) for one POST the user means once: a retried
  // request is stored or charged once. crypto.randomUUID needs a secure context;
  // getRandomValues also works on plain http.
  function idempotencyKey() {
    if (crypto.randomUUID) return crypto.randomUUID();
    const b = crypto.getRandomValues(new Uint8Array(16));
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const h = [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
  }

  const clearError = () => {
    $("alert").textContent = "";
  };

  // A budget gauge: a <meter> of the ε in use (reserved: committed and in flight) with the
  // same figures in words beside it. "In use" counts the settled spend once: reserved holds
  // it and what is in flight.
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
        `in use ε ${fmt(budget.reserved)} of ${fmt(budget.epsilon)} ` +
        `(${fmt(budget.spent)} settled, ${fmt(Math.max(0, budget.reserved - budget.spent))} ` +
        `in flight) · left ${fmt(budget.remaining)}`,
    });
    return el("div", { class: "gauge" }, meter, text);
  }

  // CSV: RFC 4180 quoting; a text cell that a spreadsheet would read as a formula is prefixed
  // with an apostrophe (dataset names are the owners' text): OWASP's prefixes (= + - @, tab,
  // carriage return), after any leading whitespace, which spreadsheets skip.
  function csvCell(value) {
    let text = value === null || value === undefined ? "" : String(value);
    if (typeof value === "string" && /^[\s]*[=+\-@\t\r]/.test(text)) text = `'${text}`;
    return /[",\r\n]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
  }

  // Ledger entries as CSV (the dataset page's and the budgets page's exports): one line per
  // entry of GET /budgets/{id}, with its dataset's id and name.
  const LEDGER_COLUMNS = [
    "dataset_id",
    "dataset_name",
    "release_id",
    "created_at",
    "settled_at",
    "mechanism",
    "accountant",
    "state",
    "charged_as",
    "epsilon",
    "delta",
    "consumed_epsilon",
    "consumed_delta",
    "running_total",
    "running_delta",
    "params",
  ];

  function ledgerCsv(ledgers) {
    const lines = [LEDGER_COLUMNS.join(",")];
    for (const { dataset, entries } of ledgers) {
      for (const entry of entries) {
        const row = {
          ...entry,
          dataset_id: dataset.id,
          dataset_name: dataset.name,
          params: JSON.stringify(entry.params),
        };
        lines.push(LEDGER_COLUMNS.map((c) => csvCell(row[c])).join(","));
      }
    }
    return new Blob([`${lines.join("\r\n")}\r\n`], { type: "text/csv;charset=utf-8" });
  }


  // Object URLs of files built in the page (CSV exports, downloads): revoked on sign-out.
  const blobUrls = [];
  function blobUrl(blob) {
    const url = URL.createObjectURL(blob);
    blobUrls.push(url);
    return url;
  }

  // What the page scripts use.
  const pages = {};
  // The service's descriptive text as a reader of the console should see it: without the
  // repository paths it cites for developers ("(docs/results/tabular.md)", "see
  // dpcore/…"), which mean nothing in a browser.
  const REPO_PATH = String.raw`(?:docs|dpcore|service|worker|bench|tests)\/[\w./-]+|[\w-]+\.(?:md|py)\b`;
  function plain(text) {
    if (!text) return "";
    return String(text)
      .replace(new RegExp(String.raw`\s*\((?:[^()]*?)(?:${REPO_PATH})[^()]*\)`, "g"), "")
      .replace(new RegExp(String.raw`[;,]?\s*(?:see |in |from )?(?:${REPO_PATH})(?:, "[^"]*")?`, "g"), "")
      .replace(/\s+([.,;:])/g, "$1")
      .replace(/\s{2,}/g, " ")
      .trim();
  }

  window.dprelease = Object.freeze({
    $,
    api,
    ApiError,
    blobUrl,
    clearError,
    csvCell,
    el,
    errorText,
    fmt,
    fmtDelta,
    fmtTime,
    gauge,
    idempotencyKey,
    ledgerCsv,
    pages,
    plain,
    setStatus,
    showError,
    svg,
  });

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
    $("nav-audit").parentElement.hidden = me.role !== "admin";
    $("content").hidden = false;
    try {
      const run = pages[page];
      if (!run) throw new Error(`no script for the page ${page}`);
      await run(me);
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
    for (const url of blobUrls.splice(0)) URL.revokeObjectURL(url);
    delete document.body.dataset.ready;
    clearError();
    showSignIn(true);
  });

  // Deferred page scripts run after this one and before DOMContentLoaded: by then every page
  // has registered.
  document.addEventListener("DOMContentLoaded", () => {
    if (storedKey()) start();
    else showSignIn(false);
  });
})();
