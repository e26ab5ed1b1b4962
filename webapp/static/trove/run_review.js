// The run page's review panel: the step-label form follows the step selected in the replay (the page keeps
// it in the address, #step-N), so a curator clicks a step, picks a label and writes a note. The form is a
// plain POST and works without this script (type the step number).
(function () {
  "use strict";
  const form = document.getElementById("step-label-form");
  if (!form) return;
  const seq = document.getElementById("step-label-seq");
  const current = document.getElementById("step-label-current");

  function selectedStep() {
    const m = window.location.hash.match(/step-(\d+)/);
    return m ? Number(m[1]) : null;
  }

  function choose(step) {
    seq.value = String(step);
    current.textContent = "the selected step, #" + step;
  }

  function follow() {
    const step = selectedStep();
    if (step !== null) choose(step);
  }

  // A click on a step chooses it. The replay's own moves (next / previous, keys, jumps) change the address
  // with history.replaceState, which fires no event: read it after each click or key, and on a hash change.
  document.addEventListener("click", (event) => {
    if (form.contains(event.target)) return;
    const step = event.target.closest && event.target.closest("li.step[data-seq]");
    if (step) choose(Number(step.dataset.seq));
    else window.setTimeout(follow, 0);
  });
  document.addEventListener("keyup", (event) => { if (!form.contains(event.target)) follow(); });
  window.addEventListener("hashchange", follow);
  follow();
})();
