// inferno playground: streams POST /v1/completions (fetch + ReadableStream; EventSource cannot POST),
// one focusable span per token shaded by its probability, the top 5 alternatives on hover or focus.
// Token ids come from the server's `return_token_ids` extension (see inferno/serve/completions.py), and
// with a constraint (sent as `structured_outputs`) which tokens it forced (`logprobs.forced`).
// "Look inside" (a mode, or a click on a token) draws POST /v1/inspect: attention heatmaps and the logit lens.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const TOP_N = 5;
  // Where an error's `param` is shown: the control of that name, else beside the button.
  const CONTROLS = ["prompt", "max_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "seed",
                    "stop", "constraint_kind", "constraint", "api_key"];
  const ALIASES = { stop_token_ids: "stop", logit_bias: null, n: null, structured_outputs: "constraint" };
  // The constraint's kinds: the `structured_outputs` field each is sent as, and how its box reads.
  const CONSTRAINTS = {
    json: { label: "JSON Schema", hint: "The output is JSON that validates against this schema.",
            example: '{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}' },
    regex: { label: "Regular expression", hint: "The whole output matches it.", example: "[0-9]{3}-[a-z]{2}" },
    choice: { label: "Choices", hint: "One per line: the output is exactly one of them.", example: "yes\nno" },
  };

  let controller = null; // the AbortController of the request in flight
  let lastRun = null;    // {mode, prompt} of the text in the output, for opening its tokens in "Look inside"
  let tokens = [];       // per token span: {text, id, logprob, top: [{text, logprob, id}]}
  let activeTip = null;

  // ------------------------------------------------------------------------------- formatting
  const fmtProb = (p) => (p >= 0.001 ? (p * 100).toFixed(2) + "%" : p.toExponential(2));
  const shade = (p) => `hsl(${Math.round(120 * Math.min(1, Math.max(0, p)))} 75% 82%)`;
  const visible = (t) => t.replace(/ /g, "\u2423").replace(/\n/g, "\u23ce").replace(/\t/g, "\u21e5");
  const sentence = (s) => (s ? s.charAt(0).toUpperCase() + s.slice(1) : s);

  // ------------------------------------------------------------------------------------ errors
  function clearErrors() {
    for (const el of document.querySelectorAll(".error")) el.textContent = "";
    for (const el of document.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
  }

  function controlFor(param) {
    if (!param) return null;
    const name = String(param).split(/[.[]/)[0];
    const mapped = name in ALIASES ? ALIASES[name] : name;
    return CONTROLS.includes(mapped) ? mapped : null;
  }

  function labelOf(name) {
    const label = $(name).labels && $(name).labels[0];
    const text = label ? label.childNodes[0].textContent.trim() : "";
    return text || name;
  }

  function showError(error, status) {
    let name = controlFor(error && error.param);
    if (status === 401) {
      $("api-key-field").hidden = false;
      name = "api_key";
    }
    let message = (error && error.message) || `The server answered ${status}`;
    // "top_p: Input should be ..." reads better with the control's own label: "Top-p: Input should be ...".
    const param = error && error.param ? String(error.param) : "";
    if (name && param && message.startsWith(param)) message = labelOf(name) + message.slice(param.length);
    message = sentence(message);
    if (status === 401) message += ". Enter the server's API key (--api-key) and try again.";
    else if (status === 429) message += " (the server is busy; try again in a moment).";
    const box = name ? $("err-" + name) : $("err-general");
    box.textContent = message;
    if (name) {
      const control = $(name);
      control.setAttribute("aria-invalid", "true");
      const field = control.closest("fieldset");
      if (field && field.hidden) field.hidden = false;
    }
    setStatus("Error.");
  }

  async function errorFromResponse(resp) {
    let error = null;
    try {
      const body = await resp.json();
      error = body && body.error;
    } catch (_) { /* not JSON */ }
    showError(error || { message: `the server answered ${resp.status} ${resp.statusText}` }, resp.status);
  }

  // ---------------------------------------------------------------------------- the request
  function numberValue(id, body, { int = false } = {}) {
    const input = $(id);
    if (input.validity.badInput) throw { param: id, message: "this is not a number" };
    if (input.value.trim() === "") return;
    const value = Number(input.value);
    if (int && !Number.isInteger(value)) throw { param: id, message: "this must be a whole number" };
    body[id] = value;
  }

  function stopStrings() {
    const unescape = (s) => s.replace(/\\(n|t|\\)/g, (_, c) => ({ n: "\n", t: "\t", "\\": "\\" })[c]);
    return $("stop").value.split("\n").filter((s) => s !== "").map(unescape);
  }

  // The `structured_outputs` of the request (null: none), from the constraint's kind and box.
  function constraintValue() {
    const kind = $("constraint_kind").value;
    if (kind === "none") return null;
    const text = $("constraint").value;
    if (kind === "json") {
      try {
        return { json: JSON.parse(text) };
      } catch (error) {
        throw { param: "constraint", message: `this is not JSON (${error.message})` };
      }
    }
    if (kind === "choice") {
      const choices = text.split("\n").filter((c) => c !== "");
      if (!choices.length) throw { param: "constraint", message: "give at least one choice, one per line" };
      return { choice: choices };
    }
    return { regex: text };
  }

  function setConstraintKind() {
    const kind = CONSTRAINTS[$("constraint_kind").value];
    $("constraint-field").hidden = !kind;
    if (!kind) return;
    $("constraint-label").textContent = kind.label;
    $("constraint-hint").textContent = kind.hint;
    $("constraint").placeholder = kind.example;
  }

  function headers() {
    const h = { "Content-Type": "application/json" };
    const key = $("api_key").value.trim();
    if (key) h.Authorization = "Bearer " + key;
    return h;
  }

  const mode = () => (document.querySelector("input[name=mode]:checked") || {}).value || "generate";

  // ------------------------------------------------------------------------------------ output
  function resetOutput() {
    tokens = [];
    $("output").textContent = "";
    hideTip();
    for (const id of ["tokens-per-second", "finish-reason", "perplexity"]) $(id).textContent = "";
  }

  function setStatus(text) { $("status").textContent = text; }

  function topList(lp, k) {
    const top = lp.top_logprobs && lp.top_logprobs[k];
    if (!top) return null;
    // JSON object order is not reliable in JavaScript (integer-like keys such as "1" come first), so
    // order by probability; the server's top_token_ids are in that order too (most likely first, the
    // chosen token last when it is not among the top N).
    const entries = Object.entries(top).map(([text, logprob]) => ({ text, logprob }));
    const chosen = lp.tokens[k];
    const extra = entries.length > TOP_N ? entries.find((e) => e.text === chosen) : null;
    const rest = entries.filter((e) => e !== extra).sort((a, b) => b.logprob - a.logprob);
    const ordered = extra ? [...rest, extra] : rest;
    const ids = lp.top_token_ids && lp.top_token_ids[k];
    ordered.forEach((e, i) => { e.id = ids ? ids[i] : null; });
    return ordered;
  }

  function addToken(shown, lp, k, extraClass) {
    const logprob = lp.token_logprobs[k];
    const token = {
      text: lp.tokens[k], logprob,
      id: lp.token_ids ? lp.token_ids[k] : null,
      top: topList(lp, k),
      forced: Boolean(lp.forced && lp.forced[k]),
    };
    const span = document.createElement("span");
    span.className = "tok" + (extraClass ? " " + extraClass : "") + (token.forced ? " forced" : "");
    span.tabIndex = 0;
    span.dataset.index = String(tokens.length);
    if (token.id !== null) span.dataset.id = String(token.id);
    if (logprob !== null) {
      const p = Math.exp(logprob);
      span.style.background = shade(p);
      span.dataset.p = String(p);
    }
    span.setAttribute("aria-describedby", "tip");
    if (shown === "") span.classList.add("empty");
    span.textContent = shown;
    tokens.push(token);
    $("output").appendChild(span);
    return span;
  }

  // ------------------------------------------------------------------------------------ the tip
  function tipContent(token) {
    const tip = $("tip");
    tip.textContent = "";
    const head = document.createElement("p");
    head.className = "rank";
    const idText = token.id !== null ? ` (id ${token.id})` : "";
    if (token.logprob === null) {
      head.textContent = `\u201c${visible(token.text)}\u201d${idText}: the first token has no probability ` +
        "(nothing comes before it).";
      tip.appendChild(head);
      return;
    }
    const top = token.top || [];
    const rank = top.findIndex((e) => e.text === token.text) + 1;
    const inTop = rank >= 1 && rank <= TOP_N;
    head.textContent = `\u201c${visible(token.text)}\u201d${idText}: probability ${fmtProb(Math.exp(token.logprob))}, ` +
      (inTop ? `rank ${rank} of the top ${TOP_N}` : `not in the top ${TOP_N}`);
    const table = document.createElement("table");
    const caption = document.createElement("caption");
    caption.className = "muted";
    caption.textContent = `The ${TOP_N} most likely tokens here`;
    table.appendChild(caption);
    const tr = document.createElement("tr");
    for (const h of ["#", "token", "probability", "id"]) {
      const th = document.createElement("th");
      th.scope = "col";
      th.textContent = h;
      tr.appendChild(th);
    }
    table.appendChild(tr);
    top.slice(0, TOP_N).forEach((e, i) => {
      const row = document.createElement("tr");
      row.className = "alt" + (e.text === token.text ? " chosen" : "");
      for (const cell of [String(i + 1), visible(e.text), fmtProb(Math.exp(e.logprob)),
                          e.id === null ? "" : String(e.id)]) {
        const td = document.createElement("td");
        td.textContent = cell;
        row.appendChild(td);
      }
      table.appendChild(row);
    });
    tip.appendChild(head);
    if (token.forced) {
      const note = document.createElement("p");
      note.className = "forced-note";
      note.textContent = "Forced by the constraint: the only token it allowed here.";
      tip.appendChild(note);
    }
    tip.appendChild(table);
  }

  function showTip(span) {
    const token = tokens[Number(span.dataset.index)];
    if (!token) return;
    const tip = $("tip");
    tipContent(token);
    tip.hidden = false;
    activeTip = span;
    const r = span.getBoundingClientRect();
    const width = tip.offsetWidth;
    const left = Math.max(4, Math.min(r.left + window.scrollX, window.scrollX + document.documentElement.clientWidth - width - 4));
    tip.style.left = left + "px";
    tip.style.top = (r.bottom + window.scrollY + 4) + "px";
  }

  function hideTip() {
    $("tip").hidden = true;
    activeTip = null;
  }

  // ----------------------------------------------------------------------------------- running
  function setRunning(running) {
    $("generate").disabled = running;
    $("stop-button").disabled = !running;
  }

  async function run() {
    if (controller) return;
    clearErrors();
    if (mode() === "inspect") {
      await inspectText($("prompt").value);
      return;
    }
    resetOutput();
    lastRun = { mode: mode(), prompt: $("prompt").value };
    const scoring = mode() === "score";
    const body = { prompt: $("prompt").value, logprobs: TOP_N, return_token_ids: true };
    try {
      if (scoring) {
        Object.assign(body, { echo: true, max_tokens: 0 });
      } else {
        numberValue("max_tokens", body, { int: true });
        numberValue("temperature", body);
        numberValue("top_k", body, { int: true });
        numberValue("top_p", body);
        numberValue("repetition_penalty", body);
        numberValue("seed", body, { int: true });
        const stop = stopStrings();
        if (stop.length) body.stop = stop;
        const constraint = constraintValue();
        if (constraint) body.structured_outputs = constraint;
        body.stream = true;
      }
    } catch (error) {
      showError(error, 400);
      return;
    }
    controller = new AbortController();
    setRunning(true);
    setStatus(scoring ? "Scoring\u2026" : "Generating\u2026");
    try {
      const resp = await fetch("/v1/completions", {
        method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal,
      });
      if (!resp.ok) {
        await errorFromResponse(resp);
        return;
      }
      if (scoring) await showScore(await resp.json());
      else await readStream(resp);
    } catch (error) {
      if (error && error.name === "AbortError") {
        setStatus("Stopped.");
        $("finish-reason").textContent = "Finish reason: stopped by you";
      } else {
        showError({ message: `the request failed: ${error && error.message}` }, 0);
      }
    } finally {
      controller = null;
      setRunning(false);
    }
  }

  async function readStream(resp) {
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    const started = performance.now();
    let buffer = "";
    let count = 0;
    let finish = null;
    let last = null;
    const handle = (data) => {
      if (data === "[DONE]") return true;
      const chunk = JSON.parse(data);
      if (chunk.error) {
        showError(chunk.error, 500);
        return true;
      }
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) return false;
      if (choice.logprobs && choice.logprobs.tokens.length) {
        last = addToken(choice.text, choice.logprobs, 0);
        count += 1;
        const seconds = (performance.now() - started) / 1000;
        $("tokens-per-second").textContent = `${count} tokens, ${(count / seconds).toFixed(1)} tokens/s`;
      } else if (choice.text) {
        // Text released at the end (held back for a stop string or an incomplete character).
        if (last) last.classList.remove("empty");
        $("output").appendChild(document.createTextNode(choice.text));
      }
      if (choice.finish_reason) finish = choice.finish_reason;
      return false;
    };
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(buffer.slice(end).match(/^\r?\n\r?\n/)[0].length + end);
        const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
        if (data && handle(data)) {
          reader.cancel().catch(() => {});
          buffer = "";
          break;
        }
      }
    }
    if (finish) {
      $("finish-reason").textContent = `Finish reason: ${finish}`;
      setStatus("Done.");
    } else if ($("status").textContent !== "Error.") {
      setStatus("Done.");
    }
  }

  async function showScore(response) {
    const choice = response.choices[0];
    const lp = choice.logprobs;
    const chars = Array.from(choice.text); // text_offset counts characters (code points)
    const n = lp.tokens.length;
    for (let k = 0; k < n; k++) {
      const end = k + 1 < n ? lp.text_offset[k + 1] : chars.length;
      addToken(chars.slice(lp.text_offset[k], end).join(""), lp, k, k === 0 ? "prompt" : "");
    }
    const scored = lp.token_logprobs.filter((x) => x !== null);
    if (!scored.length) {
      $("perplexity").textContent = "Perplexity: needs at least 2 tokens";
    } else {
      const total = scored.reduce((a, b) => a + b, 0);
      const ppl = Math.exp(-total / scored.length);
      $("perplexity").textContent = `Perplexity: ${ppl < 1e6 ? ppl.toPrecision(6) : ppl.toFixed(0)} (${scored.length} tokens scored)`;
      $("perplexity").dataset.value = String(ppl);
    }
    setStatus("Done.");
  }

  // ------------------------------------------------------------------------------- look inside
  // One request a (block, position): that block's attention (every head) and the logit lens at that
  // position, kept as they come, so that moving around asks the server only for what is new. Selecting
  // token s shows the model choosing it: the query at s - 1 and its lens (s = ids.length is "what comes
  // next"; token 0 has no prediction).
  const insp = { ids: [], texts: [], sel: 0, layer: 0, head: "all", nLayer: 0, nHead: 0, eos: 50256,
                 attention: new Map(), lens: new Map(), fromOutput: false, seq: 0 };
  const query = () => Math.max(0, insp.sel - 1);
  const heat = (v) => Math.round(255 * (1 - Math.min(1, Math.max(0, v))));
  const lensShade = (p) => `hsl(210 80% ${Math.round(97 - 45 * Math.min(1, Math.max(0, p)))}%)`;

  function inspectStatus(text) { $("inspect-status").textContent = text; }

  async function tokenize(text) {
    const resp = await fetch("/tokenize", { method: "POST", headers: headers(),
                                            body: JSON.stringify({ content: text }) });
    if (!resp.ok) {
      await errorFromResponse(resp);
      return null;
    }
    const ids = (await resp.json()).tokens;
    return ids.length ? ids : [insp.eos];  // an empty text is <|endoftext|>, as for the completions
  }

  async function inspectText(text) {
    setStatus("Looking inside\u2026");
    const ids = await tokenize(text);
    if (ids) await openInspect(ids, ids.length, false);
  }

  async function openFromOutput(span) {
    if (!lastRun || controller) return;
    const k = Number(span.dataset.index);
    const ids = tokens.map((t) => t.id);
    if (ids.some((i) => i === null)) return;
    let before = [];
    if (lastRun.mode === "generate") {
      before = await tokenize(lastRun.prompt);
      if (!before) return;
    }
    await openInspect(before.concat(ids), before.length + k, true);
  }

  async function openInspect(ids, sel, fromOutput) {
    Object.assign(insp, { ids, sel, texts: [], attention: new Map(), lens: new Map(), fromOutput });
    $("err-inspect").textContent = "";
    $("inspect").hidden = false;
    if (await fetchMissing()) {
      setStatus("Done.");
      draw();
      const chosen = $("inspect-tokens").querySelector("[aria-selected=true]");
      if (chosen) { chosen.scrollIntoView({ block: "nearest" }); chosen.focus(); }
    }
  }

  async function fetchMissing() {
    const q = query();
    if (insp.attention.has(insp.layer) && insp.lens.has(q)) return true;
    const seq = ++insp.seq;
    inspectStatus("Looking inside\u2026");
    const body = { prompt: insp.ids, layers: [insp.layer], positions: [q], top: TOP_N };
    let resp;
    try {
      resp = await fetch("/v1/inspect", { method: "POST", headers: headers(), body: JSON.stringify(body) });
    } catch (error) {
      $("err-inspect").textContent = sentence(`the request failed: ${error && error.message}`);
      return false;
    }
    if (!resp.ok) {
      inspectStatus("");
      let error = null;
      try { error = (await resp.json()).error; } catch (_) { /* not JSON */ }
      error = error || { message: `the server answered ${resp.status} ${resp.statusText}` };
      if (mode() === "inspect") showError(error, resp.status);  // beside the text, as for the other modes
      $("err-inspect").textContent = sentence(error.message);
      return false;
    }
    const r = await resp.json();
    insp.texts = r.tokens;
    insp.nHead = r.heads.length;
    insp.nLayer = r.logit_lens.length - 1;
    insp.attention.set(r.layers[0], r.attention[0]);
    insp.lens.set(r.positions[0], r.logit_lens.map((layer) => layer[0]));
    if (seq === insp.seq) inspectStatus("");
    return seq === insp.seq;
  }

  async function refresh() {
    if (await fetchMissing()) draw();
  }

  function select(sel, focus) {
    if (!insp.ids.length) return;
    insp.sel = Math.max(0, Math.min(insp.ids.length, sel));
    drawTokens(focus);
    refresh();
  }

  function options(el, values, current) {
    if (el.options.length === values.length) return;
    el.textContent = "";
    for (const [value, text] of values) {
      const o = document.createElement("option");
      o.value = String(value);
      o.textContent = text;
      el.appendChild(o);
    }
    el.value = String(current);
  }

  function draw() {
    const layers = Array.from({ length: insp.nLayer }, (_, l) => [l, `block ${l}`]);
    options($("layer"), layers, insp.layer);
    const heads = [["all", "All heads"], ...Array.from({ length: insp.nHead }, (_, h) => [h, `head ${h}`])];
    options($("head"), heads, insp.head);
    drawTokens(false);
    drawHeatmaps();
    drawLens();
  }

  function drawTokens(focus) {
    // Updated in place once built, so that the focused token keeps the focus while data arrives.
    const strip = $("inspect-tokens");
    const n = insp.ids.length;
    if (strip.dataset.ids !== insp.ids.join(",") || strip.dataset.texts !== String(insp.texts.length)) {
      strip.textContent = "";
      strip.dataset.ids = insp.ids.join(",");
      strip.dataset.texts = String(insp.texts.length);
      for (let s = 0; s <= n; s++) {
        const span = document.createElement("span");
        span.className = "tok" + (s === n ? " next" : "");
        span.setAttribute("role", "option");
        span.dataset.sel = String(s);
        if (s < n) span.dataset.id = String(insp.ids[s]);
        span.textContent = s < n ? (insp.texts[s] !== undefined ? insp.texts[s] : "\u2026") : " \u27e8next\u27e9";
        strip.appendChild(span);
      }
    }
    for (const span of strip.children) {
      const on = Number(span.dataset.sel) === insp.sel;
      span.setAttribute("aria-selected", String(on));
      span.tabIndex = on ? 0 : -1;  // one tab stop; the arrow keys move inside
      if (on && focus) span.focus();
    }
  }

  function drawHeatmaps() {
    const box = $("heatmaps");
    box.textContent = "";
    const weights = insp.attention.get(insp.layer);
    if (!weights) return;
    const t = insp.ids.length;
    const heads = insp.head === "all" ? weights.map((_, h) => h) : [insp.head];
    const size = heads.length > 1 ? Math.max(120, Math.min(200, 4 * t)) : Math.max(240, Math.min(480, 12 * t));
    box.style.setProperty("--cell", size + 8 + "px");
    const q = query();
    for (const h of heads) {
      const fig = document.createElement("div");
      fig.className = "heatmap";
      fig.dataset.head = String(h);
      const title = document.createElement("div");
      title.className = "title";
      title.textContent = `block ${insp.layer}, head ${h}`;
      const canvas = document.createElement("canvas");
      canvas.width = t;
      canvas.height = t;
      canvas.style.width = canvas.style.height = size + "px";
      canvas.setAttribute("role", "img");
      canvas.setAttribute("aria-label", `Attention of block ${insp.layer}, head ${h}: ${t} queries by ${t} keys`);
      const image = canvas.getContext("2d").createImageData(t, t);
      const rows = weights[h];
      for (let i = 0; i < t; i++) {
        for (let j = 0; j < t; j++) {
          const c = heat(rows[i][j]);
          const at = 4 * (i * t + j);
          image.data[at] = c; image.data[at + 1] = c; image.data[at + 2] = 255; image.data[at + 3] = 255;
        }
      }
      canvas.getContext("2d").putImageData(image, 0, 0);
      canvas.addEventListener("mousemove", (e) => {
        const i = Math.min(t - 1, Math.floor(e.offsetY / size * t));
        const j = Math.min(t - 1, Math.floor(e.offsetX / size * t));
        inspectStatus(`head ${h}: query ${i} \u201c${visible(insp.texts[i] || "")}\u201d \u2192 key ${j} ` +
                      `\u201c${visible(insp.texts[j] || "")}\u201d: ${rows[i][j].toFixed(4)}`);
      });
      const mark = document.createElement("div");
      mark.className = "row";
      mark.style.height = Math.max(1, size / t) + "px";
      const wrap = document.createElement("div");
      wrap.style.position = "relative";
      wrap.style.width = size + 2 + "px";  // the row mark spans the canvas (and its border), no wider
      wrap.appendChild(canvas);
      wrap.appendChild(mark);
      mark.style.top = (q * size / t) + "px";
      fig.appendChild(title);
      fig.appendChild(wrap);
      box.appendChild(fig);
    }
    // In words, for the keyboard and screen readers: what the selected query attends to most.
    const say = heads.map((h) => {
      const row = weights[h][q].slice(0, q + 1);
      const best = row.map((v, j) => [v, j]).sort((a, b) => b[0] - a[0] || a[1] - b[1]).slice(0, 3);
      return `head ${h}: ` + best.map(([v, j]) => `\u201c${visible(insp.texts[j] || "")}\u201d ${v.toFixed(2)}`).join(", ");
    });
    $("attends").textContent = `Query ${q} \u201c${visible(insp.texts[q] || "")}\u201d attends most to \u2014 ` +
      say.join("; ");
  }

  function drawLens() {
    const table = $("lens");
    table.textContent = "";
    const n = insp.ids.length;
    if (insp.sel === 0) {
      $("lens-caption").textContent = "Logit lens: the first token has no prediction (nothing comes before it)";
      return;
    }
    const q = query();
    const lens = insp.lens.get(q);
    if (!lens) return;
    const chosen = insp.sel < n ? insp.ids[insp.sel] : null;
    $("lens-caption").textContent = `Logit lens after \u201c${visible(insp.texts[q] || "")}\u201d (position ${q}): ` +
      "what each layer would predict next" +
      (chosen !== null ? `; the chosen \u201c${visible(insp.texts[insp.sel] || "")}\u201d outlined` : "");
    const head = document.createElement("tr");
    for (const h of ["layer", ...Array.from({ length: TOP_N }, (_, i) => String(i + 1))]) {
      const th = document.createElement("th");
      th.scope = "col";
      th.textContent = h;
      head.appendChild(th);
    }
    table.appendChild(head);
    lens.forEach((entries, l) => {
      const tr = document.createElement("tr");
      tr.className = "lens-row";
      const th = document.createElement("th");
      th.scope = "row";
      th.textContent = l === 0 ? "embedding" : l === lens.length - 1 ? `output (${l})` : `block ${l - 1}`;
      tr.appendChild(th);
      for (const e of entries) {
        const td = document.createElement("td");
        td.textContent = `${visible(e.token)} ${fmtProb(e.probability)}`;
        td.style.background = lensShade(e.probability);
        td.dataset.id = String(e.token_id);
        td.dataset.p = String(e.probability);
        if (e.token_id === chosen) td.classList.add("chosen");
        tr.appendChild(td);
      }
      table.appendChild(tr);
    });
  }

  // ------------------------------------------------------------------------------------ wiring
  function setMode() {
    const m = mode();
    $("controls").hidden = m !== "generate";
    $("generate").textContent = { generate: "Generate", score: "Score", inspect: "Look inside" }[m];
    $("prompt-label").textContent = { generate: "Prompt", score: "Text to score",
                                      inspect: "Text to look inside" }[m];
    $("output-section").hidden = m === "inspect";
    if (m !== "inspect" && !insp.fromOutput) $("inspect").hidden = true;
  }

  async function loadModelName() {
    try {
      const resp = await fetch("/health");
      const health = await resp.json();
      if (health.model) $("model-name").textContent = `Model: ${health.model}`;
      const info = await (await fetch("/tokenizer_info")).json();
      insp.eos = info.eos_token_id;
    } catch (_) { /* the page still works */ }
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("form").addEventListener("submit", (e) => { e.preventDefault(); run(); });
    $("stop-button").addEventListener("click", () => { if (controller) controller.abort(); });
    $("show-ids").addEventListener("change", (e) => $("output").classList.toggle("show-ids", e.target.checked));
    for (const radio of document.querySelectorAll("input[name=mode]")) radio.addEventListener("change", setMode);
    $("constraint_kind").addEventListener("change", setConstraintKind);
    document.addEventListener("keydown", (e) => {
      if ((e.ctrlKey || e.metaKey) && e.key === "Enter") { e.preventDefault(); run(); }
      else if (e.key === "Escape") {
        if (activeTip) hideTip();
        else if (controller) controller.abort();
      }
    });
    const out = $("output");
    out.addEventListener("mouseover", (e) => { if (e.target.classList.contains("tok")) showTip(e.target); });
    out.addEventListener("mouseout", (e) => {
      if (e.target.classList.contains("tok") && document.activeElement !== e.target) hideTip();
    });
    out.addEventListener("focusin", (e) => { if (e.target.classList.contains("tok")) showTip(e.target); });
    out.addEventListener("focusout", () => hideTip());
    out.addEventListener("click", (e) => { if (e.target.classList.contains("tok")) openFromOutput(e.target); });
    out.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && e.target.classList.contains("tok")) { e.preventDefault(); openFromOutput(e.target); }
    });
    const strip = $("inspect-tokens");
    strip.addEventListener("click", (e) => {
      const span = e.target.closest(".tok");
      if (span) select(Number(span.dataset.sel), true);
    });
    strip.addEventListener("keydown", (e) => {
      const step = { ArrowLeft: -1, ArrowRight: 1, ArrowUp: -1, ArrowDown: 1 }[e.key];
      if (step !== undefined) select(insp.sel + step, true);
      else if (e.key === "Home") select(0, true);
      else if (e.key === "End") select(insp.ids.length, true);
      else return;
      e.preventDefault();
    });
    $("layer").addEventListener("change", () => { insp.layer = Number($("layer").value); refresh(); });
    $("head").addEventListener("change", () => {
      insp.head = $("head").value === "all" ? "all" : Number($("head").value);
      draw();
    });
    for (const name of CONTROLS) {
      $(name).addEventListener("input", () => {
        $(name).removeAttribute("aria-invalid");
        $("err-" + name).textContent = "";
      });
    }
    setMode();
    setConstraintKind();
    loadModelName();
  });
})();
