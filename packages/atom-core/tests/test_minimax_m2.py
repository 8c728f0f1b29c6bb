"""MiniMax-M2 against transformers' ``MiniMaxM2ForCausalLM`` on tiny random checkpoints whose 1-D tensors (norms,
the routers' correction biases) are randomised.

* Parity (fp32, CPU; ``parity.check_model``: prefill logits of three prompts within 1e-4, greedy tokens, decode
  log-probabilities within 1e-4): q/k RMSNorms over the whole projection, rotary on half of each head, sigmoid
  routing with a correction bias; then full rotary with top-1 routing.
* Two tensor-parallel CPU ranks (gloo): the q/k norms span heads split over the ranks (their mean square is
  all-reduced), with kv heads split and with one kv head replicated on both ranks.
"""

from __future__ import annotations

import pytest
from conftest import hf_model, with_random_vectors
from parity import FP32_LOGIT_ATOL, PROMPTS, check_model, reference_logits
from test_moe_models import _check_correction_bias_matters

from atom_core.layers.moe import FusedMoE
from atom_core.layers.norm import ShardedRMSNorm

ARCH = "MiniMaxM2ForCausalLM"


@pytest.fixture(scope="session")
def minimax_dir(tiny, tmp_path_factory):
    def build(**overrides) -> str:
        key = "-".join(f"{k}{v}" for k, v in sorted(overrides.items())) or "default"
        return with_random_vectors(tiny(ARCH, **overrides), tmp_path_factory.getbasetemp() / f"minimax-{key}")

    return build


def test_fp32_cpu_parity(minimax_dir):
    model_dir = minimax_dir()
    runner = check_model(model_dir, hf_model(model_dir))
    attn = runner.model.model.layers[0].self_attn
    assert isinstance(attn.q_norm, ShardedRMSNorm) and attn.q_norm.weight.shape == (4 * 64,)
    assert attn.k_norm.weight.shape == (2 * 64,) and attn.rotary_emb.rotary_dim == 32
    assert all(isinstance(layer.mlp.experts, FusedMoE) for layer in runner.model.model.layers)
    _check_correction_bias_matters(runner.model.model.layers[1].mlp.gate)


def test_fp32_cpu_parity_full_rotary_top1(minimax_dir):
    model_dir = minimax_dir(rotary_dim=64, partial_rotary_factor=1.0, num_experts_per_tok=1)
    check_model(model_dir, hf_model(model_dir), max_new_tokens=4)


@pytest.mark.parametrize("kv_heads", [2, 1], ids=["kv-split", "kv-replicated"])
def test_tp2_matches_transformers(minimax_dir, tmp_path, kv_heads):
    from test_tensor_parallel import run_tp

    model_dir = minimax_dir(num_key_value_heads=kv_heads)
    results = run_tp(model_dir, tmp_path)
    want = reference_logits(hf_model(model_dir), PROMPTS)
    for rank, result in enumerate(results):
        for got, ref in zip(result["logits"], want):
            assert (got - ref).abs().max().item() <= FP32_LOGIT_ATOL, f"rank {rank}"
    assert results[0]["tokens"] == results[1]["tokens"]


def test_legacy_rotary_dim_sets_the_partial_rotary_factor():
    """Published MiniMax-M2 configs give ``rotary_dim`` (64 of 128) rather than ``partial_rotary_factor``; hosts that
    read config.json with a config class of their own see only that field."""
    from types import SimpleNamespace

    from atom_core.config import rope_parameters

    cfg = SimpleNamespace(rotary_dim=64, head_dim=128, hidden_size=3072, num_attention_heads=48, rope_theta=5e6,
                          max_position_embeddings=196608)
    assert rope_parameters(cfg)["partial_rotary_factor"] == 0.5
