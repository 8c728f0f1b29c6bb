"""MiniMax-M2 (``MiniMaxM2ForCausalLM``): grouped-query attention whose q and k RMSNorms span the whole
projection (every head at once) before a partial rotary embedding, and a sparse MoE block in every layer
routed by sigmoid scores with a correction bias (DeepSeek-V3's scoring, ungrouped, no routed scaling):

    q, k, v = q_proj(x), k_proj(x), v_proj(x)
    q, k    = rmsnorm(q) over all heads, rmsnorm(k) over all kv heads     (weights [H·d], [H_kv·d])
    q, k    = rope on the first rotary_dim of each head (NeoX halves)      (config rotary_dim / partial_rotary_factor)
    h       = h + o_proj(attn(q, k, v))
    s       = sigmoid(x Wᵣᵀ) (fp32);  ids = top-k of s + correction_bias;  weights = s[ids] / Σ s[ids]
    h       = h + Σ_j weights_j · expert_{ids_j}(rmsnorm(h))              experts: SwiGLU (w1 gate, w3 up, w2 down)

Checkpoints name the block ``block_sparse_moe`` with ``e_score_correction_bias`` beside its ``gate``
(transformers' in-memory names: ``mlp``, ``mlp.e_score_correction_bias``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from atom_core.config import DecoderConfig, text_config
from atom_core.host import Host
from atom_core.layers.moe import RouterConfig, SparseMoeBlock
from atom_core.layers.norm import ShardedRMSNorm
from atom_core.loader import WeightMapper
from atom_core.loader.experts import with_experts
from atom_core.models.llama import (
    DENSE_MAPPER,
    TIED_DENSE_MAPPER,
    Attention,
    AttentionOptions,
    DecoderLayer,
    DecoderModel,
    LlamaForCausalLM,
)

RENAMES = (
    (r"\.(?:block_sparse_moe|mlp)\.e_score_correction_bias$", ".mlp.gate.e_score_correction_bias"),
    (r"\.block_sparse_moe\.", ".mlp."),
)
MAPPER = with_experts(DENSE_MAPPER, renames=RENAMES)
TIED_MAPPER = with_experts(TIED_DENSE_MAPPER, renames=RENAMES)


class FullWidthQKNormAttention(Attention):
    """Llama attention with q and k normalised over the whole projection (all heads), then rotated."""

    def __init__(self, cfg: DecoderConfig, options: AttentionOptions, layer_id: int, *, host: Host, prefix: str):
        super().__init__(cfg, options, layer_id, host=host, prefix=prefix)
        self.q_norm = ShardedRMSNorm(self.qkv_proj.shard_source(0), cfg.rms_norm_eps, tp=host.tp)
        self.k_norm = ShardedRMSNorm(self.qkv_proj.shard_source(1), cfg.rms_norm_eps, tp=host.tp)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        q, k = self.rotary_emb(positions, self.q_norm(q), self.k_norm(k))
        return self.o_proj(self.attn(q, k, v))


class MiniMaxM2DecoderLayer(DecoderLayer):
    attention_class = FullWidthQKNormAttention


class MiniMaxM2Model(DecoderModel):
    layer_class = MiniMaxM2DecoderLayer


def minimax_router(cfg: Any) -> RouterConfig:
    return RouterConfig(num_experts=cfg.num_local_experts, top_k=cfg.num_experts_per_tok, scoring="sigmoid",
                        renormalize=True, correction_bias=True, fp32_logits=True)


class MiniMaxM2ForCausalLM(LlamaForCausalLM):
    weight_mapper = MAPPER
    decoder_model_class = MiniMaxM2Model

    def attention_options(self, cfg: Any) -> AttentionOptions:
        return AttentionOptions(qkv_bias=False, o_bias=False)

    def build_mlp(self, hf_config: Any, cfg: DecoderConfig, layer_id: int, *, host: Host, prefix: str) -> nn.Module:
        return SparseMoeBlock(cfg.hidden_size, minimax_router(text_config(hf_config)), cfg.intermediate_size, host=host,
                              prefix=prefix)

    def mapper(self) -> WeightMapper:
        return TIED_MAPPER if self.decoder_config.tie_word_embeddings else MAPPER
