"""vLLM's speculative decoding with ATOM's draft model: ``--speculative-config`` method ``mtp`` on a tiny DeepSeek-V3
checkpoint that carries one MTP layer resolves the draft architecture (``DeepSeekMTPModel``) to ATOM's class, which
vLLM builds on the CPU and loads through its own model loader: every parameter written (each was NaN before), the
returned set is every parameter, and the draft's attention layer is vLLM's latent attention under the MTP layer's
name.  A release whose engine config refuses speculative decoding on the CPU is reported with vLLM's message."""

from __future__ import annotations

import pytest
from conftest import cpu_mla_missing

from atom_core.tiny import add_mtp_layer, make_tiny

pytestmark = pytest.mark.construct

ARCH = "DeepseekV3ForCausalLM"


@pytest.fixture(scope="module")
def mtp_checkpoint(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("mtp")
    return str(add_mtp_layer(make_tiny(ARCH, root / "target"), root / "with-mtp"))


def test_mtp_draft_is_atoms_and_loads(mtp_checkpoint, probe):
    if why := cpu_mla_missing():
        pytest.skip(why)
    (result,) = probe("draft", [mtp_checkpoint])
    if result.get("stage") == "config":
        pytest.skip(f"this vLLM refuses speculative decoding on the CPU: {result['error']}")
    assert (result["arch"], result["module"], result["qualname"]) == ("DeepSeekMTPModel", "atom_vllm.models",
                                                                     "DeepSeekMTPModel")
    assert result["method"] in ("mtp", "deepseek_mtp")
    assert result["nan_params"] == []
    assert set(result["returned"]) == set(result["params"])
    assert "model.layers.3.eh_proj.weight" in result["params"]
    assert result["forward_context"].get("model.layers.3.mtp_block.self_attn.attn") == "VllmLatentAttention"
