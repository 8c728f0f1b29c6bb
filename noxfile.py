"""All of ATOM's automation: lint, tests per package, wheel builds, the demo, GPU checks.

Versions come from ci/pins.toml only. Virtualenvs and caches live under a temp dir
(``$ATOM_NOX_ENVDIR``, default ``$TMPDIR/atom-nox``), never in the checkout or in HOME.
``nox -t ci`` is what CI runs (.ci/run); ``nox -s demo`` is the main job.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import nox
import tomllib

ROOT = Path(__file__).parent
PINS = tomllib.loads((ROOT / "ci" / "pins.toml").read_text())
TOOLS, CORE = PINS["tools"], PINS["core"]
SCRATCH = Path(os.environ.get("ATOM_NOX_ENVDIR", Path(tempfile.gettempdir()) / "atom-nox"))
PACKAGES = ["atom-kernels", "atom-core", "atom-vllm", "atom-sglang"]

nox.options.envdir = str(SCRATCH / "envs")
nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = False
nox.options.sessions = ["lint", "tests"]


def scratch_env(name: str) -> dict[str, str]:
    """Caches for one session under the scratch dir, so nothing lands in HOME."""
    base = SCRATCH / "cache" / name
    base.mkdir(parents=True, exist_ok=True)
    return {
        "PIP_CACHE_DIR": str(SCRATCH / "cache" / "pip"),
        "HF_HOME": str(base / "hf"),
        "TRITON_CACHE_DIR": str(base / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(base / "inductor"),
        "XDG_CACHE_HOME": str(base / "xdg"),
        "HATCH_DATA_DIR": str(base / "hatch-data"),
        "HATCH_CACHE_DIR": str(base / "hatch-cache"),
        "HF_HUB_OFFLINE": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }


def pinned(*names: str, table: dict[str, str] = CORE) -> list[str]:
    return [f"{name}=={table[name]}" for name in names]


def install_core_stack(session: nox.Session) -> None:
    """torch first (pip takes the local CPU build), then the rest of what the core is tested with."""
    session.install(*pinned("torch"))
    session.install(*pinned("triton", "transformers", "safetensors", "tokenizers", "pillow"), "tqdm")


@nox.session(tags=["ci"])
def lint(session: nox.Session) -> None:
    session.install(*pinned("ruff", table=TOOLS))
    session.run("ruff", "check", ".")
    session.run("python", "ci/readme_tables.py", "--check")


@nox.session(tags=["ci"])
def tests(session: nox.Session) -> None:
    """atom-kernels and atom-core on the CPU: Triton kernels through TRITON_INTERPRET=1 at small sizes,
    models against transformers on tiny random checkpoints."""
    env = scratch_env("tests") | {"TRITON_INTERPRET": "1"}
    install_core_stack(session)
    session.install(*pinned("pytest", "pytest-xdist", table=TOOLS))
    session.install("--no-deps", "-e", "packages/atom-kernels", "-e", "packages/atom-core")
    args = session.posargs or ["-n", "2", "--durations=15"]
    for package in ("atom-kernels", "atom-core"):
        session.run("pytest", "-q", f"packages/{package}/tests", *args, env=env)


@nox.session(tags=["ci"])
def build(session: nox.Session) -> None:
    """Build all four wheels with hatch, install them from the built files into this fresh venv, import each."""
    env = scratch_env("build")
    dist = SCRATCH / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.install(*pinned("hatch", table=TOOLS))
    for package in PACKAGES:
        with session.chdir(ROOT / "packages" / package):
            session.run("hatch", "build", "-t", "wheel", str(dist), env=env)
    wheels = sorted(str(p) for p in dist.glob("*.whl"))
    if len(wheels) != len(PACKAGES):
        session.error(f"expected {len(PACKAGES)} wheels, got {wheels}")
    session.install(*pinned("torch"))
    session.install(*wheels, f"transformers=={CORE['transformers']}")
    session.run("python", "-c", "import atom_kernels, atom_core, atom_vllm, atom_sglang; print('imports ok')", env=env)
    session.run("python", str(ROOT / "ci" / "check_wheels.py"), *wheels, env=env)
    session.run("atom", "env", env=env)


@nox.session(tags=["ci"])
def demo(session: nox.Session) -> None:
    """The main job: write a tiny random Qwen3 checkpoint, then generate from it with ATOM's native runner."""
    env = scratch_env("demo")
    install_core_stack(session)
    session.install("--no-deps", "-e", "packages/atom-kernels", "-e", "packages/atom-core")
    model = SCRATCH / "demo" / "tiny-qwen3"
    shutil.rmtree(model, ignore_errors=True)
    session.run("atom", "make-tiny", "Qwen3ForCausalLM", str(model), env=env)
    session.run(
        "atom", "generate", "--model", str(model), "--prompt", "Hello, ATOM!", "--prompt", "The quick brown fox",
        "--max-new-tokens", "16", "--dtype", "float32", env=env,
    )
    session.run("atom", "generate", "--model", str(model), "--prompt-token-ids", "1,2,3,4", "--max-new-tokens", "4",
                "--dtype", "float32", "--json", env=env)
    session.run("atom", "env", env=env)


@nox.session
def readme(session: nox.Session) -> None:
    """Regenerate the README's tables from the catalog and ci/pins.toml."""
    session.run("python", "ci/readme_tables.py", external=True)


@nox.session
def gpu(session: nox.Session) -> None:
    """On a CUDA machine: kernel and model tests on the GPU, then the kernel benchmarks (JSON under bench/results)."""
    session.run("bash", str(ROOT / "ci" / "gpu_check.sh"), *session.posargs, external=True)


# ---- atom-vllm: one session per tested vLLM release ([[vllm]] in ci/pins.toml) -------------------------
VLLM_RELEASES = PINS.get("vllm", [])
VLLM_CHECKS = ("plugin", "construct", "generate")


def _vllm_release_id(release: dict) -> str:
    return f"{release['distribution']}-{release['version']}"


@nox.session(tags=["ci", "vllm"])
@nox.parametrize("release", [nox.param(r, id=_vllm_release_id(r)) for r in VLLM_RELEASES])
def vllm(session: nox.Session, release: dict) -> None:
    """atom-vllm against one pinned vLLM release, in a fresh venv (deleted afterwards, with its caches):
    torch from the pins, the vLLM wheel without the deps listed in `skip_deps`, the rest of its
    requirements through uv (constrained by the pins), then atom-vllm's tests for the checks the entry
    lists. Prints the wall time of each phase and the venv's size."""
    import time

    rid = _vllm_release_id(release)
    scratch = SCRATCH / "vllm" / rid
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    venv = Path(session.virtualenv.location)
    python = str(venv / "bin" / "python")
    env = scratch_env(f"vllm-{rid}") | {
        "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"),
        "UV_CACHE_DIR": str(SCRATCH / "cache" / "uv"),
        "HOME": str(scratch / "home"),
        "TMPDIR": str(scratch / "tmp"),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_TARGET_DEVICE": "cpu",  # official wheels (0.28+) then build models on the CPU platform
        "PYTHONUNBUFFERED": "1",
    }
    (scratch / "tmp").mkdir()
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        timings[name] = round(time.perf_counter() - clock, 1)
        clock = time.perf_counter()

    def uv_install(*args: str) -> None:
        session.run("uv", "pip", "install", "-q", "--python", python, *args, env=env)

    try:
        session.install(*pinned("uv", table=TOOLS))
        session.install(f"torch=={release['torch']}")  # pip: the local CPU build of the pinned torch
        torch_version = session.run("python", "-c", "from importlib.metadata import version; print(version('torch'))",
                                    silent=True, env=env).strip().splitlines()[-1]
        constraints = scratch / "constraints.txt"
        constraints.write_text(f"torch=={torch_version}\ntransformers=={release['transformers']}\n")
        lap("torch")
        uv_install("--no-deps", f"{release['distribution']}=={release['version']}")
        uv_install("packaging")
        requirements = scratch / "requirements.txt"
        session.run("python", str(ROOT / "ci" / "vllm_requirements.py"), release["distribution"],
                    "--skip", ",".join(release.get("skip_deps", [])), "--out", str(requirements), env=env)
        uv_install("-c", str(constraints), "-r", str(requirements), *pinned("pytest", table=TOOLS))
        lap("vllm")
        uv_install("--no-deps", *(str(ROOT / "packages" / p) for p in ("atom-kernels", "atom-core", "atom-vllm")))
        session.run("python", "-c", "import vllm, torch, transformers; "
                    "print('vllm', vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)",
                    env=env)
        lap("atom")
        skipped = [c for c in VLLM_CHECKS if c not in release["checks"]]
        marks = " and ".join(f"not {c}" for c in skipped) or "all"
        args = session.posargs or ["--durations=10"]
        session.run("pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "packages" / "atom-vllm" / "tests"),
                    *(["-m", marks] if skipped else []), *args, env=env)
        lap("tests")
        size = session.run("du", "-sh", str(venv), silent=True, external=True).split()[0]
        session.log(f"{rid}: wall time per phase (s) {timings}; venv {size}")
    finally:
        shutil.rmtree(venv, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
