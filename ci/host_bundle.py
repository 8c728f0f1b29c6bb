#!/usr/bin/env python3
"""A host (vLLM or SGLang) for an air-gapped GPU machine: build a bundle of parts here, install the parts there.

``build --host H`` downloads the host's wheel and the small wheels its start-up imports (pinned in the
``ci/pins.toml`` table named in ``HOSTS``), leaves out the wheel members that machine does not need (``HOSTS``:
each pattern with its reason; an optional group only with ``--without GROUP``), and writes the unpacked site
tree as xz-compressed tar groups packed into parts of at most ``--part-size`` bytes, plus ``manifest.json``.
Each part is a concatenation of whole ``.tar.xz`` streams (``tar -xJif PART`` reads it too).

``install`` checks each part that has arrived against the manifest's sha256, unpacks it under
``TARGET/site`` (parts already unpacked are skipped) and names the parts still missing. Stdlib only.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import itertools
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tomllib

PINS = Path(__file__).resolve().parent / "pins.toml"
FORMAT = 1
SITE = "site"
STATE = ".host-bundle-state.json"
BIG = 4 << 20  # files at least this large (or a quarter of a part) are compressed as a group of their own
COUNTER = itertools.count()  # names of the compressed groups in the build's temp dir

# Per host: the ci/pins.toml table (its key named like the host holds the host's version; `wheels` the rest),
# ATOM's wheels carried beside it, the members left out of every bundled wheel (fnmatch patterns on site
# paths, "*" also matches "/"; each with its reason), and optional groups, left out with `--without NAME`.
HOSTS: dict[str, dict] = {
    "vllm": {
        "pins": "vllm_gpu_bundle",
        "atom": ("atom_kernels", "atom_core", "atom_vllm"),
        "prune": [
            ("vllm/vllm_flash_attn/_vllm_fa2_C*", "FA2: sm_80 code only"),
            ("vllm/vllm-rs", "Rust front-end binary: not used by LLM(...)"),
            ("vllm/third_party/deep_gemm/*", "DeepGEMM: headers and per-Python extensions, not on the LLM(...) path"),
            ("vllm/third_party/fmha_sm100/*", "sm_100 FMHA headers (Blackwell only)"),
        ],
        "optional": {"moe": ("vllm/_moe_C*", "vLLM's own MoE kernels (--without moe)")},
    },
    "sglang": {
        "pins": "sglang_gpu_bundle",
        "atom": ("atom_kernels", "atom_core", "atom_sglang"),
        "prune": [
            ("sgl_kernel/flash_ops.abi3.so", "FA3 for sm_80/86/90 in one 1.1 GB library (its sm_90 code alone: 497 MB, "
             "119 MB as xz); the Triton attention backend does not load it"),
            ("sgl_kernel/sm100/*", "common_ops built for sm_100+ (Blackwell); sgl_kernel loads sm90/ on Hopper"),
            ("sgl_kernel/infllm_ops.cpython-310-*", "InfLLM-V2 attention, a CPython 3.10 extension: cannot load on 3.12"),
            ("sglang/multimodal_gen/*", "diffusion models (the `sglang generate`/`serve` CLI): launch_server does not "
             "import it"),
            ("sglang/srt/grpc/_core*", "native gRPC server, loaded only with --grpc-port"),
            ("xgrammar/lib/*.a", "static C++ library for linking against xgrammar; Python loads libxgrammar_bindings.so"),
        ],
        "optional": {},
    },
}


class BundleError(Exception):
    """A failure reported as one line (no traceback)."""


def parse_size(text: str) -> int:
    """``58M`` -> 58 MiB, ``60MB`` -> 60 * 10**6, ``1234`` -> bytes (K/M/G binary, KB/MB/GB decimal)."""
    m = re.fullmatch(r"(\d+)\s*([KMG]?)(B?)", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (e.g. 58M, 60MB, 1048576)")
    unit = {"": 1, "K": 1, "M": 2, "G": 3}[m[2]]
    return int(m[1]) * ((1000 if m[3] else 1024) ** unit if m[2] else 1)


def canonical(name: str) -> str:
    """A distribution name as wheel file names spell it (PEP 503 normalised, ``_`` separators)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def load_pins(host: str, path: Path = PINS) -> dict:
    """The host's table of ci/pins.toml: HOST (its version), python, platforms, wheels."""
    name = HOSTS[host]["pins"]
    table = tomllib.loads(path.read_text()).get(name)
    if not table:
        raise BundleError(f"{path} has no [{name}] table")
    if absent := [k for k in (host, "python", "platforms", "wheels") if k not in table]:
        raise BundleError(f"{path} [{name}] lacks {', '.join(absent)}")
    return table


def prune_rules(host: str, without: list[str]) -> list[tuple[str, str]]:
    """The host's (pattern, reason) pairs, plus those of the optional groups named in ``without``."""
    optional = HOSTS[host]["optional"]
    if unknown := sorted(set(without) - set(optional)):
        raise BundleError(f"--without {', '.join(unknown)}: {host} has optional groups {sorted(optional) or 'none'}")
    return [*HOSTS[host]["prune"], *(optional[name] for name in without)]


def wheel_fits(filename: str, python: str, platforms: list[str]) -> bool:
    """Whether a wheel's (possibly compressed) tags fit CPython ``python`` (e.g. 3.12) on one of ``platforms``."""
    pys, abis, plats = filename[:-4].split("-")[-3:]
    cp = int(python.replace(".", ""))
    abi3 = "abi3" in abis.split(".")
    fits_python = any(t == "py3" or t == f"cp{cp}" or (abi3 and t.startswith("cp3") and int(t[2:]) <= cp)
                      for t in pys.split("."))
    return fits_python and any(t == "any" or t in platforms for t in plats.split("."))


def find_wheel(wheel_dir: Path, requirement: str, python: str, platforms: list[str]) -> Path | None:
    """The wheel for ``name==version`` already in ``wheel_dir`` that fits the target (None when absent)."""
    name, version = requirement.split("==")
    hits = [p for p in wheel_dir.glob("*.whl") if canonical(p.name.split("-")[0]) == canonical(name)
            and p.name.split("-")[1] == version and wheel_fits(p.name, python, platforms)]
    if len(hits) > 1:
        raise BundleError(f"several wheels for {requirement} in {wheel_dir}: {', '.join(p.name for p in hits)}")
    return hits[0] if hits else None


def download(requirements: list[str], wheel_dir: Path, python: str, platforms: list[str]) -> list[Path]:
    """Each requirement's wheel, from ``wheel_dir`` when there, else through ``pip download`` (no deps)."""
    wheel_dir.mkdir(parents=True, exist_ok=True)
    missing = [r for r in requirements if find_wheel(wheel_dir, r, python, platforms) is None]
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", python,
               "--implementation", "cp", *(a for p in platforms for a in ("--platform", p)), "-d", str(wheel_dir), *missing]
        print("+", " ".join(cmd), file=sys.stderr)
        if subprocess.run(cmd).returncode:
            raise BundleError(f"pip download failed for {' '.join(missing)}")
    wheels = [find_wheel(wheel_dir, r, python, platforms) for r in requirements]
    if None in wheels:
        raise BundleError(f"no wheel after download: {[r for r, w in zip(requirements, wheels) if w is None]}")
    return wheels


def check_exact_pins(host_wheel: Path, requirements: list[str]) -> None:
    """Every ``name==version`` requirement of the host's wheel that the bundle carries has that version."""
    with zipfile.ZipFile(host_wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    ours = {canonical(r.split("==")[0]): r.split("==")[1] for r in requirements}
    for name, version in re.findall(r"^Requires-Dist: ([A-Za-z0-9._-]+)(?:\[[^]]*\])?\s*==\s*([^\s,;]+)", text, re.M):
        if ours.get(canonical(name), version) != version:
            raise BundleError(f"{host_wheel.name} pins {name}=={version}, ci/pins.toml has {ours[canonical(name)]}")


def prune_reason(path: str, rules: list[tuple[str, str]]) -> str | None:
    """Why a site path is left out (None: kept)."""
    for pattern, reason in rules:
        if fnmatch.fnmatch(path, pattern):
            return reason
    return None


def wheel_members(wheel: Path, rules: list[tuple[str, str]]) -> tuple[list[tuple[str, str, int, int]], list[dict]]:
    """``(zip name, site path, size, mode)`` of each file the site tree gets from one wheel, and what is dropped
    (files and bytes per reason). ``*.data/purelib|platlib`` go to the site root; scripts, headers, data do not."""
    kept, dropped = [], {}
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            path, reason = info.filename, None
            m = re.match(r"[^/]+\.data/([^/]+)/(.*)", path)
            if m and m[1] in ("purelib", "platlib"):
                path = m[2]
            elif m:
                reason = f"wheel {m[1]}: not needed on PYTHONPATH"
            reason = reason or prune_reason(path, rules)
            if reason:
                entry = dropped.setdefault(reason, {"wheel": wheel.name, "reason": reason, "files": 0, "bytes": 0, "first": path})
                entry["files"], entry["bytes"] = entry["files"] + 1, entry["bytes"] + info.file_size
            else:
                kept.append((info.filename, path, info.file_size, (info.external_attr >> 16) & 0o755 or 0o644))
    return kept, list(dropped.values())


def plan_groups(wheels: list[Path], part_size: int, rules: list[tuple[str, str]]) -> tuple[list[dict], list[dict]]:
    """Compression groups: each big file alone, the other files of a wheel in chunks of at most a part (raw)."""
    big = min(BIG, part_size // 4)
    groups, dropped, seen = [], [], {}
    for wheel in wheels:
        kept, gone = wheel_members(wheel, rules)
        dropped += gone
        chunk: list = []
        for zname, path, size, mode in kept:
            if path in seen:
                raise BundleError(f"{path} is in both {seen[path]} and {wheel.name}")
            seen[path] = wheel.name
            member = (str(wheel), zname, path, size, mode)
            if size >= big:
                groups.append({"name": path, "members": [member]})
            elif chunk and sum(m[3] for m in chunk) + size > part_size:
                groups.append({"name": f"{wheel.name}#{len(groups)}", "members": chunk})
                chunk = [member]
            else:
                chunk.append(member)
        if chunk:
            groups.append({"name": wheel.name, "members": chunk})
    return groups, dropped


def write_group(members: list, out: Path, preset: int) -> int:
    """One deterministic ``.tar.xz`` of the members (all from one wheel, read straight from it); its size."""
    with zipfile.ZipFile(members[0][0]) as zf, tarfile.open(out, "w:xz", preset=preset, format=tarfile.PAX_FORMAT) as tar:
        for _, zname, path, size, mode in members:
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = size, mode, 315532800  # 1980-01-01, as in wheels
            with zf.open(zname) as src:
                tar.addfile(info, src)
    return out.stat().st_size


def compress_fitting(group: dict, tmp: Path, part_size: int, preset: int) -> list[dict]:
    """Compress a group; if it exceeds a part, halve it and retry. A single file that cannot fit is an error."""
    out = tmp / f"group{next(COUNTER):04d}.tar.xz"
    size = write_group(group["members"], out, preset)
    if size <= part_size:
        raw = sum(m[3] for m in group["members"])
        return [{"name": group["name"], "path": out, "xz": size, "raw": raw, "files": len(group["members"])}]
    out.unlink()
    members = group["members"]
    if len(members) == 1:
        raise BundleError(f"{members[0][2]} ({members[0][3]} bytes, {size} as xz) does not fit in a part of "
                          f"{part_size} bytes: raise --part-size")
    half = len(members) // 2
    return [b for i, part in enumerate((members[:half], members[half:]))
            for b in compress_fitting({"name": f"{group['name']}/{i}", "members": part}, tmp, part_size, preset)]


def pack(blobs: list[dict], part_size: int) -> list[list[dict]]:
    """First-fit decreasing: the fewest parts this simple rule finds, each at most ``part_size`` bytes."""
    parts: list[list[dict]] = []
    for blob in sorted(blobs, key=lambda b: (-b["xz"], b["name"])):
        target = next((p for p in parts if sum(b["xz"] for b in p) + blob["xz"] <= part_size), None)
        if target is None:
            parts.append(target := [])
        target.append(blob)
    return parts


def atom_wheels(directory: Path, dists: tuple[str, ...]) -> list[Path]:
    """ATOM's wheels for the host (e.g. atom-kernels, atom-core, atom-vllm) in ``directory`` (exactly one each)."""
    hits = {dist: sorted(directory.glob(f"{dist}-*.whl")) for dist in dists}
    bad = {f"{dist}-*.whl": [p.name for p in found] for dist, found in hits.items() if len(found) != 1}
    if bad:
        raise BundleError(f"expected one wheel for each of these in {directory}, found: {bad}")
    return [found[0] for found in hits.values()]


def requirements_of(pins: dict, host: str, version: str, extra: list[str]) -> list[str]:
    """``HOST==V`` then the pinned wheels; an ``--extra-wheel`` of a pinned name replaces its pin."""
    wanted = {canonical(r.split("==")[0]): r for r in [*pins["wheels"], *extra]}
    bad = [r for r in wanted.values() if r.count("==") != 1]
    if bad:
        raise BundleError(f"wheels must be NAME==VERSION: {', '.join(bad)}")
    return [f"{host}=={version}", *wanted.values()]


def write_parts(blobs: list[dict], out: Path, bundle: str, part_size: int) -> list[dict]:
    """Pack the compressed groups into ``BUNDLE.partNN.tar.xz`` files; their manifest entries."""
    parts = []
    for i, members in enumerate(pack(blobs, part_size), 1):
        path = out / f"{bundle}.part{i:02d}.tar.xz"
        with open(path, "wb") as f:
            for blob in members:
                with open(blob["path"], "rb") as src:
                    shutil.copyfileobj(src, f)
        parts.append({"name": path.name, "size": path.stat().st_size, "sha256": sha256_of(path),
                      "groups": [{k: b[k] for k in ("name", "files", "raw", "xz")} for b in members]})
    return parts


def build(args: argparse.Namespace) -> int:
    """Download, prune, compress, pack; write the parts and manifest.json into ``args.out``."""
    host = args.host
    without = sorted(set(args.without))
    pins, rules = load_pins(host, args.pins), prune_rules(host, without)
    version, python = args.version or pins[host], args.python or pins["python"]
    requirements = requirements_of(pins, host, version, args.extra_wheel)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    wheels = download(requirements, Path(args.wheel_dir or out / "wheels"), python, pins["platforms"])
    check_exact_pins(wheels[0], requirements)
    wheels += atom_wheels(Path(args.atom_wheels), HOSTS[host]["atom"]) if args.atom_wheels else []
    groups, dropped = plan_groups(wheels, args.part_size, rules)
    preset = int(args.xz_preset.rstrip("e")) | (lzma.PRESET_EXTREME if args.xz_preset.endswith("e") else 0)
    bundle = f"{host}-{version}-cp{python.replace('.', '')}"
    with tempfile.TemporaryDirectory(dir=out, prefix=".build-") as tmp, \
            ThreadPoolExecutor(max(1, min(os.cpu_count() or 1, args.jobs))) as pool:
        jobs = [pool.submit(compress_fitting, g, Path(tmp), args.part_size, preset) for g in groups]
        blobs = [b for job in jobs for b in job.result()]
        for old in out.iterdir():  # the previous build's parts and manifest
            if old.name == "manifest.json" or re.fullmatch(rf"{host}-.*\.part\d+\.tar\.xz", old.name):
                old.unlink()
        parts = write_parts(blobs, out, bundle, args.part_size)
    manifest = {
        "format": FORMAT, "bundle": bundle, "host": host, host: version, "python": python, "platforms": pins["platforms"],
        "id": hashlib.sha256("".join(p["sha256"] for p in parts).encode()).hexdigest()[:16],
        "without": without, "part_size": args.part_size, "xz_preset": args.xz_preset, "site": SITE, "parts": parts,
        "wheels": [{"file": w.name, "sha256": sha256_of(w), "size": w.stat().st_size} for w in wheels],
        "dropped": dropped,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for p in parts:
        print(f"{p['name']}  {p['size']:>11,} bytes  ({', '.join(g['name'] for g in p['groups'])})")
    print(f"{len(parts)} parts, {sum(p['size'] for p in parts):,} bytes (each <= {args.part_size:,}); {out / 'manifest.json'}")
    return 0


def gather(paths: list[str], manifest_arg: str | None) -> tuple[dict, dict[str, Path]]:
    """The manifest (``--manifest``, else the first manifest.json in or beside the given paths) and the
    manifest's parts found among the paths (directories are scanned, files taken as they are)."""
    if absent := [p for p in paths if not Path(p).exists()]:
        raise BundleError(f"{', '.join(absent)}: no such file or directory")
    files = [f for p in map(Path, paths) for f in (sorted(p.iterdir()) if p.is_dir() else [p]) if f.is_file()]
    candidates = [Path(manifest_arg)] if manifest_arg else \
        [f for f in files if f.name == "manifest.json"] + [f.parent / "manifest.json" for f in files]
    source = next((c for c in candidates if c.is_file()), None)
    if source is None:
        raise BundleError(f"no manifest.json in or beside {' '.join(paths)} (copy it with the parts)")
    manifest = json.loads(source.read_text())
    if manifest.get("format") != FORMAT:
        raise BundleError(f"{source}: manifest format {manifest.get('format')}, this script reads {FORMAT}")
    names = {p["name"] for p in manifest["parts"]}
    present: dict[str, Path] = {}
    for f in files:
        if f.name in names:
            present.setdefault(f.name, f)
    return manifest, present


def read_state(target: Path, manifest: dict) -> dict[str, str]:
    """Parts already unpacked in ``target`` (name -> sha256); refuses a target holding anything else."""
    state_file = target / STATE
    if state_file.is_file():
        state = json.loads(state_file.read_text())
        if state["id"] != manifest["id"]:
            raise BundleError(f"{target} holds bundle {state['bundle']} (id {state['id']}), these parts are "
                              f"{manifest['bundle']} (id {manifest['id']}): use another --target")
        return state["installed"]
    if target.exists() and any(target.iterdir()):
        raise BundleError(f"--target {target} is not empty and holds no bundle: give a new or empty directory")
    return {}


def write_state(target: Path, manifest: dict, installed: dict[str, str]) -> None:
    """Record the unpacked parts (written atomically, so an interrupted unpack is redone next time)."""
    tmp = target / (STATE + ".tmp")
    tmp.write_text(json.dumps({"bundle": manifest["bundle"], "id": manifest["id"], "installed": installed}, indent=1))
    os.replace(tmp, target / STATE)


def unpack(part: Path, site: Path) -> int:
    """Extract one part (concatenated tar.xz streams) under ``site``; regular files only, no path escapes."""
    count = 0
    with tarfile.open(part, "r:xz", ignore_zeros=True) as tar:
        for member in tar:
            dest = (site / member.name).resolve()
            if not member.isfile() or member.name.startswith("/") or site.resolve() not in dest.parents:
                raise BundleError(f"{part.name}: refusing member {member.name!r}")
            tar.extract(member, site, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
            count += 1
    return count


def install(args: argparse.Namespace) -> int:
    """Verify the parts present, unpack the new ones, report what is missing, print the PYTHONPATH.  Where none of
    ``--parts`` exists but ``--target`` holds an unpacked bundle (the parts were removed after an earlier run, e.g.
    a later transfer did not carry them), that bundle's manifest stands in: complete, it is used as it is."""
    target = Path(args.target).absolute()
    unpacked = target / "manifest.json"
    if not args.manifest and unpacked.is_file() and not any(Path(p).exists() for p in args.parts):
        manifest, present = json.loads(unpacked.read_text()), {}
        print(f"{', '.join(args.parts)}: not here; using the bundle unpacked in {target}", file=sys.stderr)
    else:
        manifest, present = gather(args.parts, args.manifest)
    installed = read_state(target, manifest)
    expected = {p["name"]: p for p in manifest["parts"]}
    bad = []
    for name, path in present.items():
        if path.stat().st_size != expected[name]["size"]:
            bad.append(f"{path} ({path.stat().st_size} bytes, expected {expected[name]['size']})")
        elif sha256_of(path) != expected[name]["sha256"]:
            bad.append(f"{path} (sha256 differs from the manifest)")
    if bad:
        raise BundleError(f"corrupt part(s), copy again: {', '.join(bad)}")
    site = target / SITE
    site.mkdir(parents=True, exist_ok=True)
    (target / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    for name, part in expected.items():
        if name in present and installed.get(name) != part["sha256"]:
            files = unpack(present[name], site)
            installed[name] = part["sha256"]
            write_state(target, manifest, installed)
            print(f"unpacked {name}: {files} files", file=sys.stderr)
        elif name in installed:
            print(f"already unpacked: {name}", file=sys.stderr)
    missing = [n for n in expected if n not in installed]
    if missing:  # one line; an error only with --require-all
        print(f"{'error: ' if args.require_all else ''}missing {len(missing)} of {len(expected)} parts: "
              f"{', '.join(missing)}", file=sys.stderr)
    else:
        print(f"complete: all {len(expected)} parts of {manifest['bundle']} unpacked in {site}", file=sys.stderr)
    print(f"PYTHONPATH={site}")
    return 3 if missing and args.require_all else 0


def main(argv: list[str] | None = None) -> int:
    """Command line: ``build`` (here, with PyPI) and ``install`` (on the air-gapped machine)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="download, prune and split a host + its import-time wheels into parts")
    b.add_argument("--host", required=True, choices=sorted(HOSTS), help="whose table in HOSTS and ci/pins.toml")
    b.add_argument("--version", "--vllm", help="the host's version (default: ci/pins.toml)")
    b.add_argument("--python", help="target Python, e.g. 3.12 (default: ci/pins.toml)")
    b.add_argument("--out", required=True, help="directory for the parts and manifest.json")
    b.add_argument("--part-size", type=parse_size, default=parse_size("58M"), help="58M = 58 MiB, 60MB = 60e6 bytes")
    b.add_argument("--without", action="append", default=[], metavar="GROUP", help="leave out an optional group: "
                   + "; ".join(f"{h}: {', '.join(f'{g} ({p})' for g, (p, _) in t['optional'].items())}"
                               for h, t in HOSTS.items() if t["optional"]))
    b.add_argument("--no-moe", dest="without", action="append_const", const="moe", help=argparse.SUPPRESS)
    b.add_argument("--extra-wheel", action="append", default=[], metavar="NAME==VER", help="one more wheel")
    b.add_argument("--atom-wheels", metavar="DIR", help="directory with ATOM's built wheels: atom-kernels, atom-core, "
                   "atom-vllm or atom-sglang")
    b.add_argument("--wheel-dir", help="wheels already downloaded / download cache (default: OUT/wheels)")
    b.add_argument("--xz-preset", default="9e", choices=[f"{i}{e}" for i in range(10) for e in ("", "e")])
    b.add_argument("--jobs", type=int, default=4, help="groups compressed at once (at most the CPU count)")
    b.add_argument("--pins", type=Path, default=PINS, help=argparse.SUPPRESS)
    i = sub.add_parser("install", help="verify and unpack the parts present; report the missing ones")
    i.add_argument("--parts", nargs="+", required=True, metavar="DIR_OR_FILE")
    i.add_argument("--target", required=True, help="unpack under TARGET/site")
    i.add_argument("--manifest", help="manifest.json (default: in or beside the parts)")
    i.add_argument("--require-all", action="store_true", help="exit 3 if any part is still missing")
    args = parser.parse_args(argv)
    try:
        return build(args) if args.command == "build" else install(args)
    except (BundleError, OSError, tarfile.TarError, lzma.LZMAError, KeyError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
