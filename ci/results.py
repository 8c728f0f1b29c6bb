"""Read every committed benchmark result under bench/results/ into flat records, whatever the file's layout.

A *run* is one folder ``bench/results/<stamp>-<gpu>/`` (the stamp orders runs in time).  Inside it, JSON
files of three known shapes are read, at the top level or nested one level (``ci/gpu_run.py`` writes one
``run.json`` holding all three):

* kernel suites, ``python -m atom_tools.kernels``: ``{"context": {...}, "suites": {name: [row, ...]}}``;
* end to end, ``python -m atom_tools.e2e.vllm``: ``{"gpu", "vllm", "settings", "models": [...]}``;
* accuracy, ``python -m atom_tools.accuracy``: ``{"accuracy": {"models": [...]}}``.

Anything else (experiment data, test summaries) is skipped with its reason, never an error.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
E2E_METRICS = {"output_tok_per_s": "throughput", "tpot_ms": "latency", "ttft_ms": "latency"}
# kernel row fields that are measurements or derived from them, never part of a case's identity
KERNEL_MEASURES = {"us", "graph", "bytes", "TBps", "floor_us", "x_floor", "ratio_to_floor", "error", "samples_us",
                   "flops", "floor_kind", "met", "meets_target"}
STAMP = re.compile(r"^(\d{4}-\d{2}-\d{2})(?:T(\d{2})(\d{2}))?-(.+)$")


@dataclass
class Run:
    name: str  # folder relative to bench/results, e.g. 2026-12-03T1600-h200
    time: str  # ISO-like sortable time from the folder name
    gpu: str
    e2e: list[dict] = field(default_factory=list)
    kernels: list[dict] = field(default_factory=list)
    accuracy: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    # regressions this run shows that were looked at and explained (``acknowledged.toml`` in its folder: ``what``, an
    # fnmatch pattern on ci/regression.py's verdict labels, and ``why``)
    acknowledged: list[dict] = field(default_factory=list)


def run_time(folder: str) -> tuple[str, str]:
    """(sortable time, gpu tag) of a run folder name; unparsable names sort first under their own name."""
    m = STAMP.match(folder)
    if not m:
        return f"0000 {folder}", folder
    day, hh, mm, gpu = m.groups()
    return f"{day} {hh or '00'}:{mm or '00'}", gpu


def e2e_records(report: dict, run: Run, source: str) -> list[dict]:
    """One record per (model, format, implementation, batch, metric) of an atom_tools.e2e.vllm report."""
    settings = report.get("settings", {})
    out = []
    for entry in report.get("models", []):
        for impl, result in entry.get("impls", {}).items():
            for batch, row in result.get("batches", {}).items():
                for metric in E2E_METRICS:
                    stats = row.get(metric)
                    if not isinstance(stats, dict) or "median" not in stats:
                        continue
                    out.append({
                        "run": run.name, "time": run.time, "gpu": report.get("gpu", run.gpu), "source": source,
                        "host": "vllm", "host_version": report.get("vllm"), "model": entry["model"],
                        "arch": entry.get("arch"), "layers": entry.get("layers"),
                        "quant": entry.get("format", "bf16"), "impl": impl, "batch": int(batch),
                        "prompt_len": settings.get("prompt_len"), "output_len": settings.get("output_len"),
                        "max_num_batched_tokens": settings.get("max_num_batched_tokens"), "metric": metric,
                        # the engines alive together share the GPU (memory split, concurrent processes)
                        "engines": ",".join(sorted(entry["impls"])),
                        "median": stats["median"], "min": stats.get("min"), "max": stats.get("max"),
                        "samples": stats.get("samples"), "agreement": entry.get("agreement"),
                    })
    return out


def kernel_records(report: dict, run: Run, source: str) -> list[dict]:
    """One record per kernel-suite row with a time; the case is every str/int/bool field but ``impl``."""
    ctx = report.get("context", {})
    out = []
    for suite, rows in report.get("suites", {}).items():
        if not isinstance(rows, list):
            run.skipped.append(f"{source}: suite {suite} holds no rows ({str(rows)[:80]})")
            continue
        for row in rows:
            if not isinstance(row, dict) or not isinstance(row.get("us"), (int, float)):
                continue
            case = {k: v for k, v in row.items() if k not in KERNEL_MEASURES and k not in ("impl", "suite")
                    and isinstance(v, (str, int, bool)) and not isinstance(v, float)}
            out.append({"run": run.name, "time": run.time, "gpu": ctx.get("gpu", run.gpu), "source": source,
                        "suite": row.get("suite", suite), "impl": str(row.get("impl", "?")), "case": case,
                        "us": float(row["us"]), "floor_us": row.get("floor_us"), "samples": row.get("samples_us")})
    return out


def accuracy_records(report: dict, run: Run, source: str) -> list[dict]:
    return [{"run": run.name, "time": run.time, "source": source, **m} for m in report.get("models", [])]


def read_document(data: object, run: Run, source: str, depth: int = 0) -> bool:
    """Add what ``data`` holds to ``run``; False when nothing in it has a known shape."""
    if not isinstance(data, dict):
        return False
    found = False
    if isinstance(data.get("suites"), dict):
        run.kernels += kernel_records(data, run, source)
        found = True
    if isinstance(data.get("models"), list) and "vllm" in data:
        run.e2e += e2e_records(data, run, source)
        found = True
    if isinstance(data.get("accuracy"), dict):
        run.accuracy += accuracy_records(data["accuracy"], run, source)
        found = True
    if depth == 0:
        for value in data.values():
            found |= read_document(value, run, source, depth + 1)
    return found


def load_runs(root: Path = RESULTS) -> list[Run]:
    """Every run folder under ``root``, oldest first, with its records and the files it skipped."""
    runs = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        time, gpu = run_time(folder.name)
        run = Run(folder.name, time, gpu)
        acknowledged = folder / "acknowledged.toml"
        if acknowledged.is_file():
            run.acknowledged = tomllib.loads(acknowledged.read_text()).get("acknowledged", [])
        for path in sorted(folder.rglob("*.json")):
            source = str(path.relative_to(folder))
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError) as err:
                run.skipped.append(f"{source}: not readable JSON ({err})")
                continue
            if not read_document(data, run, source):
                run.skipped.append(f"{source}: unknown layout")
        runs.append(run)
    return sorted(runs, key=lambda r: (r.time, r.name))


def e2e_key(rec: dict) -> tuple:
    """What must match for two end-to-end records to be the same measurement."""
    return tuple(rec[k] for k in ("model", "layers", "quant", "impl", "batch", "prompt_len", "output_len",
                                  "max_num_batched_tokens", "engines", "metric"))


def kernel_key(rec: dict) -> tuple:
    return rec["suite"], rec["impl"], tuple(sorted(rec["case"].items()))


def kernel_label(rec: dict) -> str:
    """A readable case name: op/case/shape first, then sizes."""
    case = rec["case"]
    head = [str(case[k]) for k in ("op", "case", "shape") if k in case]
    rest = [f"{k}={v}" for k, v in case.items() if k not in ("op", "case", "shape")]
    return " ".join([rec["suite"] + ":", *head, *rest])


if __name__ == "__main__":
    for r in load_runs():
        print(f"{r.name}: {len(r.e2e)} e2e, {len(r.kernels)} kernel, {len(r.accuracy)} accuracy records; "
              f"skipped {len(r.skipped)}: {'; '.join(r.skipped)}")
