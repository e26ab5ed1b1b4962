// Keyboard stepping through the replay timeline: j = next step, k = previous. The URL hash is the deep link.
(function () {
  const steps = Array.from(document.querySelectorAll("#steps > li.step"));
  if (!steps.length) return;
  // -1 until a step is selected, so the first "j" selects the first step.
  let index = steps.findIndex((el) => "#" + el.id === window.location.hash);
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
  if (index >= 0) select(index);
})();
