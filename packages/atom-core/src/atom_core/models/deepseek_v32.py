"""DeepSeek-V3.2 (``DeepseekV32ForCausalLM``) and GLM-5 (``GlmMoeDsaForCausalLM``): DeepSeek-V3's latent attention
and MoE with DeepSeek sparse attention (DSA).  Each layer's lightning indexer scores the cached tokens per query
and the latent attention reads only the ``index_topk`` best:

    per layer, x = rmsnorm(h), r = q_a_layernorm(q_a_proj(x))          (DeepSeek-V3's q LoRA activation)
        q_i = rope(wq_b(r))                     [index_n_heads, index_head_dim], rope on the first qk_rope_head_dim
        k_i = rope(layernorm(wk(x)))            [index_head_dim], one per token, cached beside the latent
        w   = weights_proj(x) · index_n_heads^-½
        score(t, j) = Σ_h w_h · relu(q_i,h · k_i,j · index_head_dim^-½)     for cached j <= t
        latent attention of t over its index_topk best j only

The two families differ in data: DeepSeek-V3.2 rotates the indexer's q/k in NeoX halves and GLM-5 in adjacent
pairs; GLM-5's ``indexer_types`` marks "shared" layers, which have no indexer and reuse the selection of the last
"full" layer before them.  The native host implements the sparse step (:mod:`atom_core.runtime.sparse_attention`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from atom_core.config import DecoderConfig, text_config
from atom_core.errors import UnsupportedConfigError
from atom_core.host import Host, SparseSelectionSpec
from atom_core.layers.linear import ReplicatedLinear
from atom_core.layers.norm import LayerNorm
from atom_core.layers.params import make_param
from atom_core.layers.rotary import get_rope, table_length
from atom_core.models.deepseek_v3 import DeepseekV3ForCausalLM, LatentAttention, LatentDims
from atom_core.models.llama import AttentionOptions, DecoderLayer, DecoderModel

INDEXER_TYPES = ("full", "shared")


@dataclasses.dataclass(frozen=True)
class IndexerDims:
    n_heads: int
    head_dim: int
    topk: int
    rope_interleave: bool  # rotary pairs (x0, x1), ... (GLM-5) instead of NeoX halves (DeepSeek-V3.2)
    own_indexer: tuple[bool, ...]  # per layer: runs its own indexer (False: reuses the last one's selection)

    @classmethod
    def from_hf(cls, text: Any, rope_interleave: bool) -> IndexerDims:
        """``rope_interleave``: the family's indexer rope, unless the config's ``indexer_rope_interleave`` says."""
        types = list(getattr(text, "indexer_types", None) or ["full"] * text.num_hidden_layers)
        if len(types) != text.num_hidden_layers or any(t not in INDEXER_TYPES for t in types) or types[0] != "full":
            raise UnsupportedConfigError(f"config.json indexer_types {types}: one of {INDEXER_TYPES} per layer "
                                         f"({text.num_hidden_layers}), the first 'full'")
        if not text.q_lora_rank:
            raise UnsupportedConfigError("config.json q_lora_rank is null: the DSA indexer reads the q LoRA activation")
        if text.index_head_dim < text.qk_rope_head_dim:
            raise UnsupportedConfigError(f"config.json index_head_dim {text.index_head_dim} is below qk_rope_head_dim "
                                         f"{text.qk_rope_head_dim} (the indexer rotates its first qk_rope_head_dim)")
        interleave = getattr(text, "indexer_rope_interleave", None)  # published GLM-5 configs spell it out
        return cls(text.index_n_heads, text.index_head_dim, text.index_topk,
                   rope_interleave if interleave is None else bool(interleave), tuple(t == "full" for t in types))


@dataclasses.dataclass(frozen=True)
class SparseAttentionOptions(AttentionOptions):
    indexer: IndexerDims | None = None


class Fp32Linear(nn.Module):
    """A bias-free projection kept in fp32 and never quantized: the indexer's ``weights_proj`` (transformers keeps it
    in fp32; FP8 checkpoints store it unquantized)."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.weight = make_param((out_features, in_features), torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.float(), self.weight)


class Indexer(nn.Module):
    """The lightning indexer's projections: ``(q [T, H, D], k [T, D], weights [T, H])`` of the step's tokens."""

    def __init__(self, cfg: DecoderConfig, dims: IndexerDims, latent: LatentDims, *, host: Host, prefix: str):
        super().__init__()
        self.n_heads, self.head_dim, self.rope_dim = dims.n_heads, dims.head_dim, latent.qk_rope_head_dim
        self.wq_b = ReplicatedLinear(latent.q_lora_rank, dims.n_heads * dims.head_dim, bias=False, host=host,
                                     prefix=f"{prefix}.wq_b")
        self.wk = ReplicatedLinear(cfg.hidden_size, dims.head_dim, bias=False, host=host, prefix=f"{prefix}.wk")
        self.k_norm = LayerNorm(dims.head_dim, eps=1e-6)
        self.weights_proj = Fp32Linear(cfg.hidden_size, dims.n_heads)
        self.rotary_emb = get_rope(self.rope_dim, self.rope_dim, cfg.max_position, cfg.rope,
                                   is_neox=not dims.rope_interleave, length=table_length(host, cfg.max_position))

    def forward(self, positions: torch.Tensor, x: torch.Tensor, q_resid: torch.Tensor):
        tokens, heads, rope = x.shape[0], self.n_heads, self.rope_dim
        q = self.wq_b(q_resid).view(tokens, heads, self.head_dim)
        k = self.k_norm(self.wk(x))
        q_rot, k_rot = self.rotary_emb(positions, q[..., :rope].reshape(tokens, -1), k[:, :rope].contiguous())
        q = torch.cat([q_rot.view(tokens, heads, rope), q[..., rope:]], dim=-1)
        k = torch.cat([k_rot.view(tokens, rope), k[:, rope:]], dim=-1)
        weights = self.weights_proj(x) * heads**-0.5
        return q, k, weights


class SparseLatentAttention(LatentAttention):
    def sparse_selection(self, cfg, options, layer_id, *, host, prefix) -> SparseSelectionSpec:
        dims: IndexerDims = options.indexer
        own = dims.own_indexer[layer_id]
        if own:
            self.indexer = Indexer(cfg, dims, options.latent, host=host, prefix=f"{prefix}.indexer")
        return SparseSelectionSpec(dims.head_dim, dims.topk, dims.head_dim**-0.5, own_indexer=own)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, kv_c, k_pe, q_resid = self.project(positions, x)
        index = self.indexer(positions, x, q_resid) if hasattr(self, "indexer") else None
        return self.o_proj(self.attn(q, kv_c, k_pe, index))


class SparseLatentDecoderLayer(DecoderLayer):
    attention_class = SparseLatentAttention


class SparseLatentDecoderModel(DecoderModel):
    layer_class = SparseLatentDecoderLayer


class DeepseekV32ForCausalLM(DeepseekV3ForCausalLM):
    decoder_model_class = SparseLatentDecoderModel
    indexer_rope_interleave = False  # DeepSeek-V3.2's indexer rotates NeoX halves (its latent attention: pairs)

    def attention_options(self, cfg: Any) -> AttentionOptions:
        text = text_config(cfg)
        return SparseAttentionOptions(qkv_bias=False, o_bias=False, latent=LatentDims.from_hf(text),
                                      indexer=IndexerDims.from_hf(text, self.indexer_rope_interleave))


class GlmMoeDsaForCausalLM(DeepseekV32ForCausalLM):
    indexer_rope_interleave = True
