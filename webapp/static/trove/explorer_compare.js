// "Compare the two checked runs": the explorer's selection opens the compare page for exactly two runs.
// Ids are read from the checkboxes' values and go into the URL through URLSearchParams only.
(function () {
  "use strict";
  const root = document.getElementById("compare-checked");
  if (!root) return;
  const note = document.getElementById("compare-checked-note");

  function checkedIds() {
    return Array.from(document.querySelectorAll('#trajectories input[name="checked"]:checked'),
      (box) => box.value).filter((id) => /^\d+$/.test(id));
  }

  document.getElementById("compare-checked-button").addEventListener("click", () => {
    const ids = checkedIds();
    if (ids.length !== 2) {
      note.textContent = `Check exactly two runs to compare them (${ids.length} checked).`;
      return;
    }
    const query = new URLSearchParams({ a: ids[0], b: ids[1] });
    window.location.assign(`${root.dataset.compareUrl}?${query}`);
  });
})();
