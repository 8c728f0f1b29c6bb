"""ci/check_wheels.py's tooling check: a library wheel holding a bench, accuracy or peers module is named."""

import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from check_wheels import tool_files  # noqa: E402


def wheel(tmp_path: Path, names: list[str]) -> Path:
    path = tmp_path / "atom_x-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name in names:
            zf.writestr(name, "")
    return path


def test_tooling_in_a_library_wheel_is_named(tmp_path):
    found = tool_files(wheel(tmp_path, ["atom_core/bench.py", "atom_kernels/bench/moe.py", "atom_core/accuracy.py",
                                        "atom_vllm/kernel_peers.py", "atom_core/models/llama.py",
                                        "atom_kernels/ops/fused_moe/configs.py", "atom_core-0.1.0.dist-info/RECORD"]))
    assert found == ["atom_core/bench.py", "atom_kernels/bench/moe.py", "atom_core/accuracy.py",
                     "atom_vllm/kernel_peers.py"]


def test_a_library_wheel_without_tooling_passes(tmp_path):
    assert tool_files(wheel(tmp_path, ["atom_core/quant/quantize.py", "atom_core/tiny.py", "atom_core/cli.py"])) == []
