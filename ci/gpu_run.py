"""One benchmark run on a GPU machine: kernel suites, end-to-end host comparisons, accuracy gate, one file.

    python3 ci/gpu_run.py                       everything, into bench/results/<UTC stamp>-<gpu>/run.json
    python3 ci/gpu_run.py --dry-run             print the steps' commands only
    python3 ci/gpu_run.py --cpu --out-dir DIR   CPU: tiny accuracy gate only (kernels and vLLM need a GPU)

Steps, each a subprocess whose JSON lands in the run file even when another step fails:
1. ``python -m atom_tools.kernels`` (every suite, or ``--suites``);
2. ``ci/gpu_e2e.sh`` = ``python -m atom_tools.e2e.vllm`` inside vLLM from the offline bundle: ATOM's model classes
   against vLLM's own on random real-shape checkpoints and the demo's real SmolLM2, ``--repeats`` runs each;
3. ``python -m atom_tools.accuracy``: ATOM's log-probabilities against transformers' on the demo model and on
   random real-shape checkpoints, perplexity difference bounded.
Then ``run.json`` (``{"context", "kernels", "e2e", "accuracy"}``; ci/results.py reads it), a README.md beside
it, and ``ci/regression.py`` against the previous run on the same GPU, whose exit code this one returns (or 1
when a step failed, or the accuracy gate did).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ACCURACY_ARCHS = "Qwen3ForCausalLM,LlamaForCausalLM,Qwen3MoeForCausalLM"
TINY_ARCHS = "LlamaForCausalLM,Qwen3ForCausalLM"


def gpu_tag(py: str) -> str:
    """Short name of the GPU for the folder name (``NVIDIA H200`` -> ``h200``); ``cpu`` without one."""
    code = "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
    name = subprocess.run([py, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    return name.split()[-1].lower()


def commit() -> str | None:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or None


def steps(args: argparse.Namespace, work: Path) -> list[tuple[str, list[str], Path]]:
    """(name, command, JSON it writes) of each step of this run."""
    py = args.python
    demo = args.demo_dir or str(work / "smollm2")
    out = []
    if not args.cpu:
        suites = [*filter(None, args.suites.split(",")), *(["--quick"] if args.quick else [])]
        out.append(("kernels", [py, "-m", "atom_tools.kernels", "--peers", "atom_tools.kernel_peers_vllm", *suites,
                                "--out", str(work / "kernels.json")],
                    work / "kernels.json"))
        if not args.demo_dir:
            out.append(("demo", [py, "-m", "atom_core.cli", "fetch-demo", demo], work / "none"))
        out.append(("e2e", ["bash", str(ROOT / "ci" / "gpu_e2e.sh"), "--models", args.models, "--batches", args.batches,
                            "--repeats", str(args.repeats), "--checkpoint", f"smollm2={demo}", "--workdir", str(work),
                            "--out", str(work / "e2e.json")], work / "e2e.json"))
        accuracy = ["--demo", demo, "--random", ACCURACY_ARCHS, "--layers", "2", "--prompts", "8", "--prompt-len", "256"]
    else:
        accuracy = (["--demo", args.demo_dir] if args.demo_dir else []) + ["--random", TINY_ARCHS, "--tiny",
                                                                           "--prompts", "2", "--prompt-len", "16"]
    out.append(("accuracy", [py, "-m", "atom_tools.accuracy", *accuracy, "--out", str(work / "accuracy.json")],
                work / "accuracy.json"))
    return out


def drop_option(cmd: list[str], option: str) -> list[str]:
    """``cmd`` without ``option`` and its value."""
    if option not in cmd:
        return cmd
    i = cmd.index(option)
    return cmd[:i] + cmd[i + 2:]


def readme(run: dict, name: str) -> str:
    lines = [f"# {name}", "", f"`{run['context']['command']}` at commit {run['context']['commit']} on "
             f"{run['context']['gpu']}, {run['context']['date']}.", "",
             "`run.json` holds the kernel suites (`kernels`), the end-to-end comparison with vLLM's own classes (`e2e`) "
             "and the accuracy gate (`accuracy`); `python ci/dashboard.py` draws it, `python ci/regression.py` checks it.",
             "", "| step | result |", "|---|---|"]
    for step, status in run["context"]["steps"].items():
        lines.append(f"| {step} | {status} |")
    lines += ["", *[f"- {'PASS' if m['passed'] else 'FAIL'} {m['summary']}" for m in run["accuracy"].get("models", [])]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 ci/gpu_run.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="no GPU: only the accuracy gate, at tiny size")
    parser.add_argument("--dry-run", action="store_true", help="print the steps' commands and exit")
    parser.add_argument("--results", type=Path, default=ROOT / "bench" / "results", help="folder of run folders")
    parser.add_argument("--out-dir", type=Path, help="this run's folder (default: RESULTS/<UTC stamp>-<gpu>)")
    parser.add_argument("--suites", default="", help="kernel suites, comma-separated (default: all)")
    parser.add_argument("--quick", action="store_true", help="kernel suites: fewer repetitions and sizes")
    parser.add_argument("--models", default="qwen3-8b,qwen3-30b-a3b", help="atom_tools.e2e.vllm's random real-shape models")
    parser.add_argument("--batches", default="1,64,256")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per batch (the regression check's samples)")
    parser.add_argument("--demo-dir", help="the demo checkpoint (default: written with `atom fetch-demo`)")
    parser.add_argument("--python", default=os.environ.get("PYTHON", sys.executable))
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="atom-run-") as tmp:
        work = Path(tmp)
        plan = steps(args, work)
        if args.dry_run:
            for name, cmd, _ in plan:
                print(f"{name}: {shlex.join(cmd)}")
            return 0
        out_dir = args.out_dir or args.results / (datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H%M")
                                                  + f"-{gpu_tag(args.python)}")
        env = os.environ | {"PYTHONPATH": os.pathsep.join(
            [str(ROOT / "packages" / p / "src") for p in ("atom-kernels", "atom-core", "atom-vllm")] + [str(ROOT / "tools")]
            + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])),
            "ATOM_COMMIT": commit() or "", "PYTHONUNBUFFERED": "1"}
        status, parts = {}, {}
        for name, cmd, result in plan:
            if status.get("demo", "ok") != "ok":  # no demo checkpoint: the other steps go on without it
                cmd = drop_option(drop_option(cmd, "--checkpoint"), "--demo")
            print(f"gpu_run: {name}: {shlex.join(cmd)}", flush=True)
            rc = subprocess.run(cmd, env=env, cwd=ROOT).returncode
            status[name] = "ok" if rc == 0 else f"exit code {rc}"
            if result.is_file():
                parts[name] = json.loads(result.read_text())
        context = {"gpu": gpu_tag(args.python), "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="minutes"),
                   "commit": commit(), "command": shlex.join(["python3", "ci/gpu_run.py", *(argv or sys.argv[1:])]),
                   "steps": status}
        run = {"format": "atom-run/1", "context": context,
               "kernels": parts.get("kernels", {"skipped": status.get("kernels", "no GPU")}),
               "e2e": parts.get("e2e", {"skipped": status.get("e2e", "no GPU")}),
               "accuracy": parts.get("accuracy", {}).get("accuracy", {"skipped": status["accuracy"]})}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "run.json").write_text(json.dumps(run, indent=1))
    (out_dir / "README.md").write_text(readme(run, out_dir.name))
    print(f"gpu_run: wrote {out_dir / 'run.json'}; steps {status}")
    check = subprocess.run([sys.executable, str(ROOT / "ci" / "regression.py"), "--results", str(out_dir.parent),
                            "--new", out_dir.name]).returncode
    failed = [name for name, s in status.items() if s != "ok"]
    if failed:
        print(f"gpu_run: failed steps: {', '.join(failed)}", file=sys.stderr)
    return check or (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
