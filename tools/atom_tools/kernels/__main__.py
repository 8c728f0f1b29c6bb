"""``python -m atom_tools.kernels SUITE ... --out FILE``: run benchmark suites, write one JSON file."""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import pkgutil
import sys

import torch

import atom_tools.kernels as bench_pkg
from atom_tools.kernels import timing


def available_suites() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(bench_pkg.__path__)
                  if m.name not in {"timing", "peers", "__main__", "report"})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atom_tools.kernels")
    parser.add_argument("suites", nargs="*", help=f"suites to run (default: all of {available_suites()})")
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and sizes")
    parser.add_argument("--peers", action="append", default=[], metavar="MODULE",
                        help="a module whose PEERS adds other projects' kernels to the suites (e.g. "
                             "atom_tools.kernel_peers_vllm); repeatable")
    args = parser.parse_args(argv)
    suites = args.suites or available_suites()
    unknown = [s for s in suites if s not in available_suites()]
    if unknown:
        parser.error(f"unknown suite(s): {', '.join(unknown)} (suites: {', '.join(available_suites())})")
    for module_name in args.peers:
        importlib.import_module(module_name)  # a typo fails here, before minutes of GPU time
    if not torch.cuda.is_available():
        print("benchmarks need a CUDA/ROCm GPU", file=sys.stderr)
        return 2
    ctx = {
        "gpu": timing.gpu_name(),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "copy_bytes_per_s": timing.copy_bandwidth_bytes_per_s(),
        "bf16_flops_per_s": timing.bf16_matmul_flops_per_s(),
        "quick": args.quick,
        "peers": args.peers,
    }
    try:
        import triton

        ctx["triton"] = triton.__version__
    except ImportError:
        ctx["triton"] = None
    results = {"context": ctx, "suites": {}}
    for name in suites:
        module = importlib.import_module(f"atom_tools.kernels.{name}")
        try:
            results["suites"][name] = module.run(ctx)
        except Exception as err:  # one broken suite must not lose the others' numbers
            results["suites"][name] = {"error": f"{type(err).__name__}: {err}"}
            print(f"suite {name} failed: {err!r}", file=sys.stderr)
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
    for name, rows in results["suites"].items():
        print(f"== {name}")
        if isinstance(rows, dict):
            print("  ", rows)
            continue
        for row in rows:
            print("  ", {k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
