// The run page: a virtualised list of step views (only the chunks near the viewport are in the DOM), fetched
// in pages from the steps API as you scroll or jump; a timeline drawn on a canvas from the run's step index;
// the context lens of a model call fetched when opened; filters, search, jumps and keyboard shortcuts.
// Every text goes in through textContent: step content is whatever an agent wrote.
(function () {
  "use strict";
  const configNode = document.getElementById("run-config");
  const runNode = document.getElementById("run");
  if (!configNode || !runNode) return;
  const config = JSON.parse(configNode.textContent);
  const api = runNode.dataset.stepsApi; // .../trajectories/<id>/steps/
  const CHUNK = 25; // rows per chunk: the unit of rendering and of fetching
  const ROW_ESTIMATE = 110; // px, for chunks not yet measured
  const MARGIN = 1200; // px beyond the viewport kept rendered
  const SCREEN_LINES = 30; // output lines shown before "show all"
  const LANES = [
    ["model", ["model_call"]], ["tool / command", ["tool_call", "command", "observation", "file_change"]],
    ["eval", ["eval"]], ["sandbox", ["sandbox_event"]], ["message / note", ["message", "note"]],
  ];
  const KIND_COLOURS = { model_call: "#7c3aed", tool_call: "#0891b2", command: "#2563eb", observation: "#64748b",
    file_change: "#ca8a04", eval: "#1f9d55", sandbox_event: "#9ca3af", message: "#475569", note: "#9ca3af" };

  const state = {
    order: [], // seqs of the rows shown, in order (all steps, or those the filter keeps)
    views: new Map(), // seq -> step view
    pending: new Map(), // chunk -> promise
    heights: [], // per chunk: measured px, or null
    rendered: new Map(), // chunk -> element
    current: -1, // row index of the selected step
    index: null, // the run's step index, once fetched
    hidden: new Set(), // kinds filtered out
    expanded: false,
    matches: [], match: -1, query: "",
  };
  const viewport = document.getElementById("viewport");
  const list = document.getElementById("steps");
  const spacerTop = document.getElementById("spacer-top");
  const spacerBottom = document.getElementById("spacer-bottom");

  // ------------------------------------------------------------ small DOM helpers
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") el.className = value;
      else if (key === "text") el.textContent = value;
      else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
      else el.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children) if (child) el.append(child);
    return el;
  }
  function fmtMs(ms) {
    if (ms === null || ms === undefined) return null;
    if (ms < 1000) return ms.toFixed(ms < 10 ? 1 : 0) + " ms";
    if (ms < 60000) return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + " s";
    return (ms / 60000).toFixed(1) + " min";
  }
  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then((r) => {
      if (!r.ok) throw new Error(url + ": HTTP " + r.status);
      return r.json();
    });
  }
  function stepLink(seq, label) {
    return h("a", { href: "#step-" + seq, class: "step-link", "data-seq": seq, text: label });
  }

  // ------------------------------------------------------------ rendering one step
  function collapsible(text, cls, seq) {
    const lines = text.split("\n");
    const pre = h("pre", { class: cls });
    if (lines.length <= SCREEN_LINES) { pre.textContent = text; return pre; }
    pre.textContent = lines.slice(0, SCREEN_LINES).join("\n");
    const more = h("button", { type: "button", class: "more", text: "Show all " + lines.length + " lines" });
    more.addEventListener("click", () => { pre.textContent = text; more.remove(); remeasure(); });
    const box = h("div", { class: "collapsible" }, pre, more);
    box.dataset.seq = seq;
    return box;
  }
  function output(view) {
    if (view.output === undefined || view.output === null) return null;
    const box = h("div", { class: "output-box" });
    box.append(view.output === "" ? h("p", { class: "muted", text: "(no output)" }) : collapsible(view.output, "output", view.seq));
    if (view.output_chars > view.output.length) {
      const all = h("button", { type: "button", class: "more", text: "Fetch the whole output (" + view.output_chars + " characters)" });
      all.addEventListener("click", () => getJSON(api + view.seq + "/view/").then((full) => {
        box.replaceChildren(h("pre", { class: "output", text: full.output })); remeasure();
      }));
      box.append(all);
    }
    return box;
  }
  function diffBlock(diff) {
    const box = h("div", { class: "diff-view" });
    for (const file of diff.files) {
      const pre = h("pre", { class: "diff" });
      for (const line of file.text.split("\n")) {
        const cls = line.startsWith("+++") || line.startsWith("---") || line.startsWith("diff ") ? "d-file"
          : line.startsWith("@@") ? "d-hunk" : line.startsWith("+") ? "d-add" : line.startsWith("-") ? "d-del" : "d-ctx";
        pre.append(h("span", { class: cls, text: line + "\n" }));
      }
      box.append(h("div", { class: "diff-file" },
        h("div", { class: "diff-head" }, h("code", { text: file.path || "(diff)" }),
          h("span", { class: "d-add", text: " +" + file.added }), h("span", { class: "d-del", text: " −" + file.removed })), pre));
    }
    if (diff.omitted.length) box.append(h("p", { class: "muted", text: "Left out (build artefacts): " + diff.omitted.join(", ") }));
    return box;
  }
  function toolCalls(view) {
    if (!view.tool_calls || !view.tool_calls.length) return null;
    const box = h("div", { class: "tool-calls" });
    for (const call of view.tool_calls) {
      box.append(h("div", { class: "tool-call", "data-call-id": call.id || "" },
        h("div", { class: "tool-head" }, h("span", { class: "tool-name", text: call.name }),
          call.id ? h("span", { class: "muted call-id", text: call.id }) : null,
          call.result_seq !== undefined ? stepLink(call.result_seq, "→ result #" + call.result_seq) : null),
        call.arguments ? h("pre", { class: "args", text: call.arguments }) : null));
    }
    return box;
  }
  function details(summary, body, cls) {
    const el = h("details", { class: cls || null }, h("summary", { text: summary }), body);
    if (state.expanded) el.open = true;
    el.addEventListener("toggle", remeasure);
    return el;
  }
  function contextLens(view) {
    const el = h("details", { class: "context" }, h("summary", { text: "Context the model saw (" + view.n_context + " messages)" }));
    el.addEventListener("toggle", () => {
      if (el.open && !el.dataset.loaded) {
        el.dataset.loaded = "1";
        const body = h("div", { class: "lens", text: "Loading…" });
        el.append(body);
        getJSON(api + view.seq + "/context/").then((lens) => { body.replaceChildren(...renderLens(lens, view.seq)); remeasure(); })
          .catch((err) => { body.textContent = String(err); });
      }
      remeasure();
    });
    return el;
  }
  function message(m, cls) {
    return h("div", { class: "msg role-" + m.role + (cls ? " " + cls : ""), "data-index": m.index },
      h("span", { class: "role", text: m.role + (m.name ? " (" + m.name + ")" : "") + " · #" + m.index }),
      m.tokens !== undefined ? h("span", { class: "tokens", title: m.tokens_estimated ? "estimated" : "from the prompt-token count", text: tokenText(m.tokens, m.tokens_estimated) }) : null,
      m.content ? h("pre", { text: m.content }) : null, toolCalls(m),
      m.tool_call_id ? h("span", { class: "muted", text: "answers " + m.tool_call_id }) : null);
  }
  function tokenText(count, estimated) {
    return (estimated ? "≈ " : "") + count.toLocaleString("en") + " tokens";
  }
  function renderLens(lens, seq) {
    const parts = [];
    if (lens.first) parts.push(h("p", { class: "muted", text: "The run's first model call: every message is new." }));
    else {
      const unchanged = h("details", { class: "unchanged" }, h("summary", { text: lens.unchanged + " earlier messages unchanged" + (lens.previous_seq !== null ? " since #" + lens.previous_seq : "") + (lens.unchanged_tokens !== undefined ? " (" + tokenText(lens.unchanged_tokens, false) + ")" : "") }));
      unchanged.addEventListener("toggle", () => {
        if (unchanged.open && !unchanged.dataset.loaded) {
          unchanged.dataset.loaded = "1";
          getJSON(api + seq + "/context/?unchanged=1").then((full) => { unchanged.append(...full.unchanged_messages.map((m) => message(m))); remeasure(); });
        }
        remeasure();
      });
      parts.push(unchanged);
    }
    for (const change of lens.rewrites) {
      const what = { dropped: "dropped " + change.removed + " message(s)", edited: "edited " + change.removed + " message(s)",
        inserted: "inserted " + change.added + " message(s)", system_reminder: "added a system reminder",
        compacted: "compacted " + change.removed + " messages into " + change.added }[change.kind];
      const pre = h("pre", { class: "diff" });
      for (const line of change.diff.split("\n")) pre.append(h("span", { class: line.startsWith("+") ? "d-add" : line.startsWith("-") ? "d-del" : line.startsWith("@@") ? "d-hunk" : "d-ctx", text: line + "\n" }));
      parts.push(h("div", { class: "rewrite", "data-kind": change.kind }, h("strong", { text: "History rewritten: the harness " + what + " at message #" + change.at }), pre));
    }
    const newTokens = lens.new_tokens !== undefined ? " · " + tokenText(lens.new_tokens, lens.new_tokens_estimated) +
      " (counted from " + lens.tokens_source + (lens.new_tokens_estimated ? ", shared out by characters" : "") + ")" : "";
    parts.push(h("p", { class: "lens-new-head", text: lens.new.length + " new message(s) since the previous call" + newTokens }));
    for (const m of lens.new) parts.push(message(m, "new"));
    return parts;
  }
  function scoreBlock(score) {
    const verdict = score.passed === true ? "passed" : score.passed === false ? "failed" : "scored";
    const rows = [["Score", score.value], ["Reward", score.reward], ["Target", score.target], ["Answer", score.answer]]
      .filter(([, v]) => v !== undefined && v !== null && v !== "");
    return h("div", { class: "score " + verdict },
      h("span", { class: "verdict verdict-" + verdict, text: verdict }),
      h("dl", {}, ...rows.flatMap(([k, v]) => [h("dt", { text: k }), h("dd", { text: typeof v === "string" ? v : JSON.stringify(v) })])),
      score.explanation ? h("div", { class: "explanation" }, h("span", { class: "label", text: "Explanation" }), h("pre", { text: score.explanation })) : null);
  }
  function head(view) {
    const bits = [stepLink(view.seq, "#" + view.seq), h("span", { class: "kind", text: view.kind.replace("_", " ") })];
    bits.push(h("span", { class: "title", text: view.title || "" }));
    if (view.exit_code !== undefined) bits.push(h("span", { class: "exit " + (view.exit_code === 0 ? "exit-ok" : "exit-bad"), text: "exit " + view.exit_code }));
    if (view.duration_ms !== undefined) bits.push(h("span", { class: "muted", text: fmtMs(view.duration_ms) }));
    if (view.tokens_in !== undefined) bits.push(h("span", { class: "muted", text: view.tokens_in + " → " + (view.tokens_out ?? "?") + " tokens" }));
    if (view.latency_ms !== undefined) bits.push(h("span", { class: "muted", text: "latency " + fmtMs(view.latency_ms) }));
    if (view.value_estimate !== undefined) bits.push(h("span", { class: "muted", text: "value " + view.value_estimate.toFixed(2) }));
    if (view.call_seq !== undefined) bits.push(stepLink(view.call_seq, "← call #" + view.call_seq));
    else if (view.result_of) bits.push(h("span", { class: "muted", text: "answers " + view.result_of }));
    return h("div", { class: "step-head" }, ...bits);
  }
  function body(view) {
    const parts = [];
    switch (view.kind) {
      case "model_call":
        if (view.n_context) parts.push(contextLens(view));
        if (view.reasoning) parts.push(details("Reasoning", h("pre", { class: "reasoning", text: view.reasoning }), "reasoning"));
        if (view.response) parts.push(h("div", { class: "msg role-assistant" }, h("span", { class: "role", text: "response" + (view.stop_reason ? " · " + view.stop_reason : "") }), collapsible(view.response, "response", view.seq)));
        parts.push(toolCalls(view));
        if (!view.response && !view.tool_calls) parts.push(h("p", { class: "muted", text: "(empty response)" }));
        break;
      case "tool_call":
        parts.push(toolCalls(view) || h("pre", { text: view.text || "" }));
        break;
      case "eval":
        parts.push(scoreBlock(view.score));
        if (view.command) parts.push(h("pre", { class: "cmd", text: "$ " + view.command }));
        parts.push(output(view));
        break;
      case "file_change":
        if (view.diff) parts.push(diffBlock(view.diff)); else if (view.text) parts.push(collapsible(view.text, "text", view.seq));
        if (view.output) parts.push(details("Tool output", h("pre", { text: view.output })));
        break;
      case "command": case "sandbox_event":
        if (view.action && view.kind === "sandbox_event") parts.push(h("span", { class: "muted", text: view.action }));
        if (view.command !== undefined) parts.push(h("pre", { class: "cmd", text: "$ " + view.command }));
        parts.push(output(view));
        break;
      case "message":
        parts.push(h("div", { class: "msg role-" + (view.role || "user") }, h("span", { class: "role", text: view.role || "message" }), collapsible(view.text || "", "text", view.seq)));
        break;
      default:
        parts.push(collapsible(view.text || "", "text", view.seq));
    }
    return parts;
  }
  function renderStep(view, row) {
    const li = h("li", { class: "step kind-" + view.kind + (view.failed ? " failed" : "") + (row === state.current ? " current" : ""),
      id: "step-" + view.seq, "data-seq": view.seq, "data-row": row });
    li.append(head(view), ...body(view).filter(Boolean));
    if (state.query) highlight(li);
    return li;
  }
  function placeholder(seq, row) {
    return h("li", { class: "step loading", id: "step-" + seq, "data-seq": seq, "data-row": row, text: "#" + seq + " …" });
  }

  // ------------------------------------------------------------ the virtual list
  const chunkCount = () => Math.ceil(state.order.length / CHUNK);
  const chunkHeight = (c) => state.heights[c] ?? Math.min(CHUNK, state.order.length - c * CHUNK) * ROW_ESTIMATE;
  function chunkTop(c) { let y = 0; for (let i = 0; i < c; i++) y += chunkHeight(i); return y; }
  function totalHeight() { let y = 0; for (let i = 0, n = chunkCount(); i < n; i++) y += chunkHeight(i); return y; }
  function chunkAt(y) {
    let top = 0;
    for (let c = 0, n = chunkCount(); c < n; c++) { const hgt = chunkHeight(c); if (top + hgt > y) return c; top += hgt; }
    return Math.max(0, chunkCount() - 1);
  }
  function loadChunk(c) {
    const seqs = state.order.slice(c * CHUNK, (c + 1) * CHUNK).filter((s) => !state.views.has(s));
    if (!seqs.length) return Promise.resolve();
    if (!state.pending.has(c)) {
      state.pending.set(c, getJSON(api + "view/?seqs=" + seqs.join(",")).then((page) => {
        for (const view of page.results) state.views.set(view.seq, view);
      }).finally(() => state.pending.delete(c)));
    }
    return state.pending.get(c);
  }
  function buildChunk(c) {
    const el = h("div", { class: "chunk", "data-chunk": c });
    const seqs = state.order.slice(c * CHUNK, (c + 1) * CHUNK);
    let missing = false;
    seqs.forEach((seq, i) => {
      const view = state.views.get(seq);
      if (!view) missing = true;
      el.append(view ? renderStep(view, c * CHUNK + i) : placeholder(seq, c * CHUNK + i));
    });
    if (missing) loadChunk(c).then(() => { if (state.rendered.get(c) === el) { state.rendered.delete(c); el.remove(); schedule(); } });
    return el;
  }
  let frame = 0;
  function schedule() { if (!frame) frame = requestAnimationFrame(() => { frame = 0; render(); }); }
  function render({ anchored = true } = {}) {
    const anchor = anchored ? anchorOf() : null; // what is at the top of the viewport stays there while chunks come and go
    const top = viewport.scrollTop, bottom = top + viewport.clientHeight;
    const first = chunkAt(Math.max(0, top - MARGIN)), last = chunkAt(bottom + MARGIN);
    for (const [c, el] of state.rendered) if (c < first || c > last) { el.remove(); state.rendered.delete(c); }
    let before = null;
    for (let c = last; c >= first; c--) { // back to front, so each chunk goes before the one after it
      let el = state.rendered.get(c);
      if (!el) { el = buildChunk(c); state.rendered.set(c, el); list.insertBefore(el, before); }
      before = el;
    }
    measure(first, last);
    if (anchor && anchor.el.isConnected) viewport.scrollTop += anchor.el.getBoundingClientRect().top - anchor.top;
  }
  function anchorOf() {
    const box = viewport.getBoundingClientRect();
    for (const el of list.querySelectorAll("li.step")) {
      const rect = el.getBoundingClientRect();
      if (rect.bottom > box.top) return { el, top: rect.top };
    }
    return null;
  }
  function measure(first, last) {
    for (let c = first; c <= last; c++) {
      const el = state.rendered.get(c);
      if (el && !el.querySelector(".loading")) state.heights[c] = el.offsetHeight;
    }
    spacerTop.style.height = chunkTop(first) + "px";
    let below = 0; for (let c = last + 1, n = chunkCount(); c < n; c++) below += chunkHeight(c);
    spacerBottom.style.height = below + "px";
  }
  // A rendered chunk changed size (a lens or an output opened, the window resized): measure it now. Forgetting
  // its height instead let the next render place the viewport by estimates and drop the very chunk in view.
  function remeasure() {
    for (const [c, el] of state.rendered) if (!el.querySelector(".loading")) state.heights[c] = el.offsetHeight;
    schedule();
  }
  function resetList() {
    for (const el of state.rendered.values()) el.remove();
    state.rendered.clear(); state.heights = new Array(chunkCount()).fill(null);
    schedule();
  }
  viewport.addEventListener("scroll", () => { schedule(); followScroll(); }, { passive: true });
  window.addEventListener("resize", remeasure);

  // ------------------------------------------------------------ selecting and jumping
  function rowOf(seq) { return state.order.indexOf(seq); }
  async function select(row, { scroll = true } = {}) {
    if (!state.order.length) return;
    row = Math.min(state.order.length - 1, Math.max(0, row));
    state.current = row;
    const seq = state.order[row];
    history.replaceState(null, "", "#step-" + seq + (state.query ? "&q=" + encodeURIComponent(state.query) : ""));
    document.getElementById("step-position").textContent = "step " + (row + 1) + " of " + state.order.length;
    if (scroll) await scrollToRow(row);
    for (const el of list.querySelectorAll("li.step.current")) el.classList.remove("current");
    const el = document.getElementById("step-" + seq);
    if (el) el.classList.add("current");
    drawMarker();
  }
  async function scrollToRow(row) {
    const c = Math.floor(row / CHUNK);
    await loadChunk(c);
    for (let attempt = 0; attempt < 3; attempt++) { // estimates above settle as chunks are measured
      viewport.scrollTop = chunkTop(c);
      render({ anchored: false });
      const el = document.getElementById("step-" + state.order[row]);
      if (el && !el.classList.contains("loading")) {
        const offset = el.getBoundingClientRect().top - viewport.getBoundingClientRect().top;
        viewport.scrollTop += offset - 8;
        render();
        if (Math.abs(el.getBoundingClientRect().top - viewport.getBoundingClientRect().top - 8) < 2) return;
      } else await loadChunk(c);
    }
  }
  function jumpToSeq(seq) {
    let row = rowOf(seq);
    if (row < 0 && state.hidden.size) { state.hidden.clear(); applyFilter(); row = rowOf(seq); }
    if (row >= 0) select(row);
  }
  let following = 0;
  function followScroll() { // the timeline marker follows the step at the top of the viewport
    clearTimeout(following);
    following = setTimeout(() => {
      const box = viewport.getBoundingClientRect();
      const el = document.elementFromPoint(box.left + 40, box.top + 20);
      const li = el && el.closest("li.step");
      if (li) { inView = Number(li.dataset.seq); drawMarker(); }
    }, 50);
  }
  let inView = null;

  // ------------------------------------------------------------ filters, search, collapse
  function applyFilter() {
    const idx = state.index;
    if (!idx) return;
    const keep = [];
    for (let i = 0; i < idx.n; i++) if (!state.hidden.has(idx.kinds[idx.kind[i]])) keep.push(idx.seq[i]);
    const currentSeq = state.order[state.current];
    state.order = keep;
    state.current = currentSeq === undefined ? -1 : rowOf(currentSeq);
    resetList();
    drawTimeline();
  }
  function buildFilters() {
    const box = document.getElementById("kind-filters");
    const counts = {};
    for (let i = 0; i < state.index.n; i++) { const k = state.index.kinds[state.index.kind[i]]; counts[k] = (counts[k] || 0) + 1; }
    box.replaceChildren(h("span", { class: "muted", text: "Show: " }));
    for (const kind of state.index.kinds) {
      if (!counts[kind]) continue;
      const input = h("input", { type: "checkbox", checked: true, "data-kind": kind });
      input.addEventListener("change", () => { if (input.checked) state.hidden.delete(kind); else state.hidden.add(kind); applyFilter(); });
      box.append(h("label", { class: "chip", style: "--chip:" + KIND_COLOURS[kind] }, input, " " + kind.replace("_", " ") + " (" + counts[kind] + ")"));
    }
  }
  async function search(query) {
    state.query = query.trim();
    const count = document.getElementById("search-count");
    if (!state.query) { state.matches = []; count.textContent = ""; resetList(); return; }
    const result = await getJSON(api + "search/?q=" + encodeURIComponent(state.query));
    state.matches = result.seqs;
    state.match = -1;
    count.textContent = result.seqs.length ? result.seqs.length + (result.seqs.length >= 1000 ? "+" : "") + " steps match" : "no match";
    resetList();
    drawTimeline();
    if (result.seqs.length) nextMatch(1);
  }
  function nextMatch(direction) {
    if (!state.matches.length) return;
    state.match = (state.match + direction + state.matches.length) % state.matches.length;
    document.getElementById("search-count").textContent = "match " + (state.match + 1) + " of " + state.matches.length;
    jumpToSeq(state.matches[state.match]);
  }
  function highlight(li) {
    const q = state.query.toLowerCase();
    if (!q) return;
    for (const pre of li.querySelectorAll("pre, .title, .tool-name")) {
      if (pre.textContent.toLowerCase().includes(q)) { pre.classList.add("match"); li.classList.add("has-match"); }
    }
  }
  function toggleAll() {
    state.expanded = !state.expanded;
    document.getElementById("toggle-all").textContent = state.expanded ? "Collapse all" : "Expand all";
    for (const el of list.querySelectorAll("details:not(.context)")) el.open = state.expanded;
    remeasure();
  }
  function jumpMark(name) {
    if (!state.index) return;
    const marks = state.index.marks;
    const seq = name === "evals" ? marks.evals[marks.evals.length - 1] : marks[name];
    if (seq === null || seq === undefined) { flash(name === "evals" ? "This run has no evaluation." : name === "first_error" ? "No step failed." : "No edit in this run."); return; }
    jumpToSeq(seq);
  }
  function flash(text) { const note = document.getElementById("search-count"); note.textContent = text; }

  // ------------------------------------------------------------ the timeline
  const canvas = document.getElementById("timeline-canvas");
  const tip = document.getElementById("timeline-tip");
  const LANE_H = 18, AXIS_H = 22, VALUE_H = 44, LEFT = 112;
  let geometry = null;
  function laneOf(kind) { return LANES.findIndex(([, kinds]) => kinds.includes(kind)); }
  function layout() {
    const idx = state.index, n = idx.n;
    const xs = new Float64Array(n), ws = new Float64Array(n);
    if (idx.timed) {
      let cursor = 0;
      for (let i = 0; i < n; i++) {
        const start = idx.start[i] ?? cursor, dur = idx.dur[i] ?? 0;
        xs[i] = start; ws[i] = dur; cursor = Math.max(cursor, start + dur);
      }
      return { xs, ws, span: Math.max(1, maxEnd(xs, ws)), unit: "time" };
    }
    for (let i = 0; i < n; i++) { xs[i] = i; ws[i] = 1; }
    return { xs, ws, span: Math.max(1, n), unit: "step" };
  }
  function maxEnd(xs, ws) { let m = 0; for (let i = 0; i < xs.length; i++) m = Math.max(m, xs[i] + ws[i]); return m; }
  function drawTimeline() {
    if (!state.index) return;
    const idx = state.index;
    const hasValue = !!idx.value;
    const width = canvas.parentElement.clientWidth;
    const height = LANES.length * LANE_H + AXIS_H + (hasValue ? VALUE_H + 14 : 0);
    const ratio = window.devicePixelRatio || 1;
    canvas.width = width * ratio; canvas.height = height * ratio;
    canvas.style.width = width + "px"; canvas.style.height = height + "px";
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const lay = layout();
    const plot = width - LEFT - 8;
    const scale = plot / lay.span;
    geometry = { lay, scale, width, height, plot, hasValue };
    ctx.font = "11px system-ui, sans-serif";
    LANES.forEach(([name], lane) => {
      ctx.fillStyle = lane % 2 ? "#f3f4f6" : "#e9ecf1";
      ctx.fillRect(LEFT, lane * LANE_H, plot, LANE_H);
      ctx.fillStyle = "#4b5563"; ctx.fillText(name, 4, lane * LANE_H + 13);
    });
    const matches = new Set(state.matches);
    for (let i = 0; i < idx.n; i++) {
      const kind = idx.kinds[idx.kind[i]];
      const lane = laneOf(kind);
      const x = LEFT + lay.xs[i] * scale, w = Math.max(1.5, lay.ws[i] * scale); // a minimum width: no step disappears
      ctx.globalAlpha = state.hidden.has(kind) ? 0.2 : 0.9;
      ctx.fillStyle = idx.flags[i] & 1 ? "#cc1f1a" : KIND_COLOURS[kind] || "#9ca3af";
      ctx.fillRect(x, lane * LANE_H + 3, w, LANE_H - 6);
      if (matches.has(idx.seq[i])) { ctx.fillStyle = "#f59e0b"; ctx.fillRect(x, lane * LANE_H, Math.max(2, w), 3); }
    }
    ctx.globalAlpha = 1;
    drawAxis(ctx, lay, scale, LANES.length * LANE_H);
    if (hasValue) drawValue(ctx, lay, scale, LANES.length * LANE_H + AXIS_H + 6);
    drawMarker();
  }
  function niceStep(span, target) {
    const raw = span / target, pow = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * pow >= raw) return m * pow;
    return 10 * pow;
  }
  function drawAxis(ctx, lay, scale, y) {
    ctx.strokeStyle = "#9ca3af"; ctx.fillStyle = "#4b5563";
    ctx.beginPath(); ctx.moveTo(LEFT, y + 1); ctx.lineTo(LEFT + lay.span * scale, y + 1); ctx.stroke();
    const step = niceStep(lay.span, Math.max(2, Math.floor(geometry.plot / 90)));
    for (let t = 0; t <= lay.span; t += step) {
      const x = LEFT + t * scale;
      ctx.beginPath(); ctx.moveTo(x, y + 1); ctx.lineTo(x, y + 5); ctx.stroke();
      const label = lay.unit === "time" ? fmtMs(t) : "#" + Math.round(t);
      ctx.fillText(label, Math.min(x + 2, geometry.width - 40), y + 16);
    }
    ctx.fillText(lay.unit === "time" ? "time" : "step", 4, y + 16);
  }
  function drawValue(ctx, lay, scale, y) {
    const idx = state.index;
    ctx.fillStyle = "#4b5563"; ctx.strokeStyle = "#d1d5db";
    ctx.fillText("value", 4, y + VALUE_H / 2 + 4);
    for (const v of [0, 0.5, 1]) {
      const vy = y + VALUE_H - v * VALUE_H;
      ctx.beginPath(); ctx.moveTo(LEFT, vy); ctx.lineTo(LEFT + geometry.plot, vy); ctx.stroke();
      ctx.fillText(v.toFixed(1), LEFT - 24, vy + 4);
    }
    ctx.strokeStyle = "#2563eb"; ctx.lineWidth = 1.5; ctx.beginPath();
    let started = false;
    for (let i = 0; i < idx.n; i++) {
      const v = idx.value[i];
      if (v === null) continue;
      const x = LEFT + (lay.xs[i] + lay.ws[i] / 2) * scale, vy = y + VALUE_H - v * VALUE_H;
      if (started) ctx.lineTo(x, vy); else { ctx.moveTo(x, vy); started = true; }
    }
    ctx.stroke(); ctx.lineWidth = 1;
    geometry.valueTop = y;
  }
  const marker = document.getElementById("timeline-marker");
  function drawMarker() { // a line over the canvas at the selected step, or at the step in view
    if (!geometry || !state.index) return;
    const seq = state.current >= 0 ? state.order[state.current] : inView;
    const i = seq === null || seq === undefined ? -1 : state.index.seq.indexOf(seq);
    if (i < 0) { marker.hidden = true; return; }
    marker.style.left = (LEFT + (geometry.lay.xs[i] + geometry.lay.ws[i] / 2) * geometry.scale - 1) + "px";
    marker.style.height = geometry.height + "px";
    marker.hidden = false;
    marker.dataset.seq = seq;
  }
  function stepAtX(px, py) {
    if (!geometry) return -1;
    const lane = Math.floor(py / LANE_H);
    const t = (px - LEFT) / geometry.scale;
    const { xs, ws } = geometry.lay;
    let best = -1, bestDist = Infinity;
    const tol = 3 / geometry.scale;
    for (let i = 0; i < state.index.n; i++) {
      if (lane < LANES.length && laneOf(state.index.kinds[state.index.kind[i]]) !== lane) continue;
      const d = t < xs[i] ? xs[i] - t : t > xs[i] + ws[i] ? t - xs[i] - ws[i] : 0;
      if (d < bestDist) { bestDist = d; best = i; }
      if (d === 0 && xs[i] > t) break;
    }
    return bestDist <= Math.max(tol, 1) || lane >= LANES.length ? best : -1;
  }
  let tipTimer = 0;
  canvas.addEventListener("mousemove", (event) => {
    const box = canvas.getBoundingClientRect();
    const i = stepAtX(event.clientX - box.left, event.clientY - box.top);
    if (i < 0) { tip.hidden = true; return; }
    const idx = state.index, seq = idx.seq[i];
    const bits = ["#" + seq, idx.kinds[idx.kind[i]].replace("_", " ")];
    if (idx.dur[i] !== null) bits.push(fmtMs(idx.dur[i]));
    if (idx.value && idx.value[i] !== null) bits.push("value " + idx.value[i].toFixed(2));
    if (idx.flags[i] & 1) bits.push("failed");
    tip.textContent = bits.join(" · ");
    tip.style.left = Math.min(event.clientX - box.left + 12, box.width - 240) + "px";
    tip.style.top = (event.clientY - box.top + 14) + "px";
    tip.hidden = false;
    clearTimeout(tipTimer);
    tipTimer = setTimeout(() => { // a preview: the step's title, from the cache or one small fetch
      const show = (view) => { if (!tip.hidden && tip.dataset.seq === String(seq)) tip.textContent = bits.join(" · ") + "\n" + (view.title || ""); };
      tip.dataset.seq = seq;
      if (state.views.has(seq)) show(state.views.get(seq));
      else getJSON(api + "view/?seqs=" + seq).then((page) => { if (page.results[0]) { state.views.set(seq, page.results[0]); show(page.results[0]); } });
    }, 120);
  });
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
  canvas.addEventListener("click", (event) => {
    const box = canvas.getBoundingClientRect();
    const i = stepAtX(event.clientX - box.left, event.clientY - box.top);
    if (i >= 0) jumpToSeq(state.index.seq[i]);
  });
  window.addEventListener("resize", drawTimeline);

  // ------------------------------------------------------------ final diff, keys, buttons
  if (config.final_diff) {
    document.getElementById("final-diff").append(h("h2", { text: "Workspace diff" }), diffBlock(config.final_diff));
  }
  const help = document.getElementById("help");
  function toggleHelp(show) { help.hidden = show === undefined ? !help.hidden : !show; }
  const searchInput = document.getElementById("run-search");
  document.addEventListener("keydown", (event) => {
    if (event.target.closest("input:not([type=checkbox]), textarea, select")) { // typing, not a shortcut
      if (event.key === "Escape") event.target.blur();
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const keys = {
      j: () => select(state.current + 1), k: () => select(state.current - 1), g: () => select(0),
      G: () => select(state.order.length - 1), n: () => nextMatch(1), N: () => nextMatch(-1),
      e: () => jumpMark("first_error"), d: () => jumpMark("first_edit"), v: () => jumpMark("evals"),
      c: toggleAll, "?": () => toggleHelp(), Escape: () => toggleHelp(false),
      "/": () => searchInput.focus(),
      o: () => { const el = document.querySelector("li.step.current"); if (el) for (const d of el.querySelectorAll("details")) d.open = !d.open; },
    };
    const action = keys[event.key];
    if (action) { event.preventDefault(); action(); }
  });
  searchInput.addEventListener("keydown", (event) => {
    if (event.key === "Enter") { event.preventDefault(); if (searchInput.value.trim() === state.query && state.matches.length) nextMatch(event.shiftKey ? -1 : 1); else search(searchInput.value); }
  });
  const on = (id, fn) => document.getElementById(id).addEventListener("click", fn);
  on("search-next", () => (searchInput.value.trim() !== state.query ? search(searchInput.value) : nextMatch(1)));
  on("search-prev", () => nextMatch(-1));
  on("jump-error", () => jumpMark("first_error"));
  on("jump-edit", () => jumpMark("first_edit"));
  on("jump-eval", () => jumpMark("evals"));
  on("jump-last", () => select(state.order.length - 1));
  on("toggle-all", toggleAll);
  on("help-open", () => toggleHelp(true));
  on("help-close", () => toggleHelp(false));
  on("step-prev", () => select(state.current - 1));
  on("step-next", () => select(state.current + 1));
  list.addEventListener("click", (event) => {
    const link = event.target.closest("a.step-link");
    if (!link) return;
    event.preventDefault();
    jumpToSeq(Number(link.dataset.seq));
  });

  // ------------------------------------------------------------ start: the embedded first screen, then the index
  function parseHash() {
    const out = {};
    for (const part of window.location.hash.replace(/^#/, "").split("&")) {
      const m = part.match(/^step-(\d+)$/);
      if (m) out.step = Number(m[1]);
      else if (part.startsWith("q=")) out.q = decodeURIComponent(part.slice(2));
    }
    return out;
  }
  for (const view of config.first) state.views.set(view.seq, view);
  // Until the index arrives, rows are the seqs 0..n-1 (seqs are dense) after the embedded ones.
  const firstSeqs = config.first.map((v) => v.seq);
  const lastKnown = firstSeqs.length ? firstSeqs[firstSeqs.length - 1] : -1;
  state.order = firstSeqs.concat(Array.from({ length: Math.max(0, config.n_steps - firstSeqs.length) }, (_, i) => lastKnown + 1 + i));
  state.heights = new Array(chunkCount()).fill(null);
  render();
  document.getElementById("step-position").textContent = state.order.length + " steps";
  const wanted = parseHash();
  window.trovePage = { state, select, jumpToSeq, ready: false };
  // The index (every step in columns: timeline, filters, jumps) is asked for once the first screen is painted:
  // at 30,000 steps the server's work on it would otherwise compete with making the page usable.
  const afterFirstPaint = (fn) => requestAnimationFrame(() => setTimeout(fn, 0));
  afterFirstPaint(() => getJSON(api + "index/").then((idx) => {
    state.index = idx;
    document.getElementById("value-curve").hidden = !idx.value;
    if (idx.seq.length !== state.order.length || idx.seq.some((s, i) => s !== state.order[i])) { state.order = idx.seq.slice(); resetList(); }
    document.getElementById("timeline-note").textContent = idx.timed
      ? "Lanes by kind on the run's time axis; a step is at least a pixel and a half wide. Click to jump; the black line marks the step in view."
      : "This run has no timestamps: one slot per step, in order. Click to jump; the black line marks the step in view.";
    buildFilters();
    drawTimeline();
    followScroll(); // the marker shows the step in view from the start
    window.trovePage.ready = true;
    document.body.dataset.indexReady = "1";
  }));
  if (wanted.q) { searchInput.value = wanted.q; search(wanted.q); }
  else if (wanted.step !== undefined) jumpToSeq(wanted.step);
  window.addEventListener("hashchange", () => { // a link to a step pasted into this page's address bar
    const target = parseHash();
    if (target.step !== undefined && state.order[state.current] !== target.step) jumpToSeq(target.step);
  });
  document.body.dataset.runReady = "1";
})();
