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
