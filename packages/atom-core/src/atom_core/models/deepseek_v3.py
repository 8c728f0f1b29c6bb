"""DeepSeek-V3 / R1 and Kimi-K2 (``DeepseekV3ForCausalLM``): multi-head latent attention, dense MLPs in the
first ``first_k_dense_replace`` layers and GLM-4.5's grouped sigmoid routing (``noaux_tc``) after.

    per layer, x = rmsnorm(h):
        q      = q_b_proj(rmsnorm(q_a_proj(x)))   (or q_proj(x) when q_lora_rank is null)   [H, nope | rope]
        c, kpe = kv_a_proj_with_mqa(x)            c: kv_lora_rank, kpe: qk_rope_head_dim (one shared head)
        c      = rmsnorm(c);  q_rope, kpe = rope(q_rope, kpe)   (YaRN; DeepSeek's rope pairs (x0, x1) adjacent)
        k_h    = [c W_UK,hᵀ | kpe],  v_h = c W_UV,hᵀ           W_UK | W_UV = kv_b_proj, per head
        h      = h + o_proj(softmax(q_h k_hᵀ · s) v_h)          s = qk_head_dim^-½ · mscale(factor, mscale_all_dim)²
        h      = h + mlp(rmsnorm(h))                           dense, or shared + routed experts (GLM-4.5's router)

The host caches ``c | kpe`` per token and decides how ``kv_b_proj`` is applied (see
:class:`atom_core.host.LatentAttentionSpec`).  The target skips the multi-token-prediction layers
(``num_nextn_predict_layers``) at load; the draft model of speculative decoding,
:class:`atom_core.models.deepseek_mtp.DeepSeekMTP`, loads them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import nn

from atom_core.config import DecoderConfig, text_config
from atom_core.host import Host, LatentAttentionSpec
from atom_core.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from atom_core.layers.norm import RMSNorm
from atom_core.layers.rotary import get_rope, table_length
from atom_core.loader import WeightMapper
from atom_core.loader.experts import with_experts
from atom_core.models.glm4_moe import RENAMES, Glm4MoeForCausalLM, mtp_layer_names
from atom_core.models.llama import DENSE_MAPPER, AttentionOptions, DecoderLayer, DecoderModel

# Llama's mapper without the q|k|v fusion: latent attention keeps its projections apart (q_proj included).
LATENT_MAPPER = dataclasses.replace(DENSE_MAPPER, packed={"gate_up_proj": DENSE_MAPPER.packed["gate_up_proj"]})


@dataclasses.dataclass(frozen=True)
class LatentDims:
    q_lora_rank: int | None  # None: a plain q_proj
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    rope_interleave: bool  # rotary pairs (x0, x1), (x2, x3), ... (DeepSeek's checkpoints) instead of NeoX halves

    @classmethod
    def from_hf(cls, text: Any) -> LatentDims:
        return cls(text.q_lora_rank or None, text.kv_lora_rank, text.qk_nope_head_dim, text.qk_rope_head_dim,
                   text.v_head_dim, bool(getattr(text, "rope_interleave", True)))


def yarn_softmax_scale(rope: dict[str, Any], qk_head_dim: int) -> float:
    """``qk_head_dim^-½``, times ``mscale(factor, mscale_all_dim)²`` under YaRN (DeepSeek's long-context scale)."""
    scale = qk_head_dim**-0.5
    factor, mscale_all_dim = rope.get("factor", 1.0), rope.get("mscale_all_dim") or 0
    if rope.get("rope_type", "default") != "default" and mscale_all_dim and factor > 1:
        scale *= (0.1 * mscale_all_dim * math.log(factor) + 1.0) ** 2
    return scale


class LatentAttention(nn.Module):
    def __init__(self, cfg: DecoderConfig, options: AttentionOptions, layer_id: int, *, host: Host, prefix: str):
        super().__init__()
        dims: LatentDims = options.latent
        heads = cfg.num_heads
        self.nope_dim, self.rope_dim, self.v_dim = dims.qk_nope_head_dim, dims.qk_rope_head_dim, dims.v_head_dim
        self.kv_lora_rank = dims.kv_lora_rank
        qk_dim = self.nope_dim + self.rope_dim
        bias = cfg.attention_bias
        if dims.q_lora_rank:
            self.q_a_proj = ReplicatedLinear(cfg.hidden_size, dims.q_lora_rank, bias=bias, host=host,
                                             prefix=f"{prefix}.q_a_proj")
            self.q_a_layernorm = RMSNorm(dims.q_lora_rank, cfg.rms_norm_eps)
            self.q_b_proj = ColumnParallelLinear(dims.q_lora_rank, [heads * qk_dim], host=host, prefix=f"{prefix}.q_b_proj")
        else:
            self.q_proj = ColumnParallelLinear(cfg.hidden_size, [heads * qk_dim], host=host, prefix=f"{prefix}.q_proj")
        self.kv_a_proj_with_mqa = ReplicatedLinear(cfg.hidden_size, self.kv_lora_rank + self.rope_dim, bias=bias,
                                                   host=host, prefix=f"{prefix}.kv_a_proj_with_mqa")
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, cfg.rms_norm_eps)
        self.kv_b_proj = ColumnParallelLinear(self.kv_lora_rank, [heads * (self.nope_dim + self.v_dim)], host=host,
                                              prefix=f"{prefix}.kv_b_proj")
        self.kv_b_proj.adapts_in_forward = False  # the host's latent attention reads its weight (W_UK | W_UV)
        self.o_proj = RowParallelLinear(heads * self.v_dim, cfg.hidden_size, bias=bias, host=host, prefix=f"{prefix}.o_proj")
        self.num_heads = self.kv_b_proj.out_partitions[0] // (self.nope_dim + self.v_dim)  # this rank's heads
        self.rotary_emb = get_rope(self.rope_dim, self.rope_dim, cfg.max_position, cfg.rope, is_neox=not dims.rope_interleave,
                                   length=table_length(host, cfg.max_position))
        spec = LatentAttentionSpec(self.kv_lora_rank, self.nope_dim, self.rope_dim, self.v_dim, self.kv_b_proj,
                                   sparse=self.sparse_selection(cfg, options, layer_id, host=host, prefix=prefix))
        self.attn = host.attention(f"{prefix}.attn", layer_id, self.num_heads, 1, qk_dim,
                                   yarn_softmax_scale(cfg.rope, qk_dim), mla=spec)

    def sparse_selection(self, cfg: DecoderConfig, options: AttentionOptions, layer_id: int, *, host: Host,
                         prefix: str):
        """The layer's :class:`atom_core.host.SparseSelectionSpec` (None: dense latent attention)."""
        return None

    def project(self, positions: torch.Tensor, x: torch.Tensor):
        """``(q [T, H * (nope + rope)], kv_c, k_pe, q_resid)``: the rotated query, latent and rope key, and the
        normalised q LoRA activation (None with a plain ``q_proj``)."""
        if hasattr(self, "q_proj"):
            q_resid, q = None, self.q_proj(x)
        else:
            q_resid = self.q_a_layernorm(self.q_a_proj(x))
            q = self.q_b_proj(q_resid)
        q = q.view(-1, self.num_heads, self.nope_dim + self.rope_dim)
        q_nope, q_pe = q.split([self.nope_dim, self.rope_dim], dim=-1)
        kv_c, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        kv_c = self.kv_a_layernorm(kv_c.contiguous())
        q_pe, k_pe = self.rotary_emb(positions, q_pe.reshape(q.shape[0], -1), k_pe.contiguous())
        q = torch.cat([q_nope, q_pe.view(q.shape[0], self.num_heads, self.rope_dim)], dim=-1)
        return q.view(q.shape[0], -1), kv_c, k_pe, q_resid

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, kv_c, k_pe, _ = self.project(positions, x)
        return self.o_proj(self.attn(q, kv_c, k_pe))


class LatentDecoderLayer(DecoderLayer):
    attention_class = LatentAttention


class LatentDecoderModel(DecoderModel):
    layer_class = LatentDecoderLayer


class DeepseekV3ForCausalLM(Glm4MoeForCausalLM):
    decoder_model_class = LatentDecoderModel
    weight_mapper = with_experts(LATENT_MAPPER, renames=RENAMES)

    def attention_options(self, cfg: Any) -> AttentionOptions:
        return AttentionOptions(qkv_bias=False, o_bias=False, latent=LatentDims.from_hf(text_config(cfg)))

    def mapper(self) -> WeightMapper:
        return with_experts(LATENT_MAPPER, renames=RENAMES, ignored=mtp_layer_names(text_config(self.config)))
