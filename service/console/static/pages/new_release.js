// dprelease console: a new release of a dataset (docs/console.md). The mechanism, the noise
// and the parameters (a form generated from GET /mechanisms' JSON schemas, so a new mechanism
// needs no console change), a live preview (POST /releases/preview, the same body the release
// would send) and a confirmation before POST /releases, sent with an Idempotency-Key so that
// a double click charges once. The service's own messages are the validation.
(() => {
  "use strict";

  const {
    $,
    api,
    ApiError,
    clearError,
    el,
    errorText,
    fmt,
    fmtDelta,
    gauge,
    idempotencyKey,
    plain,
    setStatus,
    showError,
  } = window.dprelease;

  const DEBOUNCE_MS = 300;
  const GUIDE_COLUMNS = 24; // wider datasets: the noise guide's spreads only
  // The request's own fields, by id: where a 422's location points the user.
  const TOP_FIELDS = [
    "epsilon",
    "noise_ratio",
    "sigma_x",
    "sigma_y",
    "delta",
    "accountant",
    "format",
    "noise_sampler",
  ];

  const state = {
    dataset: null,
    mechanisms: [],
    mechanism: null, // the MechanismInfo the form is generated from
    fields: [], // the generated params fields
    timer: null,
    seq: 0, // a preview answers only if no later one was asked for
    preview: null, // {key, body, result} or {key, body, error}: the latest answered preview
    confirm: null, // {body, idempotencyKey} while the confirmation panel is open
    recommended: null, // the latest preview's recommendation for the chosen mechanism
    recommendations: [], // the latest preview's short list (every mechanism, best first)
    submitting: false,
  };

  // σ and ε at four significant digits: σ can be tiny or large.
  const sig = (x) => (typeof x === "number" && Number.isFinite(x) ? String(Number(x.toPrecision(4))) : "–");

  const mechanismLabel = (m) => (m.kind === "baseline" ? `${m.name} (baseline)` : m.name);

  // ------------------------------------------------------------ the params form from a schema
  // A property without its "or null": pydantic writes an optional field as anyOf [X, null].
  // Any other anyOf is left to the JSON field.
  function unwrap(prop) {
    const outer = { title: prop.title, description: prop.description, default: prop.default };
    if (!Array.isArray(prop.anyOf)) return { schema: prop, nullable: false };
    const kinds = prop.anyOf.filter((s) => s.type !== "null");
    const nullable = kinds.length < prop.anyOf.length;
    return { schema: kinds.length === 1 ? { ...kinds[0], ...outer } : outer, nullable };
  }

  function fieldKind(schema) {
    if (Array.isArray(schema.enum) && schema.enum.every((v) => typeof v === "string")) return "enum";
    if (["integer", "number", "boolean", "string"].includes(schema.type)) return schema.type;
    return "json"; // objects, arrays, unions: the user writes the JSON value
  }

  const hasDefault = (schema) => schema.default !== undefined && schema.default !== null;

  // The schema's bounds in words (an HTML min is inclusive; exclusive bounds are said here).
  function boundsText(schema) {
    const parts = [];
    if (schema.minimum !== undefined) parts.push(`≥ ${schema.minimum}`);
    if (schema.exclusiveMinimum !== undefined) parts.push(`> ${schema.exclusiveMinimum}`);
    if (schema.maximum !== undefined) parts.push(`≤ ${schema.maximum}`);
    if (schema.exclusiveMaximum !== undefined) parts.push(`< ${schema.exclusiveMaximum}`);
    return parts.join(", ");
  }

  // A description's first sentence (the rest goes under "More").
  function firstSentence(text) {
    const match = /^(.+?[.;])(\s|$)/.exec(text);
    return match ? match[1].replace(/;$/, ".") : text;
  }

  function hintText(schema, kind, nullable) {
    const facts = [];
    if (kind === "integer") facts.push("an integer");
    if (kind === "json") facts.push("a JSON value");
    const bounds = boundsText(schema);
    if (bounds) facts.push(bounds);
    if (hasDefault(schema)) facts.push(`default ${JSON.stringify(schema.default)}`);
    else if (nullable) facts.push("optional: empty leaves it to the service");
    const extra = facts.length ? ` (${facts.join("; ")})` : "";
    return `${firstSentence(plain(schema.description))}${extra}`.trim();
  }

  const CONTROLS = {
    enum(id, schema, nullable) {
      const select = el("select", { id });
      if (nullable || !hasDefault(schema)) select.append(el("option", { value: "" }, "(service default)"));
      for (const value of schema.enum) select.append(el("option", { value }, value));
      select.value = hasDefault(schema) ? schema.default : "";
      return select;
    },
    integer(id, schema, nullable) {
      return numberInput(id, schema, nullable, true);
    },
    number(id, schema, nullable) {
      return numberInput(id, schema, nullable, false);
    },
    string(id, schema) {
      const placeholder = hasDefault(schema) ? `default: ${schema.default}` : null;
      return el("input", { id, type: "text", placeholder });
    },
    boolean(id, schema) {
      const box = el("input", { id, type: "checkbox" });
      box.checked = schema.default === true;
      return box;
    },
    json(id, schema) {
      return el("textarea", {
        id,
        rows: 2,
        spellcheck: "false",
        placeholder: hasDefault(schema)
          ? `default: ${JSON.stringify(schema.default)}`
          : "JSON; empty: the service's default",
      });
    },
  };

  function numberInput(id, schema, nullable, integer) {
    // An exclusive bound of an integer is the next integer in; of a number, the bound itself
    // (an HTML min is inclusive: the hint says "> 0", the service judges).
    const step = integer ? 1 : 0;
    const low = schema.minimum ?? (schema.exclusiveMinimum === undefined ? null : schema.exclusiveMinimum + step);
    const high = schema.maximum ?? (schema.exclusiveMaximum === undefined ? null : schema.exclusiveMaximum - step);
    return el("input", {
      id,
      type: "number",
      step: integer ? "1" : "any",
      min: low,
      max: high,
      inputmode: integer ? "numeric" : "decimal",
      placeholder: hasDefault(schema) ? `default: ${schema.default}` : nullable ? "optional" : null,
    });
  }

  // One field per property of the schema, whatever the mechanism.
  function paramField(name, prop) {
    const { schema, nullable } = unwrap(prop);
    const kind = fieldKind(schema);
    const id = `param-${name}`;
    const control = CONTROLS[kind](id, schema, nullable);
    control.setAttribute("aria-describedby", `${id}-hint`);
    const title = [schema.title || name, " ", el("code", {}, name), kind === "json" ? " (JSON)" : ""];
    const hint = el("p", { id: `${id}-hint`, class: "hint" }, hintText(schema, kind, nullable));
    const full = plain(schema.description);
    const more = full.length > firstSentence(full).length + 1 ? el("details", { class: "more" }, el("summary", {}, "More"), el("p", { class: "hint" }, full)) : null;
    // A checkbox sits inside its label, before the text; any other control below its label.
    const label = el("label", { for: id }, ...title);
    if (kind === "boolean") {
      label.classList.add("inline");
      label.prepend(control);
    }
    const node = el("div", { class: `param param-${kind}` }, label, kind === "boolean" ? null : control, hint, more);
    return { name, kind, schema, control, node };
  }

  // The mechanism's essential parameters first; the rest under "Advanced" (every one has a
  // default, so most owners never open it).
  function renderParams(mechanism) {
    const properties = (mechanism.params_schema && mechanism.params_schema.properties) || {};
    const essential = new Set(mechanism.essential_params || []);
    const entries = Object.entries(properties);
    const first = entries.filter(([name]) => essential.has(name) || !essential.size);
    const rest = entries.filter(([name]) => essential.size && !essential.has(name));
    state.fields = [...first, ...rest].map(([name, prop]) => paramField(name, prop));
    $("params-legend").textContent = `Parameters of ${mechanism.name}`;
    const nodes = state.fields.slice(0, first.length).map((f) => f.node);
    if (rest.length) {
      const advanced = el(
        "details",
        { id: "params-advanced", class: "advanced" },
        el("summary", {}, `Advanced parameters (${rest.length})`),
        ...state.fields.slice(first.length).map((f) => f.node),
      );
      nodes.push(advanced);
    }
    $("params-fields").replaceChildren(...nodes);
  }

  // A field's value for the body: {value} or {omit: true} or {error}. Types only; ranges and
  // everything else are the service's to judge.
  function readParam(field) {
    const c = field.control;
    if (field.kind === "boolean") return { value: c.checked };
    if (field.kind === "integer" || field.kind === "number") {
      if (c.validity.badInput) return { error: `${field.name}: not a number` };
      return c.value === "" ? { omit: true } : { value: Number(c.value) };
    }
    const text = field.kind === "json" ? c.value.trim() : c.value;
    if (text === "") return { omit: true };
    if (field.kind !== "json") return { value: text };
    try {
      return { value: JSON.parse(text) };
    } catch (error) {
      return { error: `${field.name}: not valid JSON (${error.message})` };
    }
  }

  function setParam(field, value) {
    const c = field.control;
    const reset = value === undefined || value === null; // back to the schema's default
    if (field.kind === "boolean") c.checked = reset ? field.schema.default === true : Boolean(value);
    else if (!reset) c.value = field.kind === "json" ? JSON.stringify(value) : String(value);
    else c.value = field.kind === "enum" && hasDefault(field.schema) ? field.schema.default : "";
  }

  // ---------------------------------------------------------------------- the request body
  const mode = () => ($("mode-noise").checked ? "noise" : "epsilon");

  function readNumber(id, errors) {
    const input = $(id);
    if (input.validity.badInput) {
      errors.push(`${id}: not a number`);
      return undefined;
    }
    return input.value === "" ? undefined : Number(input.value);
  }

  // The body of POST /releases, which the preview takes as it is: {body, errors}.
  function readBody() {
    const errors = [];
    const params = {};
    for (const field of state.fields) {
      const got = readParam(field);
      if (got.error) errors.push(got.error);
      else if (!got.omit) params[field.name] = got.value;
    }
    const body = {
      dataset_id: state.dataset.id,
      mechanism: state.mechanism.name,
      params,
      accountant: $("accountant").value || undefined, // none usable: left out, the service says why
      format: $("format").value,
      noise_sampler: $("noise_sampler").value,
    };
    // Exactly one of epsilon (calibrate σ) and noise (report ε): the request's oneOf.
    if (mode() === "epsilon") {
      body.epsilon = readNumber("epsilon", errors);
      const ratio = readNumber("noise_ratio", errors);
      if (ratio !== undefined) body.noise_ratio = ratio;
    } else {
      body.noise = { sigma_x: readNumber("sigma_x", errors) };
      const sigmaY = readNumber("sigma_y", errors);
      if (sigmaY !== undefined) body.noise.sigma_y = sigmaY;
    }
    const delta = readNumber("delta", errors);
    if (delta !== undefined) body.delta = delta;
    return { body, errors };
  }

  // --------------------------------------------------------------------- mechanism and mode
  function renderMechanism(name) {
    const m = state.mechanisms.find((x) => x.name === name);
    state.mechanism = m;
    const about = $("mechanism-about");
    about.replaceChildren(el("p", {}, plain(m.summary)), el("p", {}, el("strong", {}, "Good for: "), plain(m.good_for)));
    if (m.kind === "baseline") {
      const note =
        "Baseline: a comparison point published to measure the mechanisms against, not a recommended choice.";
      about.prepend(el("p", { class: "baseline-note" }, note));
    }
    renderAccountants(m);
    renderParams(m);
  }

  // Only accountants whose ε is a valid bound and that the service runs for releases (the
  // others need a research release, requested through the API).
  function renderAccountants(m) {
    const select = $("accountant");
    const before = select.value;
    const usable = m.accountants.filter((a) => a.releases && a.valid_bound);
    select.replaceChildren(...usable.map((a) => el("option", { value: a.name }, a.name)));
    const names = usable.map((a) => a.name);
    select.value = names.includes(before) ? before : names.includes("tight") ? "tight" : names[0] || "";
    describeAccountant();
  }

  function describeAccountant() {
    const a = state.mechanism.accountants.find((x) => x.name === $("accountant").value);
    $("accountant-about").textContent = a ? plain(`${a.summary}${a.caveat ? ` Caveat: ${a.caveat}` : ""}`) : "";
  }

  function applyMode() {
    const fixed = mode() === "noise";
    $("epsilon-fields").hidden = fixed;
    $("noise-fields").hidden = !fixed;
    for (const id of ["epsilon", "noise_ratio"]) $(id).disabled = fixed;
    for (const id of ["sigma_x", "sigma_y"]) $(id).disabled = !fixed;
  }

  // Any input: the structure first (idempotent: both input and change events come here), then
  // a new preview.
  function onInput(event) {
    const target = event.target;
    if (target.id === "mechanism" && state.mechanism.name !== target.value) renderMechanism(target.value);
    if (target.id === "accountant") describeAccountant();
    if (target.name === "noise-mode") applyMode();
    schedule();
  }

  // ------------------------------------------------------------------------------ preview
  function setPreviewState(value) {
    $("preview").dataset.state = value;
    $("preview").setAttribute("aria-busy", String(value === "pending" || value === "loading"));
  }

  function schedule() {
    clearTimeout(state.timer);
    state.seq += 1; // an answer still on its way is for older inputs
    setPreviewState("pending");
    state.timer = setTimeout(() => runPreview().catch(showError), DEBOUNCE_MS);
  }

  async function runPreview() {
    clearTimeout(state.timer);
    state.timer = null;
    const seq = ++state.seq;
    const { body, errors } = readBody();
    const key = JSON.stringify(body);
    clearInvalid();
    if (errors.length) {
      state.preview = null;
      previewRefused(errors.join("; "));
      return;
    }
    setPreviewState("loading");
    setStatus("preview-status", "Updating the preview…");
    try {
      const result = await api("/releases/preview", { json: body });
      if (seq !== state.seq) return;
      state.preview = { key, body, result };
      renderPreview(result);
    } catch (error) {
      if (seq !== state.seq) return;
      if (!(error instanceof ApiError)) throw error;
      state.preview = { key, body, error };
      markInvalid(error);
      previewRefused(errorText(error));
    }
  }

  // The refusal in the preview's status region, next to the form: the focus stays where the
  // user types.
  function previewRefused(message) {
    $("preview-body").hidden = true;
    setStatus("preview-status", "");
    $("preview-error").textContent = message;
    setPreviewState("error");
  }

  function clearInvalid() {
    for (const node of document.querySelectorAll("#release-form [aria-invalid]")) {
      node.removeAttribute("aria-invalid");
    }
  }

  // The fields a 422 names (detail.errors[].loc: ["body", mechanism, "params", name]).
  function markInvalid(error) {
    const found = (error.detail && error.detail.errors) || [];
    for (const { loc } of found) {
      if (!Array.isArray(loc)) continue;
      const at = loc.indexOf("params");
      const name = at >= 0 ? loc[at + 1] : [...loc].reverse().find((part) => TOP_FIELDS.includes(part));
      const node = name === undefined ? null : at >= 0 ? $(`param-${name}`) : $(name);
      if (node) node.setAttribute("aria-invalid", "true");
    }
  }

  function fact(term, value, attrs) {
    return [el("dt", {}, term), el("dd", attrs || {}, value)];
  }

  function renderPreview(p) {
    const b = p.budget;
    const fits = b.total_after !== null;
    const sigmaY = p.noise.sigma_y === null ? "labels not noised" : sig(p.noise.sigma_y);
    const after = fits ? fmt(b.remaining_after) : "does not fit";
    const deltas = `${fmtDelta(b.delta_remaining)} → ${fmtDelta(b.delta_remaining_after)} of ${fmtDelta(b.delta)}`;
    $("preview-error").textContent = "";
    $("preview-summary").textContent = summarySentence(p);
    $("preview-facts").replaceChildren(
      ...fact("σ_x", sig(p.noise.sigma_x), { id: "preview-sigma-x", "data-value": p.noise.sigma_x }),
      ...fact("σ_y", sigmaY, { id: "preview-sigma-y" }),
      ...fact("Charge", `ε ${sig(p.charge.epsilon)}, δ ${fmtDelta(p.charge.delta)}`, {
        id: "preview-charge",
        "data-epsilon": p.charge.epsilon,
      }),
      ...fact("Charged as", b.charged_as),
      ...fact("Remaining ε", `${fmt(b.remaining)} → ${after} of ${fmt(b.epsilon)}`, { id: "preview-remaining" }),
      ...fact("Remaining δ", deltas),
      ...fact("Admissible", b.admissible ? "yes" : refusalReason(b), {
        id: "preview-admissible",
        class: b.admissible ? "ok" : "refused",
      }),
    );
    $("preview-gauges").replaceChildren(
      el("p", { class: "gauge-label" }, "Now"),
      gauge(b, `Budget ε in use now, ${state.dataset.name}`),
      el("p", { class: "gauge-label" }, "After this release"),
      afterGauge(b),
    );
    renderWarnings(p.warnings || []);
    renderGuide(p.noise_guide);
    renderRecommended(p.recommended || []);
    showRemaining(b);
    $("preview-body").hidden = false;
    setStatus(
      "preview-status",
      `σ_x ${sig(p.noise.sigma_x)}, charge ε ${sig(p.charge.epsilon)}, remaining ε after ` +
        `${fits ? fmt(b.remaining_after) : "none fits"}${b.admissible ? "" : " (not admissible)"}.`,
    );
    setPreviewState("ready");
  }

  // The preview in a sentence or two: how loud the noise is on a value, and what the study
  // measured for this mechanism on the nearest public dataset.
  function summarySentence(p) {
    const g = p.noise_guide;
    const parts = [];
    if (g.applies && g.noise_std_raw && g.noise_to_range) {
      const pct = Math.round(100 * g.noise_to_range.median);
      parts.push(
        `Each released value is perturbed by about ± ${sig(g.noise_std_raw.median)} ` +
          `(${pct}% of its column's declared range, typical column).`,
      );
    } else {
      parts.push(`${firstSentence(plain(g.meaning)).replace(/\.$/, "")}: no per-value noise to state.`);
    }
    const rec = (p.recommended || []).find((r) => r.mechanism === state.mechanism.name);
    const m = rec && rec.measured_on;
    if (m) {
      const metric = m.metric === "balanced_accuracy" ? "balanced accuracy" : "accuracy";
      const models = m.models.slice(0, 3).join(", ");
      parts.push(
        `Expect ${metric} of about ${m.score.toFixed(2)} for models like ${models} ` +
          `(measured on ${m.dataset}, ${m.n} rows, at ε ${sig(m.epsilon)}).`,
      );
    }
    return parts.join(" ");
  }

  // The line under the heading follows the ledger: the budget may move while the page is open.
  function showRemaining(b) {
    setStatus("release-status", `Remaining budget: ε ${fmt(b.remaining)} of ${fmt(b.epsilon)}.`);
  }

  // Which of ε and δ is short, and by how much (as the 409 of POST /releases says it).
  function refusalReason(b) {
    const short = [];
    if (b.total_after === null) short.push("no ε bound fits within the budget's δ");
    else if (b.total_after > b.epsilon) short.push(`ε is short by ${sig(b.total_after - b.epsilon)}`);
    if (b.delta_after > b.delta) short.push(`δ is short by ${fmtDelta(b.delta_after - b.delta)}`);
    const why = short.length ? short.join(" and ") : "it would exceed the budget";
    return `no: ${why} (ε ${fmt(b.remaining)} and δ ${fmtDelta(b.delta_remaining)} are left)`;
  }

  // The budget if this release were admitted, beside the gauge of now.
  function afterGauge(b) {
    const inUse = b.total_after === null ? b.epsilon : Math.min(b.total_after, b.epsilon);
    const meter = el("meter", {
      id: "preview-after-meter",
      min: 0,
      max: b.epsilon,
      value: inUse,
      low: b.epsilon * 0.5,
      high: b.epsilon * 0.8,
      optimum: 0,
      "aria-label": "Budget ε in use after this release",
      "aria-describedby": "preview-after-text",
    });
    meter.textContent = `${fmt(inUse)} of ${fmt(b.epsilon)}`;
    const words =
      b.total_after === null
        ? "it does not fit"
        : `in use ${fmt(b.total_after)} · remaining ${fmt(b.remaining_after)} of ε ${fmt(b.epsilon)}`;
    const text = el("span", { id: "preview-after-text", class: "gauge-text" }, words);
    return el("div", { class: "gauge" }, meter, text);
  }

  function renderWarnings(warnings) {
    $("preview-warnings").replaceChildren(
      ...warnings.map((w) => el("li", { "data-code": w.code }, el("strong", {}, "Warning: "), `${plain(w.message)}.`.replace(/\.\.$/, "."))),
    );
  }

  function renderGuide(guide) {
    const box = $("preview-guide");
    box.replaceChildren(el("h3", {}, "Noise in raw units"), el("p", { class: "hint" }, plain(guide.meaning)));
    if (!guide.applies) return;
    const s = guide.noise_std_raw;
    const r = guide.noise_to_range;
    const span = (x) => (x.min === x.max ? sig(x.min) : `${sig(x.min)} to ${sig(x.max)} (median ${sig(x.median)})`);
    const spread = `Noise std: ${span(s)}; std / range: ${span(r)}.`;
    box.append(el("p", { id: "preview-guide-spread" }, spread));
    if (!guide.columns || guide.columns.length > GUIDE_COLUMNS) return;
    const rows = guide.columns.map((c) =>
      el(
        "tr",
        {},
        el("th", { scope: "row" }, c.column),
        el("td", { class: "num" }, `${sig(c.range[0])} to ${sig(c.range[1])}`),
        el("td", { class: "num" }, sig(c.noise_std_raw)),
        el("td", { class: "num" }, sig(c.noise_to_range)),
      ),
    );
    const titles = ["Column", "Declared range", "Noise std", "Std / range"];
    const head = titles.map((h) => el("th", { scope: "col" }, h));
    box.append(
      el(
        "table",
        { class: "data compact", id: "preview-guide-table" },
        el("caption", {}, "Noise per feature column"),
        el("thead", {}, el("tr", {}, ...head)),
        el("tbody", {}, ...rows),
      ),
    );
  }

  // The configuration measured best for this dataset's public shape at this ε, if the
  // service has one for the chosen mechanism; and a short list of the mechanisms measured
  // best on it, each with a button that switches to it with its recommended parameters.
  const SHORT_LIST = 3;

  function renderRecommended(recommended) {
    const rec = recommended.find((r) => r.mechanism === state.mechanism.name);
    const ranked = recommended
      .filter((r) => r.kind !== "baseline" && r.measured_on)
      .sort((a, b) => b.measured_on.score - a.measured_on.score)
      .slice(0, SHORT_LIST);
    state.recommendations = ranked;
    $("preview-recommended").hidden = !rec && !ranked.length;
    $("recommended-list").replaceChildren(
      ...ranked.map((r, i) => {
        const m = r.measured_on;
        const metric = m.metric === "balanced_accuracy" ? "balanced accuracy" : "accuracy";
        const text = `${r.mechanism}: ${metric} ≈ ${m.score.toFixed(2)} (${m.dataset}, ε ${sig(m.epsilon)})`;
        const current = r.mechanism === state.mechanism.name;
        const button = el(
          "button",
          { type: "button", class: "secondary", id: `use-recommended-${i}`, "data-mechanism": r.mechanism },
          current ? "Use its parameters" : `Use ${r.mechanism}`,
        );
        button.addEventListener("click", () => useRecommendation(r));
        return el("li", {}, text, " ", button);
      }),
    );
    $("use-recommended").hidden = !rec;
    $("recommended-why").textContent = rec ? `${plain(rec.why)}. Parameters: ${JSON.stringify(rec.params)}` : "";
    state.recommended = rec || null;
  }

  function useRecommendation(rec) {
    if (rec.mechanism !== state.mechanism.name) {
      $("mechanism").value = rec.mechanism;
      renderMechanism(rec.mechanism);
    }
    for (const field of state.fields) setParam(field, rec.params[field.name]);
    setStatus("preview-status", `Filled the parameters recommended for ${rec.mechanism}.`);
    schedule();
  }

  function useRecommended() {
    const rec = state.recommended;
    if (!rec || rec.mechanism !== state.mechanism.name) return;
    useRecommendation(rec);
  }

  // ------------------------------------------------------------------------------ confirm
  // The confirmation shows the latest preview of exactly the current inputs: a preview still
  // to come is asked for now.
  async function requestRelease(event) {
    event.preventDefault();
    clearError();
    let key = JSON.stringify(readBody().body);
    if (!state.preview || state.preview.key !== key || state.timer) {
      await runPreview();
      key = JSON.stringify(readBody().body);
    }
    const p = state.preview;
    if (!p || p.key !== key || p.error) {
      setStatus("preview-status", "The preview refused these inputs: fix them first.");
      return;
    }
    if (!p.result.budget.admissible) {
      setStatus("preview-status", "This release would exceed the budget: lower ε or raise σ.");
      return;
    }
    openConfirm(p);
  }

  function openConfirm(p) {
    const r = p.result;
    const m = state.mechanism;
    state.confirm = { body: p.body, idempotencyKey: idempotencyKey() };
    const how = p.body.epsilon !== undefined ? `target ε ${p.body.epsilon}` : `fixed σ_x ${p.body.noise.sigma_x}`;
    const sigmaY = r.noise.sigma_y === null ? "–" : sig(r.noise.sigma_y);
    const remaining = `${fmt(r.budget.remaining_after)} of ${fmt(r.budget.epsilon)}`;
    $("confirm-facts").replaceChildren(
      ...fact("Dataset", state.dataset.name),
      ...fact("Mechanism", mechanismLabel(m), { id: "confirm-mechanism" }),
      ...fact("Noise", `${how}: σ_x ${sig(r.noise.sigma_x)}, σ_y ${sigmaY}`),
      ...fact("Accountant", r.accountant),
      ...fact("Charge", `ε ${sig(r.charge.epsilon)}, δ ${fmtDelta(r.charge.delta)}`, { id: "confirm-charge" }),
      ...fact("Remaining ε after", remaining, { id: "confirm-remaining" }),
      ...fact("Parameters", JSON.stringify(p.body.params)),
      ...fact("Format", p.body.format),
    );
    setStatus("confirm-status", "");
    $("release-editor").hidden = true;
    $("confirm-panel").hidden = false;
    $("confirm-release").disabled = false;
    $("confirm-heading").focus();
  }

  function closeConfirm() {
    state.confirm = null;
    $("confirm-panel").hidden = true;
    $("release-editor").hidden = false;
    $("request-release").focus();
  }

  async function confirmRelease() {
    if (state.submitting || !state.confirm) return;
    state.submitting = true;
    $("confirm-release").disabled = true;
    setStatus("confirm-status", "Requesting the release…");
    try {
      const release = await api("/releases", {
        json: state.confirm.body,
        headers: { "Idempotency-Key": state.confirm.idempotencyKey },
      });
      setStatus("confirm-status", `Release ${release.id} requested; opening its page…`);
      window.location.assign(`/console/releases/${encodeURIComponent(release.id)}`);
    } catch (error) {
      // Refused (a 409: the budget moved since the preview): back to the form with the
      // service's message, and a fresh preview of the budget as it is now.
      state.submitting = false;
      closeConfirm();
      showError(error);
      schedule();
    }
  }

  // -------------------------------------------------------------------------------- page
  function defaultEpsilon(budget) {
    return budget.remaining > 0 ? Math.min(1, Number((budget.remaining / 2).toPrecision(3))) : 1;
  }

  function fillMechanisms(items) {
    const select = $("mechanism");
    select.replaceChildren(
      ...items.map((m) => el("option", { value: m.name }, mechanismLabel(m))),
    );
    const first = items.find((m) => m.kind !== "baseline") || items[0];
    select.value = first.name;
    return first.name;
  }

  async function newReleasePage(me) {
    const id = document.body.dataset.datasetId;
    const ds = await api(`/datasets/${encodeURIComponent(id)}`);
    state.dataset = ds;
    document.title = `New release: ${ds.name} · dprelease console`;
    $("release-heading").textContent = `New release: ${ds.name}`;
    // Only the owner may request releases (an owner sees only their own datasets).
    if (me.role !== "owner") {
      const why = `Only the dataset's owner may request its releases; you are signed in as ${me.role}.`;
      setStatus("release-status", why);
      return;
    }
    const list = await api("/mechanisms");
    state.mechanisms = list.items;
    if (!list.items.length) {
      setStatus("release-status", "The service offers no mechanism.");
      return;
    }
    renderMechanism(fillMechanisms(list.items));
    $("epsilon").value = String(defaultEpsilon(ds.budget));
    applyMode();
    const form = $("release-form");
    form.addEventListener("input", onInput);
    form.addEventListener("change", onInput);
    form.addEventListener("submit", requestRelease);
    $("use-recommended").addEventListener("click", useRecommended);
    $("confirm-release").addEventListener("click", confirmRelease);
    $("confirm-back").addEventListener("click", closeConfirm);
    $("confirm-panel").addEventListener("keydown", (event) => {
      if (event.key === "Escape" && !state.submitting) closeConfirm();
    });
    showRemaining(ds.budget);
    $("release-editor").hidden = false;
    runPreview().catch(showError);
  }

  window.dprelease.pages.new_release = newReleasePage;
})();
