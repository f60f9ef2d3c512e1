// inferno playground: streams POST /v1/completions (fetch + ReadableStream; EventSource cannot POST),
// one focusable span per token shaded by its probability, the top 5 alternatives on hover or focus.
// Token ids come from the server's `return_token_ids` extension (see inferno/serve/completions.py).
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const TOP_N = 5;
  // Where an error's `param` is shown: the control of that name, else beside the button.
  const CONTROLS = ["prompt", "max_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "seed",
                    "stop", "api_key"];
  const ALIASES = { stop_token_ids: "stop", logit_bias: null, n: null };

  let controller = null; // the AbortController of the request in flight
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
    };
    const span = document.createElement("span");
    span.className = "tok" + (extraClass ? " " + extraClass : "");
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
    resetOutput();
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

  // ------------------------------------------------------------------------------------ wiring
  function setMode() {
    const scoring = mode() === "score";
    $("controls").hidden = scoring;
    $("generate").textContent = scoring ? "Score" : "Generate";
    $("prompt-label").textContent = scoring ? "Text to score" : "Prompt";
  }

  async function loadModelName() {
    try {
      const resp = await fetch("/health");
      const health = await resp.json();
      if (health.model) $("model-name").textContent = `Model: ${health.model}`;
    } catch (_) { /* the page still works */ }
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("form").addEventListener("submit", (e) => { e.preventDefault(); run(); });
    $("stop-button").addEventListener("click", () => { if (controller) controller.abort(); });
    $("show-ids").addEventListener("change", (e) => $("output").classList.toggle("show-ids", e.target.checked));
    for (const radio of document.querySelectorAll("input[name=mode]")) radio.addEventListener("change", setMode);
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
    for (const name of CONTROLS) {
      $(name).addEventListener("input", () => {
        $(name).removeAttribute("aria-invalid");
        $("err-" + name).textContent = "";
      });
    }
    setMode();
    loadModelName();
  });
})();
