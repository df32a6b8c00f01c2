// dprelease console: a release's page: status and progress (polled while the job runs),
// cancel, charge and noise, facts, downloads, sample grid or histograms, the owner's report
// (docs/console.md).
(() => {
  "use strict";

  const { $, api, ApiError, blobUrl, el, fmt, fmtDelta, fmtTime, setStatus, showError, svg } =
    window.dprelease;

  const POLL_MS = 1000;
  const ACTIVE = new Set(["queued", "running"]);
  const GRID_COLUMNS = 8;
  const enc = encodeURIComponent;

  // What the live region last said: it speaks on a change of status or phase, not per poll.
  let announced = "";
  let polling = null;

  async function releasePage(me) {
    const id = document.body.dataset.releaseId;
    const release = await api(`/releases/${enc(id)}`);
    document.title = `Release ${release.id} · dprelease console`;
    $("release-heading").textContent = `Release ${release.id}`;
    const back = $("release-back");
    back.href = `/console/datasets/${enc(release.dataset_id)}`;
    back.textContent = "← The release's dataset";
    renderFacts(release);
    renderCharge(release);
    renderState(release, me);
    setStatus("release-status", "");
    $("release-detail").hidden = false;
    $("release-cancel").addEventListener("click", () => cancel(release.id, me));
    if (ACTIVE.has(release.status)) schedulePoll(release.id, me);
    else await settled(release, me);
  }

  // ------------------------------------------------------------------ status and progress
  function renderState(release, me) {
    const active = ACTIVE.has(release.status);
    $("release-state").textContent = release.status;
    $("release-progress-box").hidden = !active;
    const progress = $("release-progress");
    progress.value = release.progress;
    progress.textContent = `${Math.round(release.progress * 100)}%`;
    $("release-phase").textContent =
      `${Math.round(release.progress * 100)}%` + (release.phase ? ` · phase: ${release.phase}` : "");
    // Only the dataset's owner may cancel; an owner who sees a release owns its dataset.
    $("release-cancel-box").hidden = !(active && me.role === "owner");
    if (release.if_cancelled) $("release-cancel-charge").textContent = cancelWords(release);
    const error = $("release-error");
    error.hidden = !release.error;
    error.textContent = release.error ? `Error: ${release.error}` : "";
    announce(release);
  }

  function announce(release) {
    const said = release.phase && ACTIVE.has(release.status)
      ? `Release ${release.status}, phase ${release.phase}.`
      : `Release ${release.status}.`;
    if (said === announced) return;
    // The first state is on the page already; only changes are spoken.
    if (announced) setStatus("release-live", said);
    announced = said;
  }

  function schedulePoll(id, me) {
    polling = window.setTimeout(() => poll(id, me), POLL_MS);
  }

  async function poll(id, me) {
    polling = null;
    if ($("content").hidden) return; // signed out: the key is gone, nothing to follow
    let release;
    try {
      release = await api(`/releases/${enc(id)}`);
    } catch (error) {
      showError(error);
      return; // a refused key or a vanished release: nothing more to follow
    }
    renderState(release, me);
    if (ACTIVE.has(release.status)) {
      schedulePoll(id, me);
      return;
    }
    renderFacts(release);
    renderCharge(release);
    await settled(release, me);
  }

  // A terminal release: its files, what they hold, the owner's report.
  async function settled(release, me) {
    try {
      if (release.status === "succeeded") {
        renderDownloads(release);
        await renderSummary(release);
      }
      if (release.report && me.role === "owner") await renderReport(release);
    } catch (error) {
      showError(error);
    }
    document.body.dataset.releaseSettled = release.status;
  }

  // What a cancel landing now would do with the charge (the release's `if_cancelled`, the
  // rule the server applies: docs/privacy.md "Failures and cancellations").
  function cancelWords(release) {
    const epsilon = `ε = ${fmt(release.charge.epsilon)}`;
    if (release.if_cancelled === "committed") {
      return `Its job has begun reading the dataset: cancelling now keeps its whole charge ` +
        `(${epsilon}) committed, whatever its progress.`;
    }
    return `No job of it has read the dataset yet: cancelling now refunds its charge ` +
      `(${epsilon}), unless its job begins reading before the cancel lands.`;
  }

  async function cancel(id, me) {
    // Read afresh, so the confirm states the charge as it stands now.
    let current;
    try {
      current = await api(`/releases/${enc(id)}`);
    } catch (error) {
      showError(error);
      return;
    }
    if (!ACTIVE.has(current.status)) {
      renderState(current, me);
      return;
    }
    const charge = current.if_cancelled ? ` ${cancelWords(current)}` : "";
    // A native confirm: keyboard and screen-reader friendly, and nothing to build.
    const question = `Cancel release ${id}?${charge} Its job stops; this cannot be undone.`;
    if (!window.confirm(question)) return;
    $("release-cancel").disabled = true;
    let release;
    try {
      release = await api(`/releases/${enc(id)}/cancel`, { method: "POST" });
    } catch (error) {
      $("release-cancel").disabled = false;
      showError(error);
      return;
    }
    if (polling !== null) window.clearTimeout(polling);
    polling = null;
    renderState(release, me);
    renderFacts(release);
    renderCharge(release);
    setStatus("release-live", `Release cancelled. ${settlementWords(release)}`);
    document.body.dataset.releaseSettled = release.status;
  }

  // What became of the charge, in words: the release's settlement (its ledger entry's state
  // and the rule behind it, docs/privacy.md "Failures and cancellations").
  const SETTLED_BECAUSE = {
    succeeded: "Its charge is committed.",
    upload_claimed: "Its job had begun storing output, so its charge stands (committed).",
    private_data_read:
      "Its job had begun reading the private data, so its charge stands (committed): the " +
      "failure or the cancel may depend on that data.",
    before_private_read: "Its charge was refunded: it ended before its job read the data.",
  };

  function settlementWords(release) {
    if (release.research) return "A research release charges nothing.";
    const s = release.settlement;
    if (!s || s.state === "reserved") return "";
    return SETTLED_BECAUSE[s.because] || `Its charge is ${s.state}.`;
  }

  // ------------------------------------------------------------------------------- facts
  function facts(id, rows) {
    const list = $(id);
    list.replaceChildren();
    for (const [term, value] of rows) {
      if (value === null || value === undefined) continue;
      list.append(el("dt", {}, term), el("dd", {}, value));
    }
  }

  const seconds = (s) => (typeof s === "number" ? `${fmt(s, 2)} s` : "–");

  function renderFacts(release) {
    const dataset = el(
      "a",
      { href: `/console/datasets/${enc(release.dataset_id)}` },
      el("code", {}, release.dataset_id),
    );
    facts("release-facts", [
      ["Id", el("code", {}, release.id)],
      ["Dataset", dataset],
      ["Mechanism", release.mechanism],
      ["Accountant", release.accountant],
      ["Format", release.format],
      ["Created", fmtTime(release.created_at)],
      ["Started", fmtTime(release.started_at)],
      ["Finished", fmtTime(release.finished_at)],
      ["Queued for", seconds(release.timings.queued_seconds)],
      ["Ran for", seconds(release.timings.run_seconds)],
      ["Attempts", release.attempts],
      ["Research", release.research ? release.research.statement : null],
    ]);
    const body = $("params-body");
    body.replaceChildren();
    for (const [name, value] of Object.entries(release.params || {})) {
      body.append(
        el(
          "tr",
          {},
          el("th", { scope: "row" }, el("code", {}, name)),
          el("td", {}, typeof value === "object" ? JSON.stringify(value) : String(value)),
        ),
      );
    }
  }

  function renderCharge(release) {
    const c = release.charge;
    const n = release.noise;
    facts("charge-facts", [
      ["ε charged", fmt(c.epsilon, 4)],
      ["δ", fmtDelta(c.delta)],
      ["Charged as", c.charged_as || "–"],
      ["Holds for", release.neighbour_relation],
      ["Consumed ε", fmt(c.consumed_epsilon, 4)],
      ["Consumed δ", fmtDelta(c.consumed_delta)],
      ["Charge", release.settlement ? release.settlement.state : null],
      ["Settled", settlementWords(release) || null],
      ["σ_x", fmt(n.sigma_x, 4)],
      ["σ_y", n.sigma_y === null ? "labels not noised" : fmt(n.sigma_y, 4)],
      ["Noise sampler", n.sampler],
      ["Calibrated", n.calibrated],
    ]);
    const body = $("noise-body");
    body.replaceChildren();
    for (const s of n.scales) {
      body.append(
        el(
          "tr",
          {},
          el("th", { scope: "row" }, s.name),
          el("td", { class: "num" }, fmt(s.sigma, 4)),
          el("td", { class: "num" }, fmt(s.sensitivity, 4)),
          el("td", {}, s.perturbs.join(", ")),
          el("td", {}, s.description || ""),
        ),
      );
    }
  }

  // --------------------------------------------------------------------------- downloads
  function renderDownloads(release) {
    const a = release.artifact;
    if (!a) return;
    facts("artifact-facts", [
      ["File", `release-${release.id}.${a.format}`],
      ["Size", `${a.bytes.toLocaleString("en")} bytes`],
      ["sha256", el("code", { class: "hash" }, a.sha256)],
    ]);
    const list = $("download-list");
    list.replaceChildren(
      downloadItem(`/releases/${enc(release.id)}/download`, `release-${release.id}.${a.format}`, "Download", "download-release"),
    );
    for (const extra of release.artifacts || []) {
      const name = `release-${release.id}-${extra.name}`;
      const item = downloadItem(extra.download, name, `Download ${extra.name}`, null);
      item.append(el("span", { class: "hint" }, ` ${extra.description} (${extra.bytes.toLocaleString("en")} bytes)`));
      list.append(item);
    }
    $("download-section").hidden = false;
  }

  function downloadItem(path, filename, label, id) {
    const button = el("button", { type: "button", id }, label);
    button.addEventListener("click", () => save(path, filename, button));
    return el("li", {}, button);
  }

  // Fetched with the key in the Authorization header (never in a URL), saved from a Blob.
  // In presigned mode the API redirects to the object store and fetch follows it (the
  // browser drops the Authorization header on that cross-origin hop).
  async function save(path, filename, button) {
    button.disabled = true;
    setStatus("download-status", `Downloading ${filename}…`);
    try {
      const response = await api(path, { raw: true });
      const blob = await response.blob();
      const link = el("a", { href: blobUrl(blob), download: filename, hidden: true });
      document.body.append(link);
      link.click();
      link.remove();
      setStatus("download-status", `Saved ${filename} (${blob.size.toLocaleString("en")} bytes).`);
    } catch (error) {
      setStatus("download-status", "");
      showError(error);
    } finally {
      button.disabled = false;
    }
  }

  // ---------------------------------------------------------------- samples and histograms
  async function renderSummary(release) {
    $("samples-section").hidden = false;
    setStatus("samples-status", "Reading the release file…");
    let summary;
    try {
      summary = await api(`/releases/${enc(release.id)}/summary`);
    } catch (error) {
      // Too large to summarise, say: the page stays useful, the reason is shown here.
      if (!(error instanceof ApiError)) throw error;
      setStatus("samples-status", `No summary: ${error.message} (${error.code}).`);
      return;
    }
    setStatus(
      "samples-status",
      `${summary.rows.toLocaleString("en")} rows; columns: ${summary.feature_columns.length} ` +
        `feature(s); label column(s) ${summary.label_columns.join(", ")}` +
        (summary.label_kind ? ` (${summary.label_kind})` : "") +
        ". Drawn from the release file itself: post-processing, no further privacy cost.",
    );
    if (summary.feature_shape) drawGrid(summary);
    const box = $("histograms");
    box.replaceChildren();
    summary.histograms.forEach((h, i) => box.append(histogram(h, i)));
  }

  // The label as released, in a few characters: an exact class, or the most likely class of
  // a proportions vector.
  function labelText(summary, label) {
    if (!Array.isArray(label)) return String(label);
    if (summary.label_kind !== "proportions" || !label.length) return label.map((v) => fmt(v, 2)).join(" ");
    const top = label.indexOf(Math.max(...label));
    return `${summary.classes[top] ?? top} (${fmt(label[top], 2)})`;
  }

  // Fig. 1 of the DPMix paper: the released images in a grid, grey levels over the declared
  // range (black low, white high), values outside it clipped; the label under each.
  function drawGrid(summary) {
    const [h, w] = summary.feature_shape;
    const samples = summary.samples;
    const [lo, hi] = summary.display_range || [0, 1];
    const scale = Math.max(1, Math.floor(64 / Math.max(h, w)));
    const cellW = w * scale;
    const cellH = h * scale;
    const pad = 6;
    const textH = 16;
    const cols = Math.min(GRID_COLUMNS, samples.length);
    const rows = Math.ceil(samples.length / GRID_COLUMNS);
    const canvas = $("sample-grid");
    canvas.width = cols * (cellW + pad) + pad;
    canvas.height = rows * (cellH + textH + pad) + pad;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.font = "12px system-ui, sans-serif";
    ctx.textAlign = "center";
    const span = hi > lo ? hi - lo : 1;
    samples.forEach((sample, i) => {
      const x0 = pad + (i % GRID_COLUMNS) * (cellW + pad);
      const y0 = pad + Math.floor(i / GRID_COLUMNS) * (cellH + textH + pad);
      const image = ctx.createImageData(w, h);
      sample.features.forEach((v, k) => {
        const t = Math.min(1, Math.max(0, (v - lo) / span));
        const grey = Number.isFinite(t) ? Math.round(t * 255) : 0;
        image.data.set([grey, grey, grey, 255], k * 4);
      });
      // One image at its size, then scaled up without smoothing: crisp pixels.
      const tile = document.createElement("canvas");
      tile.width = w;
      tile.height = h;
      tile.getContext("2d").putImageData(image, 0, 0);
      ctx.imageSmoothingEnabled = false;
      ctx.drawImage(tile, x0, y0, cellW, cellH);
      ctx.fillStyle = "#1a1a1a";
      ctx.fillText(labelText(summary, sample.label), x0 + cellW / 2, y0 + cellH + 12);
    });
    const labels = samples.map((s) => labelText(summary, s.label)).join(", ");
    const text =
      `${samples.length} of the release's ${summary.rows.toLocaleString("en")} rows, spread evenly over the file ` +
      `(rows ${samples[0].row} to ${samples[samples.length - 1].row}), drawn as ${h}×${w} grey images, ` +
      `${GRID_COLUMNS} per row (black ${fmt(lo)}, white ${fmt(hi)}; values outside clipped), ` +
      `each with its label as released. Labels in order: ${labels}.`;
    canvas.setAttribute("aria-label", `Grid of ${samples.length} sample images from the release`);
    $("grid-caption").textContent = text;
    $("grid-figure").hidden = false;
  }

  // One column's histogram: a small SVG bar chart (role img, title and description) and its
  // counts as a table in a disclosure.
  function histogram(h, index) {
    const numeric = h.kind === "numeric";
    const bins = h.counts.map((count, i) => ({
      label: numeric ? `${fmt(h.edges[i])} to ${fmt(h.edges[i + 1])}` : h.categories[i],
      count,
    }));
    const W = 240;
    const H = 120;
    const m = { left: 4, right: 4, top: 8, bottom: 20 };
    const max = Math.max(1, ...h.counts);
    const bw = (W - m.left - m.right) / bins.length;
    const id = `hist-${index}`;
    const total = h.counts.reduce((a, b) => a + b, 0);
    const top = bins.reduce((a, b) => (b.count > a.count ? b : a), bins[0]);
    const outside =
      (h.below || h.above ? ` ${h.below} below and ${h.above} above the declared range.` : "") +
      (h.missing ? ` ${h.missing} missing.` : "");
    const root = svg("svg", {
      viewBox: `0 0 ${W} ${H}`,
      width: W,
      height: H,
      role: "img",
      "aria-labelledby": `${id}-title ${id}-desc`,
      class: "histogram",
    });
    root.append(
      svg("title", { id: `${id}-title` }, `Histogram of ${h.column}`),
      svg(
        "desc",
        { id: `${id}-desc` },
        `${total} values in ${bins.length} ${numeric ? "bins" : "classes"}` +
          (numeric ? ` from ${fmt(h.edges[0])} to ${fmt(h.edges[h.edges.length - 1])}` : "") +
          `; the largest, ${top.label}, holds ${top.count}.${outside} The table below lists every count.`,
      ),
    );
    bins.forEach((b, i) => {
      const bh = ((H - m.top - m.bottom) * b.count) / max;
      root.append(
        svg("rect", {
          x: m.left + i * bw + 0.5,
          y: H - m.bottom - bh,
          width: Math.max(1, bw - 1),
          height: bh,
          fill: "#0b5cad",
        }),
      );
    });
    root.append(
      svg("line", { x1: m.left, y1: H - m.bottom, x2: W - m.right, y2: H - m.bottom, stroke: "#1a1a1a" }),
      svg("text", { x: m.left, y: H - 5, "font-size": 11, fill: "#1a1a1a" }, numeric ? fmt(h.edges[0]) : bins[0].label),
      svg(
        "text",
        { x: W - m.right, y: H - 5, "font-size": 11, fill: "#1a1a1a", "text-anchor": "end" },
        numeric ? fmt(h.edges[h.edges.length - 1]) : bins[bins.length - 1].label,
      ),
    );
    const body = el("tbody", {});
    for (const b of bins) body.append(el("tr", {}, el("th", { scope: "row" }, b.label), el("td", { class: "num" }, b.count)));
    const table = el(
      "table",
      { class: "data" },
      el("caption", {}, `Counts of ${h.column}` + (numeric && h.range_source === "release" ? " (bins over the release's own min–max)" : "")),
      el("thead", {}, el("tr", {}, el("th", { scope: "col" }, numeric ? "Bin" : "Class"), el("th", { scope: "col", class: "num" }, "Rows"))),
      body,
    );
    // What the bars leave out, in words everyone sees (not only in the chart's description).
    const notes = [];
    if (h.below || h.above) notes.push(`${h.below} below and ${h.above} above the declared range`);
    if (h.missing) notes.push(`${h.missing} missing`);
    if (h.missing) body.append(el("tr", {}, el("th", { scope: "row" }, "missing"), el("td", { class: "num" }, h.missing)));
    return el(
      "figure",
      { class: "histogram-figure" },
      el("figcaption", {}, el("code", {}, h.column)),
      root,
      notes.length ? el("p", { class: "histogram-notes" }, `Not in the bars: ${notes.join("; ")}.`) : null,
      el("details", {}, el("summary", {}, "Counts"), table),
    );
  }

  // ------------------------------------------------------------------- the owner's report
  async function renderReport(release) {
    $("report-section").hidden = false;
    let report;
    try {
      report = await api(release.report);
    } catch (error) {
      // Not ready, erased with its held-out data, or (another viewer) nothing at all.
      if (!(error instanceof ApiError)) throw error;
      if (error.status === 404) $("report-section").hidden = true;
      else setStatus("report-status", `${error.message} (${error.code})`);
      return;
    }
    $("report-visibility").textContent = report.visibility || "";
    if (report.error) {
      setStatus("report-status", `The report failed: ${report.error}`);
      return;
    }
    const names = Object.keys(report.accuracy || {});
    const body = $("report-body");
    body.replaceChildren();
    for (const name of names) {
      const auc = (report.roc_auc || {})[name];
      body.append(
        el(
          "tr",
          {},
          el("th", { scope: "row" }, name),
          el("td", { class: "num" }, fmt(report.accuracy[name], 3)),
          el("td", { class: "num" }, fmt((report.balanced_accuracy || {})[name], 3)),
          el("td", { class: "num", title: (report.roc_auc_reason || {})[name] || null }, fmt(auc, 3)),
          el("td", { class: "num" }, fmt((report.seconds || {})[name], 2)),
        ),
      );
    }
    $("report-table").hidden = names.length === 0;
    facts("report-facts", [
      ["Training rows", report.rows],
      ["Test rows", report.test_rows],
      ["Chance (majority class)", fmt(report.chance, 3)],
      ["Post-processing", report.postprocessing],
    ]);
    setStatus("report-status", "");
  }

  window.dprelease.pages.release = releasePage;
})();
