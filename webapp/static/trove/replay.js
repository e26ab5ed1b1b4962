// Keyboard stepping through the replay timeline: j = next step, k = previous. The URL hash is the deep link.
(function () {
  const steps = Array.from(document.querySelectorAll("#steps > li.step"));
  if (!steps.length) return;
  let index = Math.max(0, steps.findIndex((el) => "#" + el.id === window.location.hash));
  function select(i) {
    index = Math.min(steps.length - 1, Math.max(0, i));
    steps.forEach((el) => el.classList.remove("current"));
    steps[index].classList.add("current");
    history.replaceState(null, "", "#" + steps[index].id);
    steps[index].scrollIntoView({ block: "nearest" });
  }
  document.addEventListener("keydown", (event) => {
    if (event.target.closest("input, textarea")) return;
    if (event.key === "j") select(index + 1);
    if (event.key === "k") select(index - 1);
  });
  if (window.location.hash) select(index);
})();
