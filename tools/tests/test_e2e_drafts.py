"""The vLLM bench's speculative-decoding part (atom_tools.e2e.drafts): engine names, which models and formats can
draft, the agreeing draft written into a copy of the checkpoint (once), and the acceptance from vLLM's counters.
No host: the checkpoints are tiny DeepSeek-V3s and a Qwen3-Next."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from atom_core.tiny import add_mtp_layer, make_tiny
from atom_tools.e2e import drafts


def test_engine_names_carry_backend_and_draft_method():
    assert drafts.engine_parts("atom") == ("atom", None, None)
    assert drafts.engine_parts("vllm@FLASH_ATTN") == ("vllm", "FLASH_ATTN", None)
    assert drafts.engine_parts(drafts.drafting_name("atom@CUSTOM", "mtp")) == ("atom", "CUSTOM", "mtp")
    assert drafts.engine_parts("vllm+mtp") == ("vllm", None, "mtp")
    assert drafts.plain_name("vllm@FLASH_ATTN+mtp") == "vllm@FLASH_ATTN" and drafts.plain_name("atom") == "atom"


def test_models_without_a_draft_and_quantized_formats_are_refused():
    assert drafts.refusal({"deepseek-v3": "DeepseekV3ForCausalLM"}, ["bf16"]) is None
    why = drafts.refusal({"deepseek-v3": "DeepseekV3ForCausalLM", "qwen3-8b": "Qwen3ForCausalLM"}, ["bf16"])
    assert why == ("--speculative: no draft for qwen3-8b (drafts: DeepseekV3ForCausalLM (mtp), "
                   "Qwen3NextForCausalLM (mtp))")
    assert "bf16 checkpoints only" in drafts.refusal({"deepseek-v3": "DeepseekV3ForCausalLM"}, ["bf16", "fp8-block"])


def weight_names(model_dir) -> set[str]:
    names = set()
    for file in model_dir.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as f:
            names |= set(f.keys())
    return names


def test_the_draft_is_added_to_a_copy_once_and_a_published_one_is_used_as_it_is(tmp_path, monkeypatch):
    base = make_tiny("DeepseekV3ForCausalLM", tmp_path / "bf16", dtype=torch.bfloat16)
    assert not drafts.has_mtp_layer(base)
    out, method = drafts.with_draft("DeepseekV3ForCausalLM", base, agreeing=0.0)
    assert method == "mtp" and out != base and out.parent == base.parent
    assert drafts.has_mtp_layer(out) and not drafts.has_mtp_layer(base)
    layers = json.loads((out / "config.json").read_text())["num_hidden_layers"]
    assert f"model.layers.{layers}.shared_head.head.weight" in weight_names(out)
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:  # the new tensors in the checkpoint's dtype
        assert f.get_tensor(f"model.layers.{layers}.eh_proj.weight").dtype == torch.bfloat16

    def no_second_write(*args, **kwargs):
        raise AssertionError("a finished copy is written again")

    monkeypatch.setattr("atom_core.tiny.add_mtp_layer", no_second_write)
    assert drafts.with_draft("DeepseekV3ForCausalLM", base, agreeing=0.0) == (out, "mtp")
    published = add_mtp_layer(base, tmp_path / "published")  # a checkpoint that carries its own MTP layer
    assert drafts.with_draft("DeepseekV3ForCausalLM", published, agreeing=0.0) == (published, "mtp")


def test_a_config_naming_a_draft_without_its_weights_gets_one(tmp_path):
    base = make_tiny("DeepseekV3ForCausalLM", tmp_path / "bf16")
    config = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps(dict(config, num_nextn_predict_layers=1)))
    assert not drafts.has_mtp_layer(base)
    assert drafts.with_draft("DeepseekV3ForCausalLM", base, agreeing=0.5)[0].name == "bf16-mtp-agreeing0.5"


def test_qwen3_next_gets_its_mtp_draft(tmp_path):
    """Qwen3-Next's draft is Qwen's ``mtp.*`` layer (atom_core.tiny.add_qwen3_next_mtp), vLLM's method ``mtp``."""
    assert drafts.refusal({"qwen3-next-80b-a3b": "Qwen3NextForCausalLM"}, ["bf16"]) is None
    base = make_tiny("Qwen3NextForCausalLM", tmp_path / "bf16")
    draft = drafts.DRAFTS["Qwen3NextForCausalLM"]
    assert not drafts.has_mtp_layer(base, draft)
    out, method = drafts.with_draft("Qwen3NextForCausalLM", base, agreeing=0.5)
    assert (out.name, method) == ("bf16-mtp-agreeing0.5", "mtp")
    assert drafts.has_mtp_layer(out, draft) and not drafts.has_mtp_layer(out, drafts.DRAFTS["DeepseekV3ForCausalLM"])
    assert {"mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight"} <= weight_names(out)


@pytest.mark.parametrize("counters, expected", [
    ({"vllm:spec_decode_num_draft_tokens": 40.0, "vllm:spec_decode_num_accepted_tokens": 30.0,
      "vllm:spec_decode_num_drafts": 20.0}, {"draft_tokens": 40, "accepted_tokens": 30, "acceptance": 0.75}),
    ({}, {"draft_tokens": 0, "accepted_tokens": 0, "acceptance": None}),
])
def test_acceptance_from_vllms_counters(counters, expected):
    assert drafts.acceptance(counters) == expected
    assert drafts.speculative_config("mtp", 3) == {"method": "mtp", "num_speculative_tokens": 3}
