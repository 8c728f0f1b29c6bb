"""Qwen3-Next: a hybrid decoder of Gated DeltaNet (linear attention) and gated full-attention layers,
with sparse MoE MLPs.

    h = embed(ids)
    for each layer (config.layer_types, or full_attention_interval: "linear_attention" or "full_attention"):
        h = h + mixer(rmsnorm₀(h))          linear_attention: GatedDeltaNet (layers/gdn.py)
                                            full_attention:   o_proj(attn(rope(q̂), rope(k̂), v) ⊙ σ(gate))
        h = h + mlp(rmsnorm₀(h))            sparse MoE + σ-gated shared expert (dense in mlp_only_layers)
    logits = lm_head(rmsnorm₀(h))

rmsnorm₀ is the zero-centred RMSNorm (weight stored as w - 1).  Full attention: ``q_proj`` emits, per
head, q then an output gate; q̂ and k̂ are per-head zero-centred RMSNorms; rotary covers
``partial_rotary_factor`` (0.25) of the head dim.  Multi-token-prediction weights (``mtp.*``) belong to the
draft model (:mod:`atom_core.models.qwen3_next_mtp`) and are skipped here.

The decoder is shared with Qwen3.5 (:mod:`atom_core.models.qwen3_5`), which passes its own MLPs
(``build_mlp``), its GDN checkpoint layout and multimodal rotary positions (then the q/k norms run inside
the MRoPE kernel).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from atom_core.config import DecoderConfig, hybrid_layer_types, text_config
from atom_core.errors import UnsupportedConfigError
from atom_core.host import Host
from atom_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from atom_core.layers.gdn import QWEN3_NEXT_CHECKPOINT, GatedDeltaNet, GDNConfig, PackedTensor
from atom_core.layers.linear import QKVParallelLinear, RowParallelLinear
from atom_core.layers.moe import SparseMoeBlock
from atom_core.layers.norm import RMSNorm
from atom_core.layers.rotary import get_rope, table_length
from atom_core.loader.experts import with_experts
from atom_core.loader.mapper import TIED_LM_HEAD
from atom_core.models.base import CausalLM
from atom_core.models.llama import DENSE_MAPPER, GatedMLP, MLPBuilder, _join
from atom_core.models.qwen_moe import is_sparse_layer, qwen_router

MAPPER = with_experts(DENSE_MAPPER, ignored=(r"^mtp\.",))
LINEAR_ATTENTION, FULL_ATTENTION = "linear_attention", "full_attention"


class GatedAttention(nn.Module):
    """Full attention with a sigmoid output gate.  ``q_proj`` holds, per head, q then the gate: fused
    into ``qkv_proj`` as 2·num_heads "heads" of head_dim, so tensor parallelism keeps each pair together."""

    def __init__(self, cfg: DecoderConfig, layer_id: int, *, host: Host, prefix: str):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, cfg.head_dim, 2 * cfg.num_heads, cfg.num_kv_heads,
                                          bias=cfg.attention_bias, host=host, prefix=f"{prefix}.qkv_proj")
        self.num_heads = self.qkv_proj.num_heads // 2
        self.o_proj = RowParallelLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.attention_bias, host=host,
                                        prefix=f"{prefix}.o_proj")
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, zero_centered=True)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, zero_centered=True)
        self.rotary_emb = get_rope(cfg.head_dim, cfg.rotary_dim, cfg.max_position, cfg.rope,
                                   length=table_length(host, cfg.max_position))
        self.attn = host.attention(f"{prefix}.attn", layer_id, self.num_heads, self.qkv_proj.num_kv_heads, cfg.head_dim,
                                   cfg.head_dim**-0.5)

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        T, D = x.shape[0], self.head_dim
        q_gate, k, v = self.qkv_proj.split(self.qkv_proj(x))
        q_gate = q_gate.view(T, self.num_heads, 2, D)
        q, gate = q_gate[:, :, 0], q_gate[:, :, 1]
        q, k = self.rotary_emb(positions, q, k, self.q_norm, self.k_norm)  # norms fused; q in place beside its gate
        out = self.attn(q.reshape(T, -1), k, v) * torch.sigmoid(gate.reshape(T, -1))
        return self.o_proj(out)


def qwen3_next_mlp(hf_config: Any, cfg: DecoderConfig, layer_id: int, *, host: Host, prefix: str) -> nn.Module:
    """Sparse MoE with a σ-gated shared expert, or a dense MLP in ``mlp_only_layers``."""
    text = text_config(hf_config)
    if not is_sparse_layer(text, layer_id):
        return GatedMLP(cfg.hidden_size, cfg.intermediate_size, bias=False, host=host, prefix=prefix)
    shared = GatedMLP(cfg.hidden_size, text.shared_expert_intermediate_size, bias=False, host=host,
                      prefix=f"{prefix}.shared_expert")
    return SparseMoeBlock(cfg.hidden_size, qwen_router(text), text.moe_intermediate_size, host=host, prefix=prefix,
                          shared_expert=shared, shared_expert_gate=True)


class Qwen3NextDecoderLayer(nn.Module):
    def __init__(self, hf_config: Any, cfg: DecoderConfig, layer_id: int, *, host: Host, prefix: str,
                 build_mlp: MLPBuilder, gdn_checkpoint: dict[str, PackedTensor] = QWEN3_NEXT_CHECKPOINT,
                 layer_type: str | None = None):
        """``layer_type``: the mixer kind, by default the config's for ``layer_id`` (the MTP draft's layers,
        past the config's layers, are full attention)."""
        super().__init__()
        text = text_config(hf_config)
        self.layer_type = layer_type or hybrid_layer_types(text)[layer_id]
        if self.layer_type == LINEAR_ATTENTION:
            self.linear_attn = GatedDeltaNet(GDNConfig.from_hf(hf_config), layer_id, host=host, prefix=f"{prefix}.linear_attn",
                                             checkpoint=gdn_checkpoint)
        elif self.layer_type == FULL_ATTENTION:
            self.self_attn = GatedAttention(cfg, layer_id, host=host, prefix=f"{prefix}.self_attn")
        else:
            raise UnsupportedConfigError(f"{prefix}: layer type {self.layer_type!r} is not supported")
        self.mlp = build_mlp(layer_id, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, zero_centered=True)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, zero_centered=True)

    def forward(self, positions: torch.Tensor, h: torch.Tensor, residual: torch.Tensor | None):
        if residual is None:
            x, residual = self.input_layernorm(h), h
        else:
            x, residual = self.input_layernorm(h, residual)
        x = self.linear_attn(x) if self.layer_type == LINEAR_ATTENTION else self.self_attn(positions, x)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class Qwen3NextModel(nn.Module):
    """The hybrid decoder; ``build_mlp(layer_id, prefix)`` makes each layer's MLP (Qwen3-Next's by default)."""

    def __init__(self, hf_config: Any, cfg: DecoderConfig, *, host: Host, prefix: str, build_mlp: MLPBuilder | None = None,
                 gdn_checkpoint: dict[str, PackedTensor] = QWEN3_NEXT_CHECKPOINT):
        super().__init__()
        if build_mlp is None:
            def build_mlp(layer_id: int, mlp_prefix: str) -> nn.Module:
                return qwen3_next_mlp(hf_config, cfg, layer_id, host=host, prefix=mlp_prefix)
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, host=host)
        self.layers = nn.ModuleList(
            Qwen3NextDecoderLayer(hf_config, cfg, i, host=host, prefix=f"{prefix}.layers.{i}", build_mlp=build_mlp,
                                  gdn_checkpoint=gdn_checkpoint)
            for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, zero_centered=True)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, inputs_embeds: torch.Tensor | None = None):
        h = inputs_embeds if inputs_embeds is not None else self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            h, residual = layer(positions, h, residual)
        h, _ = self.norm(h, residual)
        return h


class Qwen3NextForCausalLM(CausalLM):
    weight_mapper = MAPPER

    def __init__(self, hf_config: Any, host: Host, prefix: str = ""):
        super().__init__(hf_config, host)
        self.config = hf_config
        cfg = DecoderConfig.from_hf(hf_config)
        self.decoder_config = cfg
        self.model = Qwen3NextModel(hf_config, cfg, host=host, prefix=_join(prefix, "model"))
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, host=host)
        if cfg.tie_word_embeddings:
            self.lm_head.tie_to(self.model.embed_tokens)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, inputs_embeds: torch.Tensor | None = None):
        return self.model(input_ids, positions, inputs_embeds=inputs_embeds)

    def mapper(self):
        if self.decoder_config.tie_word_embeddings:
            return dataclasses.replace(with_experts(DENSE_MAPPER, ignored=(r"^mtp\.",)), tied=TIED_LM_HEAD)
        return MAPPER
