"""Regression check: a run against the previous one on the same GPU, with a stated confidence.

    python ci/regression.py                     the newest run under bench/results against earlier ones
    python ci/regression.py --new RUN_FOLDER    that run (a folder name under --results)

For every ATOM measurement of the new run (end-to-end throughput / TPOT / TTFT per model, format, batch and lengths;
kernel times per case) the previous measurement of the same case on the same GPU is the most recent earlier run that
has it. End to end, ATOM's numbers are taken over the host's own class in the same run (repeat by repeat) where both
runs have it: another machine of the same GPU moves both classes. A measurement is a **regression** when, at
CONFIDENCE, it got worse by more than its threshold: Welch's t-test on the log of the repeated samples (what
``atom_tools.e2e.vllm`` records per repeat), against the null hypothesis "new / old is at the threshold" (one-
sided). A change past the threshold that the samples cannot confirm is reported as **unconfirmed** (exit code 0); a
record without repeated samples on either side is **untested** (medians alone state no confidence). A regression the
new run's ``acknowledged.toml`` explains (``[[acknowledged]]`` entries: ``what``, an fnmatch pattern on the
verdict's label, and ``why``) is **acknowledged** (exit code 0, printed with its reason); an entry matching none is
a regression. The new run's accuracy gate counts too: a model whose gate failed is a regression. Exit code 1 when
anything regressed.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import E2E_METRICS, RESULTS, Run, e2e_key, kernel_key, kernel_label, load_runs  # noqa: E402

# The one place the thresholds live: relative change that counts as a regression, per kind of metric.
THRESHOLDS = {"throughput": 0.05, "latency": 0.10}
STATUSES = ("regression", "acknowledged", "unconfirmed", "untested", "ok")
REPORTED = ("regression", "acknowledged", "unconfirmed")  # the statuses printed (and shown on the dashboard) always
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


def host_baseline(run: Run, rec: dict) -> dict | None:
    """The host's own class's record of the measurement ``rec`` of ATOM's in the same run, if it ran there."""
    want = e2e_key(rec | {"impl": rec["host"]})
    return next((r for r in run.e2e if e2e_key(r) == want), None)


def relative(rec: dict, base: dict) -> dict:
    """``rec`` over the host's own class in its run: the medians' ratio, and each repeat's ratio (the bench runs the
    engines' repeats side by side, the i-th of each next to the other's)."""
    a, b = rec.get("samples") or [], base.get("samples") or []
    paired = a and len(a) == len(b) and min(a + b) > 0  # a TPOT sample can be negative (TTFT from another run)
    return {"median": rec["median"] / base["median"], "samples": [x / y for x, y in zip(a, b)] if paired else []}


def check(runs: list[Run], new: Run) -> list[dict]:
    """Every verdict of ``new`` against the earlier runs (ATOM's measurements only).  An end-to-end measurement is
    compared as ATOM's over the host's own class in the same run wherever both runs have the host's: two machines
    of one GPU kind differ (host CPU, clocks, neighbours) by as much as a regression does, for both classes."""
    verdicts = []
    by_name = {run.name: run for run in runs}
    old_e2e = previous_by_key(runs, new, "e2e", e2e_key)
    for rec in new.e2e:
        old = old_e2e.get(e2e_key(rec))
        if not (rec["impl"].startswith("atom") and old):
            continue
        engine = "" if rec["impl"] == "atom" else f" {rec['impl']}"
        label = (f"{rec['model']} {rec['quant']}{engine} batch {rec['batch']} in/out {rec['prompt_len']}/"
                 f"{rec['output_len']} {rec['metric']}")
        before, after = old, rec
        new_base, old_base = host_baseline(new, rec), host_baseline(by_name[old["run"]], old)
        if new_base and old_base:
            before, after = relative(old, old_base), relative(rec, new_base)
            label += f" / {rec['host']}'s own"
        verdicts.append({"what": label, "against": old["run"], **compare(E2E_METRICS[rec["metric"]], before, after)})
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
    return acknowledge(verdicts, new)


def acknowledge(verdicts: list[dict], new: Run) -> list[dict]:
    """The regressions the run's ``acknowledged.toml`` explains become "acknowledged" (with its ``why``); an entry
    that matches no regression is itself a regression (stale: the run no longer shows what it explains)."""
    for entry in new.acknowledged:
        matched = [v for v in verdicts if v["status"] == "regression" and fnmatch.fnmatchcase(v["what"], entry["what"])]
        for v in matched:
            v["status"], v["why"] = "acknowledged", entry["why"]
        if not matched and not any(v["status"] == "acknowledged" and fnmatch.fnmatchcase(v["what"], entry["what"])
                                   for v in verdicts):
            verdicts.append({"what": f"acknowledged.toml entry {entry['what']!r}", "against": new.name,
                             "status": "regression", "why": "matches no regression of the run"})
    return verdicts


def describe(v: dict) -> str:
    if "change" not in v:
        return f"{v['status']:>11}  {v['what']}: {v['why']}"
    text = f"{v['status']:>11}  {v['what']}: {v['old']:.4g} -> {v['new']:.4g} ({v['change']:+.1%}, limit {v['threshold']:.0%})"
    if "ci" in v:
        text += f", {CONFIDENCE:.0%} CI {v['ci'][0]:+.1%}..{v['ci'][1]:+.1%}, p={v['p']:.3g}, n={v['n'][0]}/{v['n'][1]}"
    return text + f" vs {v['against']}" + (f" [{' '.join(v['why'].split())}]" if v.get("why") else "")


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
    counts = {s: sum(v["status"] == s for v in verdicts) for s in STATUSES}
    for v in verdicts:
        if args.all or v["status"] in REPORTED or v.get("worse"):
            print(describe(v))
    print(f"regression check of {new.name} ({new.gpu}): {counts['regression']} regressed, "
          f"{counts['acknowledged']} acknowledged (the run's acknowledged.toml), {counts['unconfirmed']} "
          f"past a threshold but not at {CONFIDENCE:.0%} confidence, {counts['untested']} without repeated samples "
          f"({sum(v['status'] == 'untested' and v.get('worse', False) for v in verdicts)} of them past a threshold), "
          f"{counts['ok']} ok; thresholds {THRESHOLDS}")
    if args.json:
        args.json.write_text(json.dumps({"run": new.name, "thresholds": THRESHOLDS, "confidence": CONFIDENCE,
                                         "verdicts": verdicts}, indent=1))
    return 1 if counts["regression"] else 0


if __name__ == "__main__":
    sys.exit(main())
