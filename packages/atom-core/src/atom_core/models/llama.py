"""The Llama family of dense decoders: Llama, Mistral, Qwen2 (q/k/v bias), Qwen3 (per-head q/k norm).

    h  = embed(ids)
    for each layer:
        h = h + o_proj(attn(rope(q), rope(k), v))      q, k, v = qkv_proj(rmsnorm(h))
        h = h + down_proj(silu(gate) · up)             gate, up = gate_up_proj(rmsnorm(h))
    logits = lm_head(rmsnorm(h))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from atom_core.config import DecoderConfig
from atom_core.host import Host
from atom_core.layers.activation import SiluAndMul
from atom_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from atom_core.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from atom_core.layers.norm import RMSNorm
from atom_core.layers.params import copy_checked, make_param, materialize
from atom_core.layers.rotary import get_rope, table_length
from atom_core.loader import WeightMapper
from atom_core.loader.mapper import TIED_LM_HEAD
from atom_core.models.base import CausalLM


@dataclasses.dataclass(frozen=True)
class AttentionOptions:
    """How a family's attention differs from Llama's."""

    qkv_bias: bool
    o_bias: bool
    qk_norm: bool = False
    sinks: bool = False  # one learned "sink" logit per head joins each softmax (gpt-oss)
    latent: Any = None  # multi-head latent attention's dimensions (DeepSeek-V3: models.deepseek_v3.LatentDims)


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, *, bias: bool, host: Host, prefix: str):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size] * 2, bias=bias, host=host, prefix=f"{prefix}.gate_up_proj"
        )
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=bias, host=host, prefix=f"{prefix}.down_proj")
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig, options: AttentionOptions, layer_id: int, *, host: Host, prefix: str):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(
            cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads,
            bias=options.qkv_bias, host=host, prefix=f"{prefix}.qkv_proj",
        )
        self.o_proj = RowParallelLinear(
            cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=options.o_bias, host=host, prefix=f"{prefix}.o_proj"
        )
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if options.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps) if options.qk_norm else None
        self.rotary_emb = get_rope(cfg.head_dim, cfg.rotary_dim, cfg.max_position, cfg.rope,
                                   length=table_length(host, cfg.max_position))
        heads = self.qkv_proj.num_heads
        self.sinks = None
        if options.sinks:
            self.sinks = make_param((heads,), host.attention_sinks_dtype, weight_loader=head_slice_loader(host.tp.rank * heads))
        self.attn = host.attention(
            f"{prefix}.attn", layer_id, heads, self.qkv_proj.num_kv_heads, cfg.head_dim,
            cfg.head_dim**-0.5, sliding_window=cfg.sliding_windows[layer_id], sinks=self.sinks,
        )

    def forward(self, positions: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        q, k = self.rotary_emb(positions, q, k, self.q_norm, self.k_norm)  # Qwen3: per-head norms, fused
        return self.o_proj(self.attn(q, k, v))


def head_slice_loader(start: int):
    """Loads this rank's ``[start, start + heads)`` slice of a per-head checkpoint vector (attention sinks)."""

    def load(param: nn.Parameter, loaded, shard_id=None) -> None:
        copy_checked(param.data, materialize(loaded)[start : start + param.shape[0]])

    return load


# (layer id, module prefix) -> the layer's MLP (dense, or a mixture of experts)
MLPBuilder = Callable[[int, str], nn.Module]


class DecoderLayer(nn.Module):
    attention_class: type[Attention] = Attention  # a family with its own attention subclasses the layer

    def __init__(self, cfg: DecoderConfig, options: AttentionOptions, layer_id: int, *, host: Host, prefix: str,
                 build_mlp: MLPBuilder | None = None):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = self.attention_class(cfg, options, layer_id, host=host, prefix=f"{prefix}.self_attn")
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        if build_mlp is not None:
            self.mlp = build_mlp(layer_id, f"{prefix}.mlp")
        else:
            self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias, host=host, prefix=f"{prefix}.mlp")

    def forward(self, positions: torch.Tensor, h: torch.Tensor, residual: torch.Tensor | None):
        if residual is None:
            x, residual = self.input_layernorm(h), h
        else:
            x, residual = self.input_layernorm(h, residual)
        x = self.self_attn(positions, x)
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class DecoderModel(nn.Module):
    layer_class: type[DecoderLayer] = DecoderLayer

    def __init__(self, cfg: DecoderConfig, options: AttentionOptions, *, host: Host, prefix: str,
                 build_mlp: MLPBuilder | None = None):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, host=host)
        self.layers = nn.ModuleList(
            self.layer_class(cfg, options, i, host=host, prefix=f"{prefix}.layers.{i}", build_mlp=build_mlp)
            for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        # layers whose input hidden state forward also returns (an EAGLE-3 draft reads them); empty: none
        self.aux_hidden_state_layers: tuple[int, ...] = ()

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, inputs_embeds: torch.Tensor | None = None):
        """The final hidden states; with ``aux_hidden_state_layers`` set, ``(final, [the residual stream entering
        each of those layers])`` (layer 0's is the token embedding), as vLLM's EAGLE-3 targets return them."""
        h = inputs_embeds if inputs_embeds is not None else self.embed_tokens(input_ids)
        residual = None
        aux = []
        for i, layer in enumerate(self.layers):
            if i in self.aux_hidden_state_layers:
                aux.append(h if residual is None else h + residual)
            h, residual = layer(positions, h, residual)
        h, _ = self.norm(h, residual)
        return (h, aux) if self.aux_hidden_state_layers else h


DENSE_MAPPER = WeightMapper(
    packed={
        "qkv_proj": [("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")],
        "gate_up_proj": [("gate_proj", 0), ("up_proj", 1)],
    },
)
TIED_DENSE_MAPPER = dataclasses.replace(DENSE_MAPPER, tied=TIED_LM_HEAD)


class LlamaForCausalLM(CausalLM):
    weight_mapper = DENSE_MAPPER
    decoder_model_class: type[DecoderModel] = DecoderModel  # a family with its own layers subclasses the model

    def attention_options(self, cfg: Any) -> AttentionOptions:
        bias = bool(getattr(cfg, "attention_bias", False))
        return AttentionOptions(qkv_bias=bias, o_bias=bias)

    def build_mlp(self, hf_config: Any, cfg: DecoderConfig, layer_id: int, *, host: Host, prefix: str) -> nn.Module:
        """The MLP of layer ``layer_id`` (mixture-of-experts families override this)."""
        return GatedMLP(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias, host=host, prefix=prefix)

    def __init__(self, hf_config: Any, host: Host, prefix: str = ""):
        super().__init__(hf_config, host)
        self.config = hf_config
        cfg = DecoderConfig.from_hf(hf_config)
        self.decoder_config = cfg
        self.model = self.decoder_model_class(
            cfg, self.attention_options(hf_config), host=host, prefix=_join(prefix, "model"),
            build_mlp=lambda layer_id, mlp_prefix: self.build_mlp(hf_config, cfg, layer_id, host=host, prefix=mlp_prefix),
        )
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, host=host)
        if cfg.tie_word_embeddings:
            self.lm_head.tie_to(self.model.embed_tokens)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, inputs_embeds: torch.Tensor | None = None):
        return self.model(input_ids, positions, inputs_embeds=inputs_embeds)

    def mapper(self) -> WeightMapper:
        return TIED_DENSE_MAPPER if self.decoder_config.tie_word_embeddings else DENSE_MAPPER

    def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        """Make ``forward`` return ``(hidden, [input of layer i for i in layers])`` (empty: the hidden states only)."""
        self.model.aux_hidden_state_layers = tuple(layers)

    def get_eagle3_aux_hidden_state_layers(self) -> tuple[int, ...]:
        """The layers an EAGLE-3 draft reads when its config names none: low, middle, high (vLLM's default)."""
        n = self.decoder_config.num_layers
        return (2, n // 2, n - 3)


class MistralForCausalLM(LlamaForCausalLM):
    """Llama with (optionally) sliding-window attention, read from the config."""


class Qwen2ForCausalLM(LlamaForCausalLM):
    def attention_options(self, cfg: Any) -> AttentionOptions:
        return AttentionOptions(qkv_bias=True, o_bias=False)


class Qwen3ForCausalLM(LlamaForCausalLM):
    def attention_options(self, cfg: Any) -> AttentionOptions:
        bias = bool(getattr(cfg, "attention_bias", False))
        return AttentionOptions(qkv_bias=bias, o_bias=bias, qk_norm=True)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name
