// The explorer's saved filters: a name for the page's query string, kept in this browser (localStorage),
// listed in a menu that opens them. Names and queries go in through textContent / value only.
(function () {
  "use strict";
  const root = document.getElementById("saved-filters");
  if (!root) return;
  const KEY = "trove.explorer.saved-filters";
  const list = document.getElementById("saved-filter-list");
  const base = root.dataset.explorerUrl;

  function load() {
    try { return JSON.parse(localStorage.getItem(KEY) || "{}"); } catch (e) { return {}; }
  }

  function draw() {
    const saved = load();
    list.querySelectorAll("option[data-saved]").forEach((o) => o.remove());
    Object.keys(saved).sort().forEach((name) => {
      const option = document.createElement("option");
      option.value = name;
      option.textContent = name;
      option.dataset.saved = "1";
      list.appendChild(option);
    });
  }

  document.getElementById("save-filter").addEventListener("click", () => {
    const name = (window.prompt("A name for these filters") || "").trim();
    if (!name) return;
    const saved = load();
    saved[name] = window.location.search.replace(/^\?/, "").replace(/(^|&)after=[^&]*/g, "");
    localStorage.setItem(KEY, JSON.stringify(saved));
    draw();
    list.value = name;
  });
  document.getElementById("forget-filter").addEventListener("click", () => {
    const saved = load();
    if (!list.value || !(list.value in saved)) return;
    delete saved[list.value];
    localStorage.setItem(KEY, JSON.stringify(saved));
    draw();
  });
  list.addEventListener("change", () => {
    const saved = load();
    if (list.value in saved) window.location.href = base + (saved[list.value] ? "?" + saved[list.value] : "");
  });
  draw();
})();
