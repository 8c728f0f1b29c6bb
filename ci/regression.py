"""Regression check: a run against the previous one on the same GPU, with a stated confidence.

    python ci/regression.py                     the newest run under bench/results against earlier ones
    python ci/regression.py --new RUN_FOLDER    that run (a folder name under --results)

For every ATOM measurement of the new run (end-to-end throughput / TPOT / TTFT per model, format, batch and
lengths; kernel times per case) the previous measurement of the same case on the same GPU is the most recent
earlier run that has it.  A measurement is a **regression** when, at CONFIDENCE, it got worse by more than
its threshold: Welch's t-test on the log of the repeated samples (what ``atom_tools.e2e.vllm`` records per
repeat), against the null hypothesis "new / old is at the threshold" (one-sided).  A change past the
threshold that the samples cannot confirm is reported as **unconfirmed** (exit code 0); a record without
repeated samples on either side is **untested** (medians alone state no confidence).  The new run's accuracy
gate counts too: a model whose gate failed is a regression.  Exit code 1 when anything regressed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import E2E_METRICS, RESULTS, Run, e2e_key, kernel_key, kernel_label, load_runs  # noqa: E402

# The one place the thresholds live: relative change that counts as a regression, per kind of metric.
THRESHOLDS = {"throughput": 0.05, "latency": 0.10}
CONFIDENCE = 0.95


def compare(kind: str, old: dict, new: dict) -> dict:
    """Verdict on one measurement: ``kind`` is "throughput" (higher is better) or "latency"."""
    threshold = THRESHOLDS[kind]
    change = new["median"] / old["median"] - 1
    worse = change < -threshold if kind == "throughput" else change > threshold
    verdict = {"change": change, "threshold": threshold, "worse": worse, "old": old["median"], "new": new["median"]}
    a, b = old.get("samples") or [], new.get("samples") or []
    if len(a) < 2 or len(b) < 2:
        return verdict | {"status": "untested", "why": "no repeated samples in " + ("both" if not a and not b
                                                                                 else "one") + " run(s)"}
    from scipy import stats

    x, y = [math.log(v) for v in b], [math.log(v) for v in a]
    shift = math.log(1 - threshold) if kind == "throughput" else math.log(1 + threshold)
    if max(x) == min(x) and max(y) == min(y):  # no spread: the point estimate is exact
        p = 0.0 if worse else 1.0
        low = high = change
    else:
        test = stats.ttest_ind(x, [v + shift for v in y], equal_var=False,
                               alternative="less" if kind == "throughput" else "greater")
        p = float(test.pvalue)
        ci = stats.ttest_ind(x, y, equal_var=False).confidence_interval(CONFIDENCE)
        low, high = math.exp(ci.low) - 1, math.exp(ci.high) - 1
    status = "regression" if p < 1 - CONFIDENCE else ("unconfirmed" if worse else "ok")
    return verdict | {"status": status, "p": p, "ci": [low, high], "n": [len(a), len(b)]}


def previous_by_key(runs: list[Run], new: Run, records: str, key) -> dict:
    """Key -> the most recent earlier record of the same case on the same GPU."""
    seen = {}
    for run in runs:
        if run.gpu != new.gpu or (run.time, run.name) >= (new.time, new.name):
            continue
        for rec in getattr(run, records):
            seen[key(rec)] = rec
    return seen


def check(runs: list[Run], new: Run) -> list[dict]:
    """Every verdict of ``new`` against the earlier runs (ATOM's measurements only)."""
    verdicts = []
    old_e2e = previous_by_key(runs, new, "e2e", e2e_key)
    for rec in new.e2e:
        old = old_e2e.get(e2e_key(rec))
        if rec["impl"].startswith("atom") and old:
            label = (f"{rec['model']} {rec['quant']} batch {rec['batch']} in/out {rec['prompt_len']}/"
                     f"{rec['output_len']} {rec['metric']}")
            verdicts.append({"what": label, "against": old["run"], **compare(E2E_METRICS[rec["metric"]], old, rec)})
    old_kernels = previous_by_key(runs, new, "kernels", kernel_key)
    for rec in new.kernels:
        old = old_kernels.get(kernel_key(rec))
        if rec["impl"].startswith("atom") and old:
            verdicts.append({"what": f"{kernel_label(rec)} {rec['impl']} us", "against": old["run"],
                             **compare("latency", {"median": old["us"], "samples": old["samples"]},
                                       {"median": rec["us"], "samples": rec["samples"]})})
    for rec in new.accuracy:
        verdicts.append({"what": f"accuracy gate {rec.get('model')}", "against": "bound",
                         "status": "ok" if rec.get("passed") else "regression", "why": rec.get("summary", "")})
    return verdicts


def describe(v: dict) -> str:
    if "change" not in v:
        return f"{v['status']:>11}  {v['what']}: {v['why']}"
    text = f"{v['status']:>11}  {v['what']}: {v['old']:.4g} -> {v['new']:.4g} ({v['change']:+.1%}, limit {v['threshold']:.0%})"
    if "ci" in v:
        text += f", {CONFIDENCE:.0%} CI {v['ci'][0]:+.1%}..{v['ci'][1]:+.1%}, p={v['p']:.3g}, n={v['n'][0]}/{v['n'][1]}"
    return text + f" vs {v['against']}" + (f" [{v['why']}]" if v.get("why") else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python ci/regression.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of run folders")
    parser.add_argument("--new", help="the run to check (a folder name); default: the newest")
    parser.add_argument("--json", type=Path, help="also write the verdicts here")
    parser.add_argument("--all", action="store_true", help="print every verdict, not only the ones past a threshold")
    args = parser.parse_args(argv)
    runs = load_runs(args.results)
    if not runs:
        print(f"regression: no runs under {args.results}", file=sys.stderr)
        return 2
    by_name = {r.name: r for r in runs}
    if args.new and args.new not in by_name:
        print(f"regression: no run folder {args.new} under {args.results}", file=sys.stderr)
        return 2
    new = by_name[args.new] if args.new else runs[-1]
    verdicts = check(runs, new)
    counts = {s: sum(v["status"] == s for v in verdicts) for s in ("regression", "unconfirmed", "untested", "ok")}
    for v in verdicts:
        if args.all or v["status"] in ("regression", "unconfirmed") or v.get("worse"):
            print(describe(v))
    print(f"regression check of {new.name} ({new.gpu}): {counts['regression']} regressed, {counts['unconfirmed']} "
          f"past a threshold but not at {CONFIDENCE:.0%} confidence, {counts['untested']} without repeated samples "
          f"({sum(v['status'] == 'untested' and v.get('worse', False) for v in verdicts)} of them past a threshold), "
          f"{counts['ok']} ok; thresholds {THRESHOLDS}")
    if args.json:
        args.json.write_text(json.dumps({"run": new.name, "thresholds": THRESHOLDS, "confidence": CONFIDENCE,
                                         "verdicts": verdicts}, indent=1))
    return 1 if counts["regression"] else 0


if __name__ == "__main__":
    sys.exit(main())
