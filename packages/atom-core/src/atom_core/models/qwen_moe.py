"""Qwen mixture-of-experts decoders: Qwen2-MoE and Qwen3-MoE.

Llama-style attention (Qwen2-MoE: q/k/v bias; Qwen3-MoE: per-head q/k RMSNorm); the MLP of a layer is
a sparse MoE block when ``layer not in mlp_only_layers and (layer + 1) % decoder_sparse_step == 0``,
else a dense SwiGLU MLP of ``intermediate_size``:

    weights, ids = top-k of softmax(x Wᵣᵀ)          (renormalised when norm_topk_prob)
    y = Σ_j weights_j · expert_{ids_j}(x)         experts: SwiGLU MLPs of moe_intermediate_size
    y += σ(x wₛᵀ) · shared_expert(x)              Qwen2-MoE only
"""

from __future__ import annotations

from typing import Any

from torch import nn

from atom_core.config import DecoderConfig, text_config
from atom_core.host import Host
from atom_core.layers.moe import RouterConfig, SparseMoeBlock
from atom_core.loader import WeightMapper
from atom_core.loader.experts import with_experts
from atom_core.models.llama import (
    DENSE_MAPPER,
    TIED_DENSE_MAPPER,
    AttentionOptions,
    GatedMLP,
    LlamaForCausalLM,
    Qwen3ForCausalLM,
)

MOE_MAPPER = with_experts(DENSE_MAPPER)
TIED_MOE_MAPPER = with_experts(TIED_DENSE_MAPPER)


def is_sparse_layer(cfg: Any, layer_id: int) -> bool:
    return (
        layer_id not in (getattr(cfg, "mlp_only_layers", None) or [])
        and cfg.num_experts > 0
        and (layer_id + 1) % getattr(cfg, "decoder_sparse_step", 1) == 0
    )


def qwen_router(cfg: Any) -> RouterConfig:
    return RouterConfig(
        num_experts=cfg.num_experts, top_k=cfg.num_experts_per_tok, renormalize=bool(cfg.norm_topk_prob),
        weights_in_input_dtype=True,
    )


class QwenMoeCausalLM(LlamaForCausalLM):
    """The MoE MLPs shared by the Qwen families; ``shared_expert`` says whether the block has one."""

    weight_mapper = MOE_MAPPER
    shared_expert = False

    def build_mlp(self, hf_config: Any, cfg: DecoderConfig, layer_id: int, *, host: Host, prefix: str) -> nn.Module:
        text = text_config(hf_config)
        if not is_sparse_layer(text, layer_id):
            return super().build_mlp(hf_config, cfg, layer_id, host=host, prefix=prefix)
        shared = None
        if self.shared_expert and getattr(text, "shared_expert_intermediate_size", 0):
            shared = GatedMLP(cfg.hidden_size, text.shared_expert_intermediate_size, bias=False, host=host,
                              prefix=f"{prefix}.shared_expert")
        return SparseMoeBlock(cfg.hidden_size, qwen_router(text), text.moe_intermediate_size, host=host, prefix=prefix,
                              shared_expert=shared, shared_expert_gate=shared is not None)

    def mapper(self) -> WeightMapper:
        return TIED_MOE_MAPPER if self.decoder_config.tie_word_embeddings else MOE_MAPPER


class Qwen2MoeForCausalLM(QwenMoeCausalLM):
    shared_expert = True

    def attention_options(self, cfg: Any) -> AttentionOptions:
        return AttentionOptions(qkv_bias=bool(getattr(cfg, "qkv_bias", True)), o_bias=False)


class Qwen3MoeForCausalLM(QwenMoeCausalLM):
    attention_options = Qwen3ForCausalLM.attention_options
