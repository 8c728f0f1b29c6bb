"""ci/gpu_run.py, the one benchmark command: its GPU plan, and a CPU run (tiny accuracy gate) that writes a run
folder the dashboard's reader understands and the regression check passes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

CI = Path(__file__).resolve().parents[1]


def test_dry_run_lists_every_step():
    out = subprocess.run([sys.executable, str(CI / "gpu_run.py"), "--dry-run", "--demo-dir", "/ckpt/smollm2"],
                         capture_output=True, text=True, check=True).stdout
    steps = dict(line.split(": ", 1) for line in out.splitlines())
    assert list(steps) == ["kernels", "e2e", "accuracy"]
    assert "-m atom_tools.kernels" in steps["kernels"]
    assert "gpu_e2e.sh" in steps["e2e"] and "--repeats 5" in steps["e2e"] and "smollm2=/ckpt/smollm2" in steps["e2e"]
    assert "--demo /ckpt/smollm2" in steps["accuracy"] and "Qwen3MoeForCausalLM" in steps["accuracy"]


def test_cpu_run_writes_one_results_file(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("atom_core")
    run = tmp_path / "2026-12-04T0100-cpu"
    done = subprocess.run([sys.executable, str(CI / "gpu_run.py"), "--cpu", "--out-dir", str(run)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    data = json.loads((run / "run.json").read_text())
    assert data["context"]["steps"] == {"accuracy": "ok"} and data["kernels"] == {"skipped": "no GPU"}
    assert [m["passed"] for m in data["accuracy"]["models"]] == [True, True]
    assert "regression check of 2026-12-04T0100-cpu" in done.stdout and (run / "README.md").is_file()
    sys.path.insert(0, str(CI))
    from results import load_runs

    (loaded,) = load_runs(tmp_path)
    assert len(loaded.accuracy) == 2 and not loaded.skipped
