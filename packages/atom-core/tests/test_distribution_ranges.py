"""The ranges ATOM's distributions declare on each other, checked at run time (atom_core.versions)."""

from __future__ import annotations

import pytest

from atom_core import versions


def fake_dist(root, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    lines = ["Metadata-Version: 2.4", f"Name: {name}", f"Version: {version}", *(f"Requires-Dist: {r}" for r in requires)]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


def test_core_outside_the_adapters_range_names_both_versions(tmp_path, monkeypatch):
    fake_dist(tmp_path, "atom-vllm", "0.3.0", ("atom-core<0.2,>=0.1", "packaging", 'vllm==0.34.0; extra == "vllm"'))
    fake_dist(tmp_path, "atom-core", "1.0.0", ("atom-kernels<0.2,>=0.1",))
    fake_dist(tmp_path, "atom-kernels", "0.1.4")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(versions.VersionMismatch, match=r"atom-vllm 0\.3\.0 requires atom-core<0\.2,>=0\.1, but atom-core "
                                                        r"1\.0\.0 is installed"):
        versions.check_requirements("atom-vllm")
    versions.check_requirements("atom-core")  # atom-kernels 0.1.4 is inside atom-core's range
    assert versions.installed()["atom-vllm"] == "0.3.0"


def test_missing_requirement_and_uninstalled_distribution(tmp_path, monkeypatch):
    fake_dist(tmp_path, "atom-sglang", "0.2.0", ("atom-core<0.3,>=0.2",))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(versions.importlib.metadata, "version", lambda name: (_ for _ in ()).throw(
        versions.importlib.metadata.PackageNotFoundError(name)))
    assert versions.mismatches("atom-sglang") == ["atom-sglang 0.2.0 requires atom-core<0.3,>=0.2, which is not installed"]
    assert versions.mismatches("no-such-distribution") == []
