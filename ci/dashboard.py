"""Render every committed run under bench/results/ into a static HTML dashboard (plotly), readable offline.

    python ci/dashboard.py --out DIR      writes DIR/index.html and DIR/plotly.min.js beside it

End to end: per model, format and sequence lengths, output tokens/s, TPOT and TTFT of ATOM's class and the
host's own class over the runs (median, whiskers min-max).  Kernels: per suite and case, ATOM's time, its
peers' and the physical floor over the runs.  Filters: model, quantization, batch, sequence length (end to
end); suite and token count (kernels).  The latest run's regression check and accuracy gate are shown on top.
``nox -s dashboard`` builds it from the committed results and tests it in headless Chromium.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from regression import REPORTED, STATUSES, THRESHOLDS, check, describe  # noqa: E402
from results import RESULTS, Run, load_runs  # noqa: E402

METRICS = (("output_tok_per_s", "output tokens/s"), ("tpot_ms", "TPOT ms"), ("ttft_ms", "TTFT ms"))
IMPL_COLORS = {"atom": "#d62728", "vllm": "#1f77b4", "sglang": "#2ca02c"}
PEER_COLORS = ("#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
DASHES = ("solid", "dot", "dash", "longdash", "dashdot", "longdashdot")
SIZE_KEYS = ("tokens", "M", "T", "batch")  # a kernel case's size: a trace of its chart, and the token filter
CHART_KEYS = ("op", "case", "shape")  # a kernel chart per suite and these; other fields name a trace's variant
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True}


def e2e_figure(records: list[dict], xs_order: list[str]):
    """Panels of throughput, TPOT, TTFT and ATOM / host throughput over the runs; a trace per implementation
    and batch.  ``rec["x"]`` is the record's point on the x axis (its run, and its file when a run has several)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    titles = [title for _, title in METRICS] + ["ATOM / host tokens/s"]
    fig = make_subplots(rows=1, cols=4, subplot_titles=titles, horizontal_spacing=0.05)
    series = defaultdict(dict)
    for rec in records:
        series[(rec["impl"], rec["batch"], rec["metric"])][rec["x"]] = rec
    batches = sorted({rec["batch"] for rec in records})
    for col, (metric, _) in enumerate(METRICS, start=1):
        for (impl, batch, m), points in sorted(series.items()):
            if m != metric:
                continue
            xs = [x for x in xs_order if x in points]
            med = [points[x]["median"] for x in xs]
            hi = [(points[x]["max"] or points[x]["median"]) - points[x]["median"] for x in xs]
            lo = [points[x]["median"] - (points[x]["min"] or points[x]["median"]) for x in xs]
            fig.add_trace(go.Scatter(
                x=xs, y=med, mode="lines+markers", name=f"{impl} batch {batch}", legendgroup=f"{impl}{batch}",
                showlegend=col == 1, meta={"batch": batch, "impl": impl},
                line={"color": IMPL_COLORS.get(impl, "#333"), "dash": DASHES[batches.index(batch) % len(DASHES)]},
                error_y={"type": "data", "array": hi, "arrayminus": lo, "visible": True, "thickness": 1},
                hovertemplate=f"{impl} batch {batch}<br>%{{x}}<br>%{{y:.4g}}<extra></extra>"), row=1, col=col)
    for batch in batches:
        atom = series.get(("atom", batch, "output_tok_per_s"), {})
        hosts = [points for (impl, b, m), points in series.items() if impl != "atom" and b == batch
                 and m == "output_tok_per_s"]
        if not atom or not hosts:
            continue
        xs = [x for x in xs_order if x in atom and x in hosts[0]]
        fig.add_trace(go.Scatter(
            x=xs, y=[atom[x]["median"] / hosts[0][x]["median"] for x in xs], mode="lines+markers",
            name=f"ratio batch {batch}", showlegend=False, meta={"batch": batch, "impl": "ratio"},
            line={"color": "#444", "dash": DASHES[batches.index(batch) % len(DASHES)]},
            hovertemplate=f"ATOM / host, batch {batch}<br>%{{x}}<br>%{{y:.3f}}<extra></extra>"), row=1, col=4)
    fig.add_hline(y=1.0, line={"color": "#bbb", "width": 1}, row=1, col=4)
    for col in (1, 2, 3):
        fig.update_yaxes(type="log", row=1, col=col)
    fig.update_xaxes(type="category", tickangle=-30)
    fig.update_layout(height=360, margin={"l": 50, "r": 10, "t": 40, "b": 90}, legend={"font": {"size": 10}},
                      template="plotly_white")
    return fig


def kernel_figure(records: list[dict], runs: list[str]):
    """Left: the newest run with this case, time per implementation and size (bars) and the floor (black ticks).
    Right: the same over the runs, a line per implementation and size, the floor dashed grey."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    series, floors = defaultdict(dict), defaultdict(dict)
    for rec in records:
        size = next((rec["case"][k] for k in SIZE_KEYS if k in rec["case"]), None)
        variant = " ".join(str(v) for k, v in sorted(rec["case"].items()) if k not in SIZE_KEYS + CHART_KEYS
                           and isinstance(v, str))
        series[(f"{rec['impl']} {variant}".strip(), size)][rec["run"]] = rec["us"]
        if isinstance(rec.get("floor_us"), (int, float)):
            floors[size][rec["run"]] = rec["floor_us"]
    impls = sorted({impl for impl, _ in series}, key=lambda i: (not i.startswith("atom"), i))
    sizes = sorted({size for _, size in series}, key=lambda s: (s is None, s if isinstance(s, int) else 0, str(s)))
    latest = max((r for points in series.values() for r in points), key=runs.index)
    shown = [i for i in impls if len(impls) <= 10 or " " not in i or "default" in i] or impls  # sweeps: defaults only
    fig = make_subplots(rows=1, cols=2, column_widths=[0.45, 0.55], horizontal_spacing=0.08,
                        subplot_titles=[f"{latest}: µs by size", "µs over the runs"])

    def color(impl: str) -> str:
        return IMPL_COLORS["atom"] if impl.startswith("atom") else PEER_COLORS[impls.index(impl) % len(PEER_COLORS)]

    for impl in shown:
        at = [size for size in sizes if latest in series.get((impl, size), {})]
        if at:
            fig.add_trace(go.Bar(x=[str(s) for s in at], y=[series[(impl, s)][latest] for s in at], name=impl,
                                 legendgroup=impl, marker_color=color(impl), meta={"impl": impl},
                                 opacity=1.0 if impl.startswith("atom") else 0.75,
                                 hovertemplate=f"{impl}<br>size %{{x}}<br>%{{y:.4g}} µs<extra></extra>"), row=1, col=1)
    at = [size for size in sizes if latest in floors.get(size, {})]
    if at:
        fig.add_trace(go.Scatter(x=[str(s) for s in at], y=[floors[s][latest] for s in at], mode="markers", name="floor",
                                 legendgroup="floor", meta={"impl": "floor"},
                                 marker={"symbol": "line-ew", "size": 40, "line": {"width": 3, "color": "#000"}},
                                 hovertemplate="floor<br>size %{x}<br>%{y:.4g} µs<extra></extra>"), row=1, col=1)
    for (impl, size), points in sorted(series.items(), key=lambda kv: (impls.index(kv[0][0]), sizes.index(kv[0][1]))):
        xs = [r for r in runs if r in points]
        label = impl if size is None else f"{impl} @ {size}"
        fig.add_trace(go.Scatter(x=xs, y=[points[r] for r in xs], mode="lines+markers", name=label, legendgroup=impl,
                                 showlegend=impl not in shown, meta={"size": size, "impl": impl},
                                 line={"color": color(impl), "dash": DASHES[sizes.index(size) % len(DASHES)],
                                       "width": 3 if impl.startswith("atom") else 1.5},
                                 hovertemplate=f"{label}<br>%{{x}}<br>%{{y:.4g}} µs<extra></extra>"), row=1, col=2)
    for size, points in floors.items():
        xs = [r for r in runs if r in points]
        fig.add_trace(go.Scatter(x=xs, y=[points[r] for r in xs], mode="lines+markers", name=f"floor @ {size}",
                                 legendgroup="floor", showlegend=False, meta={"size": size, "impl": "floor"},
                                 line={"color": "#999", "dash": "dash"}, marker={"symbol": "line-ew-open"},
                                 hovertemplate=f"floor @ {size}<br>%{{x}}<br>%{{y:.4g}} µs<extra></extra>"), row=1, col=2)
    fig.update_yaxes(type="log", title="µs")
    fig.update_xaxes(type="category", row=1, col=1, title="tokens / M / T")
    fig.update_xaxes(type="category", tickangle=-30, row=1, col=2)
    fig.update_layout(height=360, margin={"l": 50, "r": 10, "t": 40, "b": 80}, legend={"font": {"size": 10}},
                      template="plotly_white", barmode="group")
    return fig


def card(fig, div_id: str, title: str, attrs: dict) -> str:
    """A chart's section: the figure as JSON, drawn by dashboard.js when it scrolls into view."""
    data = " ".join(f'data-{k}="{html.escape(str(v))}"' for k, v in attrs.items())
    figure = fig.to_json().replace("</", "<\\/")
    return (f'<section class="card" {data}><h3>{html.escape(title)}</h3><div class="plot" id="{div_id}"></div>'
            f'<script type="application/json" class="figure">{figure}</script></section>')


def select(name: str, label: str, values) -> str:
    options = "".join(f'<option value="{html.escape(str(v))}">{html.escape(str(v))}</option>' for v in values)
    return f'<label>{label} <select id="filter-{name}" data-filter="{name}"><option value="">all</option>{options}</select></label>'


def summary(runs: list[Run]) -> str:
    """The latest run: its regression verdicts past a threshold and its accuracy gate."""
    if not runs:
        return "<p>No runs committed.</p>"
    latest = runs[-1]
    verdicts = check(runs, latest)
    shown = [v for v in verdicts if v["status"] in REPORTED]
    untested = [v for v in verdicts if v["status"] == "untested" and v.get("worse")]
    counts = {s: sum(v["status"] == s for v in verdicts) for s in STATUSES}
    items = "".join(f'<li class="{v["status"]}">{html.escape(describe(v))}</li>' for v in shown)
    acc = "".join(f'<li class="{"ok" if m.get("passed") else "regression"}">{html.escape(m.get("summary", ""))}</li>'
                  for r in runs[-3:] for m in r.accuracy)
    return (f'<h2>Latest run: {html.escape(latest.name)}</h2><p id="regression-counts">Regression check against the '
            f"previous run on the same GPU (thresholds {html.escape(json.dumps(THRESHOLDS))}, see ci/regression.py): "
            f"{counts['regression']} regressed, {counts['acknowledged']} acknowledged (explained in the run's "
            f"acknowledged.toml), {counts['unconfirmed']} past a threshold but unconfirmed, "
            f"{counts['untested']} without repeated samples, {counts['ok']} ok.</p><ul>{items}</ul>"
            + (f"<details><summary>{len(untested)} medians past a threshold, without repeated samples to state a "
               f"confidence</summary><ul>{''.join(f'<li class=untested>{html.escape(describe(v))}</li>' for v in untested)}"
               "</ul></details>" if untested else "")
            + (f"<h3>Accuracy gate</h3><ul>{acc}</ul>" if acc else ""))


def render(runs: list[Run]) -> str:
    names = [r.name for r in runs]
    e2e = [rec for r in runs for rec in r.e2e]
    kernels = [rec for r in runs for rec in r.kernels]
    cards = []
    groups = defaultdict(list)
    sources = defaultdict(set)
    for rec in e2e:
        sources[rec["run"]].add(rec["source"])
    for rec in e2e:  # a run with several end-to-end files gets a point per file
        tag = Path(rec["source"]).stem.removeprefix("vllm-e2e-").removeprefix("vllm-").replace(rec["model"], "")
        tag = "-".join(p for p in tag.split("-") if p)
        rec["x"] = f"{rec['run']} {tag}" if tag and len(sources[rec["run"]]) > 1 else rec["run"]
    xs_order = sorted({rec["x"] for rec in e2e}, key=lambda x: (names.index(x.split()[0]), x))
    for rec in e2e:
        groups[(rec["model"], rec["layers"], rec["quant"], f"{rec['prompt_len']}/{rec['output_len']}")].append(rec)
    for i, ((model, layers, quant, seq), recs) in enumerate(sorted(groups.items(), key=lambda kv: str(kv[0]))):
        title = f"{model} ({layers} layers, {quant}), prompt/output {seq} tokens: ATOM vs the host's own model"
        cards.append(card(e2e_figure(recs, xs_order), f"e2e-{i}", title,
                          {"kind": "e2e", "model": model, "quant": quant, "seq": seq}))
    kgroups = defaultdict(list)
    for rec in kernels:
        ident = tuple((k, rec["case"][k]) for k in CHART_KEYS if k in rec["case"])
        kgroups[(rec["suite"], ident)].append(rec)
    for i, ((suite, ident), recs) in enumerate(sorted(kgroups.items(), key=lambda kv: str(kv[0]))):
        title = f"{suite}: " + ", ".join(f"{k}={v}" for k, v in ident)
        cards.append(card(kernel_figure(recs, names), f"kernel-{i}", title, {"kind": "kernel", "suite": suite}))
    filters = "".join([
        select("model", "model", sorted({r["model"] for r in e2e})),
        select("quant", "quantization", sorted({r["quant"] for r in e2e})),
        select("batch", "batch", sorted({r["batch"] for r in e2e})),
        select("seq", "prompt/output tokens", sorted({f"{r['prompt_len']}/{r['output_len']}" for r in e2e})),
        select("suite", "kernel suite", sorted({r["suite"] for r in kernels})),
        select("size", "kernel tokens", sorted({str(r["case"][k]) for r in kernels for k in SIZE_KEYS
                                                 if k in r["case"]}, key=lambda s: (len(s), s))),
    ])
    skipped = "".join(f"<li>{html.escape(r.name)}/{html.escape(s)}</li>" for r in runs for s in r.skipped)
    script = (Path(__file__).with_name("dashboard.js")).read_text()
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>ATOM benchmark dashboard</title>
<script src="plotly.min.js"></script>
<script>const PLOTLY_CONFIG = {json.dumps(PLOTLY_CONFIG)};</script>
<style>
body {{ font-family: system-ui, sans-serif; margin: 0 24px 24px; color: #222; }}
header {{ position: sticky; top: 0; background: #fff; padding: 8px 0; border-bottom: 1px solid #ddd; z-index: 10; }}
header label {{ margin-right: 14px; font-size: 14px; }}
.card {{ border: 1px solid #e3e3e3; border-radius: 6px; margin: 14px 0; padding: 4px 10px; }}
.card h3 {{ font-size: 15px; margin: 6px 0; }}
li.regression {{ color: #b00; }} li.acknowledged {{ color: #706; }} li.unconfirmed {{ color: #a60; }} li.untested {{ color: #666; }}
#shown {{ font-size: 13px; color: #555; }}
</style></head><body>
<header><h1 style="margin:4px 0;font-size:22px">ATOM benchmark dashboard</h1>
<div id="filters">{filters}</div><div id="shown"></div></header>
{summary(runs)}
<p>{len(runs)} runs under bench/results ({html.escape(names[0] if names else '')} … {html.escape(names[-1] if names else '')});
x axes are runs in time order. Whiskers: min–max of the repeats; kernels: CUDA-graph replay medians, floor =
bytes or FLOPs over the measured copy bandwidth or matmul rate.</p>
<h2>End to end: ATOM's model class vs the host's own, same checkpoint</h2>
{''.join(c for c in cards if 'data-kind="e2e"' in c) or '<p>No end-to-end results.</p>'}
<h2>Kernels: ATOM vs peers vs floor</h2>
{''.join(c for c in cards if 'data-kind="kernel"' in c) or '<p>No kernel results.</p>'}
<details><summary>Files not read ({skipped.count('<li>')})</summary><ul>{skipped}</ul></details>
<script>{script}</script>
</body></html>"""


CHROMIUM = "/usr/bin/chromium"  # Debian's package (apt-get install chromium); playwright drives it, never downloads one
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextmanager
def browser_page(index: Path, width: int = 1400, height: int = 1000):
    """A headless Chromium page (fresh profile, no network) showing ``index`` from its file:// URL, once the
    first chart is drawn."""
    import tempfile

    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).is_file():
        raise SystemExit(f"dashboard: no Chromium at {CHROMIUM}: apt-get install -y chromium")
    with sync_playwright() as pw, tempfile.TemporaryDirectory(prefix="atom-chromium-") as profile:
        browser = pw.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, args=CHROMIUM_ARGS,
                                                        headless=True, viewport={"width": width, "height": height})
        try:
            page = browser.new_page()
            page.goto(index.resolve().as_uri())
            page.wait_for_function("document.querySelector('section.card[data-drawn] .main-svg') !== null",
                                   timeout=60_000)
            yield page
        finally:
            browser.close()


def chart_image(index: Path, png: Path) -> Path:
    """A PNG of the dashboard's first chart (the README shows it)."""
    with browser_page(index) as page:
        page.locator("section.card").first.screenshot(path=str(png))
    return png


def build(out: Path, results: Path = RESULTS) -> Path:
    from plotly.offline import get_plotlyjs

    out.mkdir(parents=True, exist_ok=True)
    (out / "plotly.min.js").write_text(get_plotlyjs())
    index = out / "index.html"
    index.write_text(render(load_runs(results)))
    return index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python ci/dashboard.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, required=True, help="folder for index.html and plotly.min.js")
    parser.add_argument("--chart-image", type=Path, help="also write a PNG of the first chart here (headless Chromium)")
    args = parser.parse_args(argv)
    index = build(args.out, args.results)
    print(f"dashboard: {index.resolve().as_uri()}")
    if args.chart_image:
        print(f"dashboard: chart image {chart_image(index, args.chart_image)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
