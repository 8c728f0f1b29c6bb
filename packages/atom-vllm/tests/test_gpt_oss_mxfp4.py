"""``atom quantize --scheme mxfp4`` on gpt-oss writes the published layout: vLLM's own GptOssForCausalLM (atom-vllm's
plugin off) builds from it on the CPU and its own loader puts the checkpoint's bytes into its expert parameters
(:mod:`own_gpt_oss_mxfp4`).  vLLM has MXFP4 MoE kernels on the CPU only with AMX (or amd-quark's emulation):
elsewhere the kernel-side construction skips with vLLM's refusal, and the layout is still checked through vLLM's
loader with the kernel choice answered "none"."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import CONSTRUCT_ENV, HERE

pytestmark = pytest.mark.construct


@pytest.fixture(scope="module")
def own_gpt_oss(tmp_path_factory, vllm_cache) -> dict:
    if os.environ.get(CONSTRUCT_ENV, "every") == "family":
        pytest.skip(f"{CONSTRUCT_ENV}=family: run by the release that builds every architecture (ci/pins.toml)")
    from atom_core.quant.quantize import quantize_checkpoint
    from atom_core.tiny import make_tiny

    root = tmp_path_factory.mktemp("gpt-oss-mxfp4")
    model = quantize_checkpoint(make_tiny("GptOssForCausalLM", root / "bf16"), root / "mxfp4", "mxfp4")
    out = root / "own.json"
    env = {**os.environ, "ATOM_DISABLE_VLLM_PLUGIN": "1", "VLLM_CACHE_ROOT": vllm_cache}
    proc = subprocess.run([sys.executable, str(HERE / "own_gpt_oss_mxfp4.py"), str(model), str(out)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0 and out.is_file(), proc.stderr[-6000:]
    return json.loads(out.read_text())


def test_vllms_own_loader_reads_the_layout(own_gpt_oss):
    assert own_gpt_oss["class"] == "vllm.model_executor.models.gpt_oss.GptOssForCausalLM"
    assert own_gpt_oss["moe_method"] == "GptOssMxfp4MoEMethod"
    assert own_gpt_oss["loaded"] and all(own_gpt_oss["loaded"].values()), own_gpt_oss["loaded"]


def test_vllms_own_mxfp4_kernels_build(own_gpt_oss):
    if "refused" in own_gpt_oss:
        pytest.skip(f"vLLM refuses MXFP4 MoE on this CPU: {own_gpt_oss['refused']} (its CPU kernel needs AMX, "
                    "its emulation amd-quark)")
