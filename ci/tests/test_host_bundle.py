"""ci/host_bundle.py on tiny fake wheels (no network): pruning, packing into parts, partial and repeated
installs, corrupt parts, a file too large for a part, entry points found through the unpacked dist-info; both
hosts' tables (vLLM, SGLang) and their ci/pins.toml tables."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "host_bundle.py"
spec = importlib.util.spec_from_file_location("host_bundle", SCRIPT)
vb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(vb)

KB = 1024
PART = 64 * KB


def make_wheel(directory: Path, name: str, version: str, files: dict[str, bytes], requires=(), entry_points="") -> Path:
    """A minimal wheel: the given files plus a dist-info (METADATA, WHEEL, entry_points.txt)."""
    dist = f"{vb.canonical(name)}-{version}"
    path = directory / f"{dist}-py3-none-any.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in files.items():
            zf.writestr(member, data)
        zf.writestr(f"{dist}.dist-info/METADATA", meta)
        zf.writestr(f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        if entry_points:
            zf.writestr(f"{dist}.dist-info/entry_points.txt", entry_points)
    return path


@pytest.fixture
def wheels(tmp_path: Path) -> dict[str, Path]:
    """A wheel dir holding a fake vllm 0.26.0 (incompressible 'extensions'), two small wheels, ATOM's
    three wheels in their own dir, and a pins file naming the small wheels."""
    wheel_dir, atom_dir = tmp_path / "wheels", tmp_path / "atom"
    wheel_dir.mkdir()
    atom_dir.mkdir()
    make_wheel(wheel_dir, "vllm", "0.26.0", {
        "vllm/__init__.py": b"__version__ = '0.26.0'\n",
        "vllm/_C_stable_libtorch.abi3.so": os.urandom(40 * KB),
        "vllm/_moe_C_stable_libtorch.abi3.so": os.urandom(30 * KB),
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": os.urandom(20 * KB),
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": os.urandom(50 * KB),
        "vllm/vllm-rs": os.urandom(10 * KB),
        "vllm/third_party/deep_gemm/include/a.hpp": b"// header\n" * 100,
        "vllm/third_party/fmha_sm100/b.hpp": b"// header\n" * 100,
        "vllm/third_party/flash_linear_attention/ops.py": b"X = 1\n",
        "vllm-0.26.0.data/scripts/vllm": b"#!python\n",
    }, requires=["depyf==0.20.0", "pydantic>=2.12", "torch==2.11.0"])
    make_wheel(wheel_dir, "depyf", "0.20.0", {"depyf/__init__.py": b"A = 1\n" * 3000})
    make_wheel(wheel_dir, "partial-json-parser", "0.2.1", {"partial_json_parser/__init__.py": b"B = 2\n"})
    for dist in ("atom-kernels", "atom-core"):
        make_wheel(atom_dir, dist, "0.1.0", {f"{vb.canonical(dist)}/__init__.py": b""})
    make_wheel(atom_dir, "atom-vllm", "0.1.0", {"atom_vllm/__init__.py": b""},
               entry_points="[vllm.general_plugins]\natom = atom_vllm.plugin:register\n")
    pins = tmp_path / "pins.toml"
    pins.write_text('[vllm_gpu_bundle]\nvllm = "0.26.0"\npython = "3.12"\nplatforms = ["manylinux_2_28_x86_64"]\n'
                    'wheels = ["depyf==0.20.0", "partial-json-parser==0.2.1"]\n')
    return {"wheel_dir": wheel_dir, "atom": atom_dir, "pins": pins, "root": tmp_path}


def build(w: dict, out: Path, *extra: str, part: int = PART, host: str = "vllm") -> int:
    return vb.main(["build", "--host", host, "--out", str(out), "--part-size", str(part), "--wheel-dir", str(w["wheel_dir"]),
                    "--pins", str(w["pins"]), "--xz-preset", "1", "--atom-wheels", str(w["atom"]), *extra])


def install(parts: list[Path], target: Path, *extra: str) -> int:
    return vb.main(["install", "--parts", *map(str, parts), "--target", str(target), *extra])


def test_parse_size():
    assert vb.parse_size("58M") == 58 << 20
    assert vb.parse_size("60MB") == 60_000_000
    assert vb.parse_size("4k") == 4096 and vb.parse_size("123") == 123


def test_build_prunes_and_packs(wheels, tmp_path, capsys):
    out = tmp_path / "out"
    assert build(wheels, out) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    parts = manifest["parts"]
    assert len(parts) >= 2 and all(p["size"] <= PART for p in parts)
    for p in parts:
        assert (out / p["name"]).stat().st_size == p["size"] and vb.sha256_of(out / p["name"]) == p["sha256"]
    dropped = {d["first"]: (d["files"], d["bytes"]) for d in manifest["dropped"]}
    assert dropped == {"vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": (1, 50 * KB), "vllm/vllm-rs": (1, 10 * KB),
                       "vllm/third_party/deep_gemm/include/a.hpp": (1, 1000), "vllm/third_party/fmha_sm100/b.hpp": (1, 1000),
                       "vllm-0.26.0.data/scripts/vllm": (1, 9)}
    groups = {g["name"] for p in parts for g in p["groups"]}
    assert "vllm/_moe_C_stable_libtorch.abi3.so" in groups  # kept by default
    assert [w["file"].split("-")[0] for w in manifest["wheels"]] == [
        "vllm", "depyf", "partial_json_parser", "atom_kernels", "atom_core", "atom_vllm"]
    if shutil.which("tar"):  # a part is plain concatenated tar.xz streams
        listing = subprocess.run(["tar", "-tJif", str(out / parts[0]["name"])], capture_output=True, text=True, check=True)
        assert listing.stdout.strip()
    assert build(wheels, out, "--without", "moe") == 0  # rebuild into the same dir replaces the old parts
    manifest = json.loads((out / "manifest.json").read_text())
    assert "vllm/_moe_C_stable_libtorch.abi3.so" in {d["first"] for d in manifest["dropped"]}
    assert manifest["host"] == "vllm" and manifest["vllm"] == "0.26.0" and manifest["without"] == ["moe"]
    assert sorted(p.name for p in out.glob("*.part*")) == sorted(p["name"] for p in manifest["parts"])


def test_install_partial_then_complete_and_idempotent(wheels, tmp_path, capsys):
    out, target = tmp_path / "out", tmp_path / "bundle"
    assert build(wheels, out) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    names = [p["name"] for p in manifest["parts"]]
    first = tmp_path / "transfer1"
    first.mkdir()
    shutil.copy(out / "manifest.json", first)
    shutil.copy(out / names[0], first)
    capsys.readouterr()
    assert install([first], target) == 0
    err = capsys.readouterr().err
    assert f"missing {len(names) - 1} of {len(names)} parts: {', '.join(names[1:])}" in err
    assert install([first], target, "--require-all") == 3
    assert f"error: missing {len(names) - 1} of {len(names)} parts" in capsys.readouterr().err
    # the other parts arrive later, as files, with the manifest beside them
    assert install([out / n for n in names[1:]], target, "--require-all") == 0
    captured = capsys.readouterr()
    assert "complete" in captured.err and f"PYTHONPATH={target / 'site'}" in captured.out
    site = target / "site"
    assert (site / "vllm/_C_stable_libtorch.abi3.so").is_file()
    assert (site / "vllm/third_party/flash_linear_attention/ops.py").is_file()
    assert not (site / "vllm/vllm-rs").exists() and not (site / "vllm/third_party/deep_gemm").exists()
    stamp = (site / "vllm/__init__.py").stat().st_mtime_ns
    assert install([out], target, "--require-all") == 0  # again: nothing unpacked
    assert "unpacked vllm" not in capsys.readouterr().err
    assert (site / "vllm/__init__.py").stat().st_mtime_ns == stamp
    plugins = [ep for d in importlib.metadata.distributions(path=[str(site)]) for ep in d.entry_points
               if ep.group == "vllm.general_plugins"]
    assert [(ep.name, ep.value) for ep in plugins] == [("atom", "atom_vllm.plugin:register")]


def test_corrupt_part_is_refused(wheels, tmp_path, capsys):
    out, target = tmp_path / "out", tmp_path / "bundle"
    assert build(wheels, out) == 0
    name = json.loads((out / "manifest.json").read_text())["parts"][0]["name"]
    data = bytearray((out / name).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (out / name).write_bytes(bytes(data))
    capsys.readouterr()
    assert install([out], target) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: corrupt part") and name in err[0] and "sha256" in err[0]
    assert not (target / "site" / "vllm").exists()


def test_file_larger_than_a_part_is_named(wheels, tmp_path, capsys):
    capsys.readouterr()
    assert build(wheels, tmp_path / "out", part=32 * KB) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: vllm/_C_stable_libtorch.abi3.so (40960 bytes") and "--part-size" in err


def test_target_guards(wheels, tmp_path, capsys):
    out = tmp_path / "out"
    assert build(wheels, out) == 0
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("x")
    assert install([out], busy) == 1
    assert "not empty" in capsys.readouterr().err and (busy / "keep.txt").exists()
    target = tmp_path / "bundle"
    assert install([out], target) == 0
    assert build(wheels, tmp_path / "other", "--no-moe") == 0  # the old spelling of --without moe
    capsys.readouterr()
    assert install([tmp_path / "other"], target) == 1
    assert "use another --target" in capsys.readouterr().err
    assert install([tmp_path / "nowhere"], tmp_path / "empty") == 1
    assert "no such file" in capsys.readouterr().err


def test_unpacked_bundle_serves_when_the_parts_are_gone(wheels, tmp_path, capsys):
    """A later transfer that does not carry the parts removes them: the bundle unpacked earlier still serves."""
    out, target = tmp_path / "out", tmp_path / "bundle"
    assert build(wheels, out) == 0
    names = [p["name"] for p in json.loads((out / "manifest.json").read_text())["parts"]]
    first = tmp_path / "transfer1"
    first.mkdir()
    shutil.copy(out / "manifest.json", first)
    shutil.copy(out / names[0], first)
    assert install([first], target) == 0
    shutil.rmtree(first)
    capsys.readouterr()
    assert install([first], target, "--require-all") == 3  # only part 1 was unpacked: the rest are named
    assert f"missing {len(names) - 1} of {len(names)}" in capsys.readouterr().err
    assert install([out], target, "--require-all") == 0
    shutil.rmtree(out)
    capsys.readouterr()
    assert install([out], target, "--require-all") == 0
    captured = capsys.readouterr()
    assert "using the bundle unpacked in" in captured.err and f"PYTHONPATH={target / 'site'}" in captured.out


def test_exact_pins_of_the_vllm_wheel_are_checked(wheels, tmp_path, capsys):
    (wheels["wheel_dir"] / "depyf-0.20.0-py3-none-any.whl").rename(wheels["wheel_dir"] / "depyf-0.19.0-py3-none-any.whl")
    wheels["pins"].write_text(wheels["pins"].read_text().replace("depyf==0.20.0", "depyf==0.19.0"))
    assert build(wheels, tmp_path / "out") == 1
    assert "pins depyf==0.20.0, ci/pins.toml has 0.19.0" in capsys.readouterr().err


def test_unknown_optional_group_is_named(wheels, tmp_path, capsys):
    capsys.readouterr()
    assert build(wheels, tmp_path / "out", "--without", "fa3") == 1
    assert "--without fa3: vllm has optional groups ['moe']" in capsys.readouterr().err


def test_sglang_host_prunes_its_kernel_wheel(tmp_path, capsys):
    """The SGLang table: FA3's library, the sm_100 ops and the CPython 3.10 extension are left out of
    sglang-kernel, SGLang's diffusion package out of sglang; sm90/common_ops and the rest are kept; atom-sglang's
    plugin entry point travels."""
    wheel_dir, atom_dir = tmp_path / "wheels", tmp_path / "atom"
    wheel_dir.mkdir()
    atom_dir.mkdir()
    make_wheel(wheel_dir, "sglang", "0.5.17", {"sglang/__init__.py": b"", "sglang/launch_server.py": b"X = 1\n",
                                                 "sglang/multimodal_gen/runtime.py": b"Y = 2\n"},
               requires=["sglang-kernel==0.4.5", "transformers==5.12.1", "torch==2.11.0", "fastapi"])
    make_wheel(wheel_dir, "sglang-kernel", "0.4.5", {
        "sgl_kernel/__init__.py": b"",
        "sgl_kernel/flash_ops.abi3.so": os.urandom(30 * KB),
        "sgl_kernel/sm90/common_ops.abi3.so": os.urandom(20 * KB),
        "sgl_kernel/sm100/common_ops.abi3.so": os.urandom(20 * KB),
        "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so": os.urandom(5 * KB),
        "triton_kernels/__init__.py": b"",
    })
    make_wheel(wheel_dir, "transformers", "5.12.1", {"transformers/__init__.py": b""})
    for dist in ("atom-kernels", "atom-core"):
        make_wheel(atom_dir, dist, "0.1.0", {f"{vb.canonical(dist)}/__init__.py": b""})
    make_wheel(atom_dir, "atom-sglang", "0.1.0", {"atom_sglang/__init__.py": b""},
               entry_points="[sglang.srt.plugins]\natom = atom_sglang.plugin:register\n")
    make_wheel(atom_dir, "atom-vllm", "0.1.0", {"atom_vllm/__init__.py": b""})  # another host's: not taken
    pins = tmp_path / "pins.toml"
    pins.write_text('[sglang_gpu_bundle]\nsglang = "0.5.17"\npython = "3.12"\nplatforms = ["manylinux_2_28_x86_64"]\n'
                    'wheels = ["sglang-kernel==0.4.5", "transformers==5.12.1"]\n')
    w = {"wheel_dir": wheel_dir, "atom": atom_dir, "pins": pins}
    out, target = tmp_path / "out", tmp_path / "bundle"
    assert build(w, out, host="sglang") == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["bundle"] == "sglang-0.5.17-cp312" and manifest["sglang"] == "0.5.17"
    assert all(p["name"].startswith("sglang-0.5.17-cp312.part") for p in manifest["parts"])
    assert {d["first"] for d in manifest["dropped"]} == {
        "sgl_kernel/flash_ops.abi3.so", "sgl_kernel/sm100/common_ops.abi3.so",
        "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so", "sglang/multimodal_gen/runtime.py"}
    assert [w["file"].split("-")[0] for w in manifest["wheels"]] == [
        "sglang", "sglang_kernel", "transformers", "atom_kernels", "atom_core", "atom_sglang"]
    assert install([out], target, "--require-all") == 0
    site = target / "site"
    assert (site / "sgl_kernel/sm90/common_ops.abi3.so").is_file() and (site / "triton_kernels/__init__.py").is_file()
    assert not (site / "sgl_kernel/flash_ops.abi3.so").exists() and not (site / "sgl_kernel/sm100").exists()
    plugins = [ep.value for d in importlib.metadata.distributions(path=[str(site)]) for ep in d.entry_points
               if ep.group == "sglang.srt.plugins"]
    assert plugins == ["atom_sglang.plugin:register"]
    pins.write_text(pins.read_text().replace("transformers==5.12.1", "transformers==5.17.0"))
    make_wheel(wheel_dir, "transformers", "5.17.0", {"transformers/__init__.py": b""})
    capsys.readouterr()
    assert build(w, out, host="sglang") == 1  # the machine's transformers is not the one SGLang pins
    assert "pins transformers==5.12.1, ci/pins.toml has 5.17.0" in capsys.readouterr().err


@pytest.mark.parametrize("host", sorted(vb.HOSTS))
def test_pins_tables_of_both_hosts_parse(host):
    """ci/pins.toml has each host's table: its version, CPython, platforms, NAME==VERSION wheels without repeats;
    every prune pattern and optional group carries a reason."""
    pins = vb.load_pins(host)
    assert pins[host].count(".") >= 2 and pins["python"] == "3.12" and pins["platforms"]
    requirements = vb.requirements_of(pins, host, pins[host], [])
    names = [vb.canonical(r.split("==")[0]) for r in requirements]
    assert len(names) == len(set(names)) == len(pins["wheels"]) + 1 and names[0] == host
    table = vb.HOSTS[host]
    assert all(pattern and reason for pattern, reason in [*table["prune"], *table["optional"].values()])
    assert len(table["atom"]) == 3 and table["atom"][-1] == f"atom_{host}"
