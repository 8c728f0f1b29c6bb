// Drawing and filters of the dashboard (ci/dashboard.py).  Each card holds its figure as JSON and is drawn
// when it first scrolls into view.  A card is shown when its data-* attributes match every chosen value it
// has; inside a shown chart, traces whose meta (batch, kernel size) does not match are hidden.
const chosen = {};

function traceVisible(t) {
  const m = t.meta || {};
  if (chosen.batch && m.batch !== undefined && String(m.batch) !== chosen.batch) return false;
  if (chosen.size && m.size !== undefined && String(m.size) !== chosen.size) return false;
  return true;
}

function figureOf(card) {
  if (!card._figure) card._figure = JSON.parse(card.querySelector("script.figure").textContent);
  return card._figure;
}

function draw(card) {
  const fig = figureOf(card);
  fig.data.forEach((t) => { t.visible = traceVisible(t); });
  const plot = card.querySelector("div.plot");
  Plotly.react(plot, fig.data, fig.layout, PLOTLY_CONFIG);
  card.dataset.drawn = "1";
}

const observer = new IntersectionObserver((entries) => {
  entries.forEach((e) => { if (e.isIntersecting && e.target.style.display !== "none") draw(e.target); });
}, { rootMargin: "400px" });

function applyFilters() {
  document.querySelectorAll("select[data-filter]").forEach((s) => { chosen[s.dataset.filter] = s.value; });
  const e2eChosen = chosen.model || chosen.quant || chosen.seq || chosen.batch;
  let shown = 0;
  document.querySelectorAll("section.card").forEach((card) => {
    let show = ["model", "quant", "seq", "suite"].every(
      (k) => !chosen[k] || card.dataset[k] === undefined || card.dataset[k] === chosen[k]);
    if (chosen.suite && card.dataset.kind === "e2e") show = false;
    if (e2eChosen && card.dataset.kind === "kernel") show = false;
    if (chosen.size && card.dataset.kind === "e2e") show = false;
    if (show) show = figureOf(card).data.some(traceVisible);
    card.style.display = show ? "" : "none";
    if (show) {
      shown += 1;
      if (card.dataset.drawn) draw(card);
    }
  });
  document.getElementById("shown").textContent = `${shown} charts shown`;
}

document.querySelectorAll("select[data-filter]").forEach((s) => s.addEventListener("change", applyFilters));
applyFilters();
document.querySelectorAll("section.card").forEach((card) => observer.observe(card));
