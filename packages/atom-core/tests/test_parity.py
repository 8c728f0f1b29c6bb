"""Every dense catalog model equals transformers on tiny random checkpoints: prefill logits of a
batch of prompts of different lengths, greedy tokens, and the log-probability of every decoded token."""

import os

import pytest
import torch
from conftest import hf_model
from parity import BF16_LOGIT_ATOL, check_model

DENSE = ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"]


@pytest.mark.parametrize("arch", DENSE)
def test_fp32_cpu_parity(tiny, arch):
    model_dir = tiny(arch)
    check_model(model_dir, hf_model(model_dir))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("arch", DENSE)
def test_bf16_cuda_parity(tiny, arch):
    model_dir = tiny(arch)
    check_model(model_dir, hf_model(model_dir), device="cuda", dtype=torch.bfloat16, atol=BF16_LOGIT_ATOL)


def test_sharded_checkpoint(tiny):
    model_dir = tiny("LlamaForCausalLM", max_shard_size="1MB")
    from atom_core.loader import Checkpoint

    assert len(Checkpoint(model_dir).files) > 1
    check_model(model_dir, hf_model(model_dir), max_new_tokens=4)


def test_tied_embeddings(tiny):
    model_dir = tiny("Qwen3ForCausalLM", tie_word_embeddings=True)
    runner = check_model(model_dir, hf_model(model_dir), max_new_tokens=4)
    assert runner.model.lm_head.weight is runner.model.model.embed_tokens.weight


@pytest.mark.parametrize(
    "rope",
    [
        {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 64, "rope_theta": 500000.0},
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "rope_theta": 10000.0},
    ],
    ids=lambda r: r["rope_type"],
)
def test_rope_scalings(tiny, rope):
    model_dir = tiny("LlamaForCausalLM", rope_parameters=rope)
    check_model(model_dir, hf_model(model_dir), max_new_tokens=4)


def test_attention_and_mlp_biases(tiny):
    model_dir = tiny("LlamaForCausalLM", attention_bias=True, mlp_bias=True)
    check_model(model_dir, hf_model(model_dir), max_new_tokens=4)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="forces Triton onto CPU tensors: interpreter only")
def test_kernel_backends_agree_through_the_model(tiny, monkeypatch):
    """The same model with every op forced onto the Triton kernels (CPU interpreter) gives the same logits."""
    from atom_core.runtime.runner import Runner

    model_dir = tiny("Qwen3ForCausalLM")
    ref = Runner(model_dir).prompt_logits([[1, 2, 3, 4, 5]])[0]
    monkeypatch.setenv("ATOM_KERNEL_BACKEND", "triton")
    out = Runner(model_dir).prompt_logits([[1, 2, 3, 4, 5]])[0]
    assert (out - ref).abs().max().item() < 1e-4


def test_layers_share_one_cos_sin_cache(tiny):
    from atom_core.runtime.runner import Runner

    runner = Runner(tiny("Qwen3ForCausalLM"))
    caches = {id(layer.self_attn.rotary_emb.cos_sin_cache) for layer in runner.model.model.layers}
    assert len(caches) == 1
