// Working a review queue with the keyboard: j / k move the current step, l labels it, a approves, r rejects
// (focus the reason; Enter sends), s skips, n takes the next run. A pairs queue: w focuses the reason, 1 / 2
// say A / B is better. Every action is the page's own form, so the
// keys only press its buttons. Keys typed into a field are the field's.
(function () {
  "use strict";
  const steps = Array.from(document.querySelectorAll("#queue-steps li[data-seq]"));
  let current = 0;

  function show(index) {
    if (!steps.length) return;
    current = Math.max(0, Math.min(steps.length - 1, index));
    steps.forEach((li, i) => li.classList.toggle("current", i === current));
    const seq = steps[current].dataset.seq;
    const input = document.getElementById("queue-label-seq");
    if (input) input.value = seq;
    const shown = document.getElementById("queue-current-step");
    if (shown) shown.textContent = seq;
    const back = document.querySelector("#queue-label-form input[name=next]");
    if (back) back.value = window.location.pathname + "#step-" + seq;  // come back to this step
    steps[current].scrollIntoView({ block: "nearest" });
  }

  function press(id) {
    const button = document.getElementById(id);
    if (button) button.click();
  }

  document.addEventListener("keydown", (event) => {
    const typing = event.target.closest && event.target.closest("input, textarea, select");
    if (typing) {
      if (event.key === "Enter" && event.target.id === "reason") { event.preventDefault(); press("reject"); }
      if (event.key === "Escape") event.target.blur();
      return;
    }
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const actions = {
      j: () => show(current + 1), k: () => show(current - 1), a: () => press("approve"), s: () => press("skip"),
      n: () => press("take-next"), 1: () => press("prefer-a"), 2: () => press("prefer-b"),
      w: () => { const reason = document.getElementById("reason"); if (reason) reason.focus(); },
      r: () => { const reason = document.getElementById("reason"); if (reason) reason.focus(); },
      l: () => { const form = document.getElementById("queue-label-form"); if (form) form.requestSubmit(); },
    };
    if (actions[event.key]) { event.preventDefault(); actions[event.key](); }
  });
  steps.forEach((li, i) => li.addEventListener("click", () => show(i)));
  const linked = window.location.hash.match(/step-(\d+)/);
  if (linked) show(steps.findIndex((li) => li.dataset.seq === linked[1]));
  // The keys work from here on: the page is usable before this script has run (it loads last), and a key
  // pressed earlier does nothing. Tests wait for this mark, as the run page's wait for data-run-ready.
  document.body.dataset.keysReady = "1";
})();
