"""Release one ATOM distribution, or rehearse releasing all four (what CI runs).

    python ci/release.py release PACKAGE {major,minor,patch,X.Y.Z} [--dry-run] [--index-url URL | --pypi]
    python ci/release.py rehearse

Run them through nox, which installs the pinned tools (hatch, twine, pypiserver, uv; ci/pins.toml [tools]):
``nox -s release -- atom-vllm minor --pypi`` and ``nox -s release-check``.

A release bumps ``__version__`` (the version's one source; hatch reads it), moves the CHANGELOG's
"## Unreleased" section under "## VERSION (DATE)", builds the wheel and sdist with hatch, checks them
(``twine check --strict``, ci/check_wheels.py: entry points and ranges, the wheel imports in a fresh venv),
commits them with docs/releasing.md's regenerated table, tags ``PACKAGE-vVERSION`` and uploads. ``--dry-run``
does all of it in a scratch clone of HEAD and uploads to a local index (pypiserver, started here unless
``--index-url`` names one); a real release uploads to PyPI only with ``--pypi`` (twine reads TWINE_USERNAME /
TWINE_PASSWORD or ~/.pypirc). docs/releasing.md says more.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
PINS = tomllib.loads((ROOT / "ci" / "pins.toml").read_text())
PACKAGES = ("atom-kernels", "atom-core", "atom-vllm", "atom-sglang")  # bottom first: each needs the ones before it
PARTS = ("major", "minor", "patch")
SCRATCH = Path(os.environ.get("ATOM_NOX_ENVDIR", Path(tempfile.gettempdir()) / "atom-nox")) / "release"
UNRELEASED = "## Unreleased"
RELEASES_DOC = "docs/releasing.md"


class ReleaseError(Exception):
    """Bad input or a failed step: one line naming the cause."""


STARTED = time.monotonic()


def run(*cmd: str | Path, cwd: Path | None = None, check: bool = True, quiet: bool = False,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    print(f"+ [{time.monotonic() - STARTED:5.1f} s]", " ".join(map(str, cmd)), flush=True)
    result = subprocess.run([str(c) for c in cmd], cwd=cwd, text=True, env=env,
                            stdout=subprocess.PIPE if quiet else None, stderr=subprocess.STDOUT if quiet else None)
    if check and result.returncode != 0:
        raise ReleaseError(f"`{' '.join(map(str, cmd[:3]))} ...` exited {result.returncode}"
                           + (f": {result.stdout.strip()[-2000:]}" if quiet else ""))
    return result


def module(package: str) -> str:
    return package.replace("-", "_")


def version_file(repo: Path, package: str) -> Path:
    pyproject = tomllib.loads((repo / "packages" / package / "pyproject.toml").read_text())
    return repo / "packages" / package / pyproject["tool"]["hatch"]["version"]["path"]


def current_version(repo: Path, package: str) -> Version:
    match = re.search(r'^__version__ = "([^"]+)"$', version_file(repo, package).read_text(), re.M)
    if not match:
        raise ReleaseError(f"{version_file(repo, package)} has no `__version__ = \"...\"` line")
    return Version(match.group(1))


def tags(repo: Path, package: str) -> list[Version]:
    out = run("git", "tag", "--list", f"{package}-v*", cwd=repo, quiet=True).stdout.split()
    versions = []
    for tag in out:
        with contextlib.suppress(InvalidVersion):
            versions.append(Version(tag.removeprefix(f"{package}-v")))
    return sorted(versions)


def next_version(current: Version, part: str, released: list[Version]) -> Version:
    """``part`` is major/minor/patch, or an explicit version above ``current`` (or equal to it while it was
    never released: a package's first release)."""
    major, minor, patch = (list(current.release) + [0, 0])[:3]
    if part == "major":
        return Version(f"{major + 1}.0.0")
    if part == "minor":
        return Version(f"{major}.{minor + 1}.0")
    if part == "patch":
        return Version(f"{major}.{minor}.{patch + 1}")
    try:
        wanted = Version(part)
    except InvalidVersion:
        raise ReleaseError(f"version part must be one of {', '.join(PARTS)} or a version, got {part!r}") from None
    if wanted < current or (wanted == current and current in released):
        raise ReleaseError(f"{wanted} is not above the current version {current}")
    return wanted


def move_unreleased(text: str, version: Version, date: str, allow_empty: bool = False) -> str:
    """The CHANGELOG with its Unreleased entries under ``## VERSION (DATE)`` and an empty Unreleased above
    (an empty Unreleased section is an error, except in a rehearsal)."""
    lines = text.splitlines()
    try:
        start = lines.index(UNRELEASED)
    except ValueError:
        raise ReleaseError(f"CHANGELOG.md has no `{UNRELEASED}` heading") from None
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    body = lines[start + 1:end]
    if not any(line.strip() for line in body):
        if not allow_empty:
            raise ReleaseError("CHANGELOG.md's Unreleased section is empty: nothing to release")
        body = ["- No changes (release rehearsal)."]
    while body and not body[0].strip():
        body.pop(0)
    out = lines[:start] + [UNRELEASED, "", f"## {version} ({date})", *body] + lines[end:]
    return "\n".join(out) + "\n"


# ---- the local index ------------------------------------------------------------------------------------
@contextlib.contextmanager
def local_index(directory: Path) -> Iterator[str]:
    """pypiserver on a free localhost port serving (and accepting unauthenticated uploads into) ``directory``;
    projects it does not hold redirect to PyPI. Yields the simple-index URL."""
    directory.mkdir(parents=True, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(directory.parent / "pypiserver.log", "w")  # noqa: SIM115  (closed below)
    server = subprocess.Popen([str(Path(sys.executable).parent / "pypi-server"), "run", "-i", "127.0.0.1", "-p", str(port),
                               "-a", ".", "-P", ".", str(directory)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/simple/"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(url, timeout=2).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise ReleaseError(f"pypiserver did not start on port {port}: see {log.name}") from None
                time.sleep(0.2)
        print(f"local index {url} serving {directory}", flush=True)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)
        log.close()


def upload(files: list[Path], index_url: str | None) -> None:
    """twine: to the local index (no credentials), or to PyPI when ``index_url`` is None."""
    target = ["--repository-url", index_url.removesuffix("simple/"), "-u", "atom", "-p", "local"] if index_url else []
    run(sys.executable, "-m", "twine", "upload", "--non-interactive", "--disable-progress-bar", *target, *files)


# ---- fresh venvs ----------------------------------------------------------------------------------------
def fresh_venv(path: Path) -> Path:
    """A new venv with only the pinned torch in it; returns its python. uv installs torch from a local wheel file
    when pip is pointed at one (PIP_FIND_LINKS: a CPU build on disk; a file gives the resolver no choice), pip
    otherwise (it honours its own configuration); uv never resolves torch itself."""
    version = PINS["core"]["torch"]
    shutil.rmtree(path, ignore_errors=True)
    run(sys.executable, "-m", "uv", "venv", "-q", "--python", sys.executable, path)
    python = path / "bin" / "python"
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    links = os.environ.get("PIP_FIND_LINKS", "").split()
    if not links:  # pip's configuration files
        config = run(sys.executable, "-m", "pip", "config", "list", quiet=True, check=False).stdout
        links = [w.strip("'\"") for line in config.splitlines() if ".find-links=" in line for w in line.split("=", 1)[1].split()]
    found = [w for folder in links for w in sorted(Path(folder).glob(f"torch-{version}+*-{tag}-*.whl"))]
    if found:
        uv_install(python, str(found[0]))
    else:
        run(sys.executable, "-m", "pip", "--python", python, "install", "-q", f"torch=={version}")
    return python


def uv_install(python: Path, *args: str, index_url: str | None = None, check: bool = True,
               quiet: bool = False) -> subprocess.CompletedProcess:
    """uv into ``python``'s venv; ATOM's distributions from ``index_url`` only when given (uv takes each project
    from the first index that has it), everything else from PyPI; transformers held at the pin."""
    constraints = SCRATCH / "constraints.txt"
    constraints.parent.mkdir(parents=True, exist_ok=True)
    constraints.write_text(f"transformers=={PINS['core']['transformers']}\n")
    index = ["--index", index_url] if index_url else []
    return run(sys.executable, "-m", "uv", "pip", "install", "-q", "--python", python, "-c", constraints, *index, *args,
               check=check, quiet=quiet)


IMPORT_CHECK = """
import importlib, importlib.metadata as md, sys
for dist, want in (a.split("=") for a in sys.argv[1:]):
    mod = importlib.import_module(dist.replace("-", "_"))
    assert mod.__version__ == md.version(dist), (dist, mod.__version__, md.version(dist))
    assert not want or want == mod.__version__, (dist, want, mod.__version__)
    print(dist, mod.__version__, "imports from", mod.__file__)
groups = {"atom-vllm": "vllm.general_plugins", "atom-sglang": "sglang.srt.plugins", "atom-core": "console_scripts"}
for dist, group in groups.items():
    if any(a.startswith(dist + "=") for a in sys.argv[1:]):
        eps = [ep for ep in md.entry_points(group=group) if ep.dist.name == dist]
        assert len(eps) == 1 and eps[0].load(), (dist, group, eps)
if any(a.startswith("atom-core=") for a in sys.argv[1:]):
    from atom_core.cli import main
    main(["env"])  # every installed distribution's version
"""


def import_check(python: Path, **dists: str) -> None:
    """Each distribution imports at the given version (its ``__version__`` as its metadata's) and its entry
    point loads; with atom-core, ``atom env`` follows."""
    run(python, "-c", IMPORT_CHECK, *(f"{d}={v}" for d, v in dists.items()))


# ---- one release ----------------------------------------------------------------------------------------
def check_arguments(package: str, part: str, *, dry_run: bool, index_url: str | None, pypi: bool) -> None:
    if package not in PACKAGES:
        raise ReleaseError(f"unknown package {package!r}: one of {', '.join(PACKAGES)}")
    if part not in PARTS:
        try:
            Version(part)
        except InvalidVersion:
            raise ReleaseError(f"version part must be one of {', '.join(PARTS)} or a version, got {part!r}") from None
    if dry_run and pypi:
        raise ReleaseError("--dry-run never publishes to PyPI: drop --pypi")
    if pypi and index_url:
        raise ReleaseError("--pypi and --index-url name two places to publish: pick one")
    if not dry_run and not (pypi or index_url):
        raise ReleaseError("a real release publishes: pass --pypi (or --index-url URL), or --dry-run to rehearse")


def release(package: str, part: str, *, dry_run: bool, index_url: str | None, pypi: bool, work: Path,
            rehearsal: bool = False) -> Version:
    check_arguments(package, part, dry_run=dry_run, index_url=index_url, pypi=pypi)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if dry_run:
        repo = work / "repo"
        run("git", "clone", "-q", ROOT, repo)
        run("git", "-C", repo, "config", "user.email", "release@atom.invalid")
        run("git", "-C", repo, "config", "user.name", "ATOM release dry run")
    else:
        repo = ROOT
        dirty = run("git", "status", "--porcelain", "--", f"packages/{package}", cwd=repo, quiet=True).stdout.strip()
        if dirty:
            raise ReleaseError(f"packages/{package} has uncommitted changes: commit them first ({dirty.splitlines()[0]})")
    current = current_version(repo, package)
    new = next_version(current, part, tags(repo, package))
    tag = f"{package}-v{new}"
    if new in tags(repo, package):
        raise ReleaseError(f"tag {tag} exists already")
    changelog, init = repo / "packages" / package / "CHANGELOG.md", version_file(repo, package)
    table = repo / RELEASES_DOC  # its generated table shows each package's version
    originals = {path: path.read_text() for path in (changelog, init, table)}
    date = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    print(f"{package}: {current} -> {new} ({'dry run in ' + str(repo) if dry_run else 'release'})", flush=True)
    try:
        changelog.write_text(move_unreleased(originals[changelog], new, date, allow_empty=rehearsal))
        if new != current:
            run("hatch", "version", str(new), cwd=init.parents[2])
        run(sys.executable, repo / "ci" / "readme_tables.py", cwd=repo)
        files = build_and_check(repo, package, new, work, index_url if dry_run else None, fresh_import=not rehearsal)
        run("git", "commit", "-q", "-m", f"{package} {new}", "--", *originals, cwd=repo)
        run("git", "tag", "-a", tag, "-m", f"{package} {new}", cwd=repo)
    except BaseException:
        if not dry_run:
            for path, text in originals.items():
                path.write_text(text)
        raise
    upload(files, None if pypi else index_url)
    print(f"{package} {new}: tagged {tag}" + ("" if dry_run else "; push it: git push && git push origin " + tag))
    return new


def build_and_check(repo: Path, package: str, version: Version, work: Path, index_url: str | None,
                    fresh_import: bool) -> list[Path]:
    """hatch's wheel and sdist, checked; ``fresh_import``: the wheel also imports in a fresh venv (a rehearsal
    imports all four together instead)."""
    dist = work / "dist"
    run("hatch", "build", "-t", "wheel", "-t", "sdist", dist, cwd=repo / "packages" / package)
    wheel, sdist = dist / f"{module(package)}-{version}-py3-none-any.whl", dist / f"{module(package)}-{version}.tar.gz"
    if sorted(dist.iterdir()) != sorted([wheel, sdist]):
        raise ReleaseError(f"hatch built {sorted(p.name for p in dist.iterdir())}, expected {wheel.name} and {sdist.name}")
    run(sys.executable, "-m", "twine", "check", "--strict", wheel, sdist)
    run(sys.executable, ROOT / "ci" / "check_wheels.py", "--some", wheel)
    if not fresh_import:
        return [wheel, sdist]
    python = fresh_venv(work / "venv")
    # the packages below come from the index this release goes to (PyPI for a real one)
    uv_install(python, str(wheel), index_url=index_url)
    import_check(python, **{package: str(version)})
    shutil.rmtree(work / "venv")
    return [wheel, sdist]


# ---- the rehearsal CI runs --------------------------------------------------------------------------------
def wheel_metadata(dist: Path) -> str:
    (wheel,) = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()


def range_of(metadata: str, dependency: str) -> str:
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.name == dependency and req.marker is None:
                return str(req.specifier)
    raise ReleaseError(f"no Requires-Dist on {dependency}")


# The adapters' checks that need no vLLM or SGLang: versions, ranges, extras, registry plan (the host sessions run
# the rest against their upstreams). atom-sglang's test_generated_files_match_pins checks the source tree, not the
# installed package.
PLUGIN_CHECKS = {"atom-vllm": ["atom-vllm/tests/test_versions.py"], "atom-sglang": ["atom-sglang/tests/test_unit.py"]}
ADAPTERS = tuple(PLUGIN_CHECKS)


def plugin_checks(python: Path, adapters: tuple[str, ...] | list[str] = ADAPTERS) -> None:
    tests = [ROOT / "packages" / path for adapter in adapters for path in PLUGIN_CHECKS[adapter]]
    run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests, "-m", "not sglang", "-k", "not generated_files",
        env=os.environ | {"PYTHONDONTWRITEBYTECODE": "1"})


def rehearse(work: Path) -> None:
    shutil.rmtree(work, ignore_errors=True)
    started = time.monotonic()
    with local_index(work / "index") as url:
        released = {p: release(p, "patch", dry_run=True, index_url=url, pypi=False, work=work / p, rehearsal=True)
                    for p in PACKAGES}
        python = fresh_venv(work / "venv")
        uv_install(python, "atom-vllm", "atom-sglang", f"pytest=={PINS['tools']['pytest']}", index_url=url)
        import_check(python, **{p: str(v) for p, v in released.items()})
        run(sys.executable, ROOT / "ci" / "check_wheels.py", *sorted(work.glob("atom-*/dist/*.whl")))
        plugin_checks(python)
        oldest: dict[Version, list[str]] = {}  # atom-core's oldest release in a range -> the adapters of that range
        for adapter in ADAPTERS:
            spec = Requirement(f"atom-core{range_of(wheel_metadata(work / adapter / 'dist'), 'atom-core')}").specifier
            admitted = sorted(v for v in [*tags(ROOT, "atom-core"), released["atom-core"]] if v in spec)
            print(f"{adapter}: the oldest atom-core in {spec} is {admitted[0]}"
                  + (" (the one just released)" if admitted[0] == released["atom-core"] else f" (tag atom-core-v{admitted[0]})"))
            if admitted[0] != released["atom-core"]:
                oldest.setdefault(admitted[0], []).append(adapter)
        for version, adapters in sorted(oldest.items()):
            build_tag("atom-core", version, work / f"atom-core-{version}", url)
            if others := [a for a in ADAPTERS if a not in adapters]:
                run(sys.executable, "-m", "uv", "pip", "uninstall", "-q", "--python", python, *others)
            uv_install(python, f"atom-core=={version}", index_url=url)
            import_check(python, **{"atom-core": str(version)}, **{a: str(released[a]) for a in adapters})
            plugin_checks(python, adapters)
            uv_install(python, f"atom-core=={released['atom-core']}", *ADAPTERS, index_url=url)
        major_bump_is_refused(python, released, url, work)
    print(f"release rehearsal passed in {time.monotonic() - started:.0f} s: {', '.join(f'{p} {v}' for p, v in released.items())}")


def build_tag(package: str, version: Version, work: Path, index_url: str) -> None:
    """Build ``package`` as tagged at ``version`` and upload it to the local index."""
    repo = work / "repo"
    shutil.rmtree(work, ignore_errors=True)
    run("git", "clone", "-q", "--branch", f"{package}-v{version}", ROOT, repo)
    run("hatch", "build", "-t", "wheel", work / "dist", cwd=repo / "packages" / package)
    upload(sorted((work / "dist").iterdir()), index_url)


def major_bump_is_refused(python: Path, released: dict[str, Version], url: str, work: Path) -> None:
    """atom-core's next major, released in a scratch clone: the resolver refuses it beside the adapters, and a
    forced install (--no-deps) makes each adapter's plugin fail, both naming the two versions."""
    major = release("atom-core", "major", dry_run=True, index_url=url, pypi=False, work=work / "atom-core-major",
                    rehearsal=True)
    refused = uv_install(python, f"atom-core=={major}", "atom-vllm", "atom-sglang", index_url=url, check=False, quiet=True)
    spec = range_of(wheel_metadata(work / "atom-vllm" / "dist"), "atom-core")
    out = refused.stdout
    named = str(major) in out and "atom-vllm" in out and any(bound in out for bound in spec.split(","))
    if refused.returncode == 0 or not named:
        raise ReleaseError(f"installing atom-core {major} beside the adapters was not refused naming both versions:"
                           f" {refused.stdout.strip()}")
    print(f"install refused as it should be:\n{refused.stdout.strip()}")
    uv_install(python, "--no-deps", f"atom-core=={major}", index_url=url)
    for adapter in ADAPTERS:
        failed = run(python, "-c", f"from {module(adapter)}.plugin import register; register()", check=False, quiet=True)
        line = f"{adapter} {released[adapter]} requires atom-core"
        if failed.returncode == 0 or line not in failed.stdout or f"but atom-core {major} is installed" not in failed.stdout:
            raise ReleaseError(f"{adapter}'s plugin did not refuse atom-core {major}: {failed.stdout.strip()[-1000:]}")
        print(f"{adapter} plugin refused: {failed.stdout.strip().splitlines()[-1]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("release", help="release one package")
    one.add_argument("package", help=", ".join(PACKAGES))
    one.add_argument("part", help="major, minor, patch or an explicit version")
    one.add_argument("--dry-run", action="store_true", help="in a scratch clone of HEAD, to a local index")
    one.add_argument("--index-url", help="upload to this index (a dry run starts a local pypiserver when omitted)")
    one.add_argument("--pypi", action="store_true", help="upload to PyPI (a real release; twine's credentials)")
    sub.add_parser("rehearse", help="dry-run every package to one local index and install the adapters from it")
    args = parser.parse_args(argv)
    try:
        if args.command == "rehearse":
            rehearse(SCRATCH / "rehearsal")
            return 0
        check_arguments(args.package, args.part, dry_run=args.dry_run, index_url=args.index_url, pypi=args.pypi)
        if args.dry_run and not args.index_url:
            work = SCRATCH / args.package
            shutil.rmtree(work.with_name(f"{args.package}-index"), ignore_errors=True)
            with local_index(work.with_name(f"{args.package}-index")) as url:
                seed_index(args.package, url, work.with_name(f"{args.package}-seed"))
                release(args.package, args.part, dry_run=True, index_url=url, pypi=False, work=work)
        else:
            release(args.package, args.part, dry_run=args.dry_run, index_url=args.index_url, pypi=args.pypi,
                    work=SCRATCH / args.package)
    except ReleaseError as error:
        print(f"release: {error}", file=sys.stderr)
        return 1
    return 0


def seed_index(package: str, url: str, work: Path) -> None:
    """A lone dry run's index gets the packages below ``package`` as this tree has them, as if released."""
    shutil.rmtree(work, ignore_errors=True)
    for below in PACKAGES[:PACKAGES.index(package)]:
        if below in ("atom-vllm", "atom-sglang"):
            continue
        run("hatch", "build", "-t", "wheel", work, cwd=ROOT / "packages" / below)
    if work.exists():
        upload(sorted(work.iterdir()), url)


if __name__ == "__main__":
    sys.exit(main())
