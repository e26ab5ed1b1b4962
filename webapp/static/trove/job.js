// The job page, live: polls the job's JSON snapshot every 2 s and redraws the progress bar, the running
// count against the job's concurrency, the success rate, throughput and ETA, the tasks x samples grid and the per-task budget. Stops once the job has ended.
// Text goes in through textContent only, so task keys and statuses can never inject markup.
(function () {
  "use strict";
  const root = document.getElementById("job");
  if (!root) return;
  const url = root.dataset.liveUrl;
  const POLL_MS = 2000;

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    Object.entries(attrs || {}).forEach(([k, v]) => node.setAttribute(k, v));
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function setText(id, text) {
    const node = document.getElementById(id);
    if (node) node.textContent = text;
  }

  function percent(x) {
    return x === null || x === undefined ? "–" : Math.round(x * 100) + "%";
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    if (seconds < 60) return seconds + " s";
    const m = Math.floor(seconds / 60), s = seconds % 60;
    if (m < 60) return m + " min " + s + " s";
    return Math.floor(m / 60) + " h " + (m % 60) + " min";
  }

  function drawProgress(snap) {
    const p = snap.progress;
    const bar = document.getElementById("progress-bar");
    bar.max = Math.max(1, p.total);
    bar.value = p.finished;
    setText("progress", p.finished + "/" + p.total + " finished (" + p.percent + "%)");
    const list = document.getElementById("by-status");
    list.replaceChildren(...Object.entries(p.by_status).map(([s, n]) => el("li", {}, s + ": " + n)));
    const status = document.getElementById("job-status");
    status.textContent = snap.job.status;
    status.className = "status status-" + snap.job.status;
    setText("running", p.running + " of at most " + p.concurrency);
    setText("queued", String(p.queued));
    setText("success-rate", percent(p.success_rate));
    setText("throughput", snap.throughput_per_min === null ? "–" : snap.throughput_per_min + " rollouts/min");
    setText("eta", snap.job.open ? duration(snap.eta_s) : "done");
    setText("budget-spent", snap.budget.spent + " of " + snap.budget.total + " samples"
      + (snap.budget.may_still_spend ? " (" + snap.budget.may_still_spend + " more may follow)" : ""));
  }

  function cell(sample, template) {
    const [index, status, trajectoryId] = sample;
    const attrs = { class: "cell cell-" + status, title: "sample " + index + ": " + status };
    if (trajectoryId) attrs.href = template.replace("{id}", trajectoryId);
    return el(trajectoryId ? "a" : "span", attrs, index);
  }

  function drawGrid(snap) {
    const rows = snap.grid.map((row) => {
      const cells = el("td", { class: "cells" });
      cells.append(...row.cells.map((sample) => cell(sample, snap.trajectory_url)));
      const finished = row.cells.filter((c) => !["queued", "running"].includes(c[1])).length;
      const succeeded = row.cells.filter((c) => c[1] === "succeeded").length;
      const tr = el("tr");
      tr.append(el("td", {}, row.task), el("td", {}, row.difficulty), cells, el("td", {}, succeeded + "/" + finished));
      return tr;
    });
    document.querySelector("#grid tbody").replaceChildren(...rows);
  }

  function drawBudget(snap) {
    const rows = snap.budget.per_task.map((t) => {
      const tr = el("tr", { class: t.stopped ? "stopped" : "" });
      tr.append(el("td", {}, t.task), el("td", {}, t.spent), el("td", {}, t.queued), el("td", {}, t.running),
        el("td", {}, t.succeeded),
        el("td", {}, t.failed), el("td", {}, t.infra_error), el("td", {}, percent(t.pass_rate)),
        el("td", {}, t.stopped_because || (t.open ? "sampling" : "–")));
      return tr;
    });
    document.querySelector("#budget tbody").replaceChildren(...rows);
  }

  async function poll() {
    let open = true;
    try {
      const response = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
      if (response.ok) {
        const snap = await response.json();
        drawProgress(snap);
        drawGrid(snap);
        drawBudget(snap);
        open = snap.job.open;
        root.dataset.updated = new Date().toISOString();
      }
    } catch (error) {
      // The server may be restarting: keep polling.
    }
    if (open) window.setTimeout(poll, POLL_MS);
  }

  poll();
})();
