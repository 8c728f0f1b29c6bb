"""gpt-oss (20b / 120b): attention with sinks, alternating sliding-window / full layers, MoE with biases.

    h  = embed(ids)
    for each layer (``layer_types``: sliding_attention (window ``sliding_window``) / full_attention):
        h = h + o_proj(attn(rope(q), rope(k), v; sinks))    q, k, v = qkv_proj(rmsnorm(h)), all with biases
            attn: per head, softmax over [q·kᵀ/√d, sink] with the sink column dropped after it (YaRN rope)
        h = h + Σ_j w_j · expert_{e_j}(x)                    x = rmsnorm(h)
            e, l = top-k of x Wᵣᵀ + bᵣ;  w = softmax(l)         (softmax over the k chosen logits)
            expert(x) = W2 ((u + 1) · g·σ(1.702 g)) + b2         g = min(gate, 7), u = clamp(up, -7, 7),
                                                                 gate | up = W13 x + b13
    logits = lm_head(rmsnorm(h))

Checkpoints keep the experts stacked: ``mlp.experts.gate_up_proj`` ``[E, H, 2I]`` (in x out, gate and up
columns interleaved: gate = even, up = odd) with ``gate_up_proj_bias`` ``[E, 2I]`` (interleaved too),
``down_proj`` ``[E, I, H]`` and ``down_proj_bias`` ``[E, H]``; the published ``quant_method: mxfp4``
checkpoints hold ``gate_up_proj_blocks`` ``[E, 2I, H/32, 16]`` / ``gate_up_proj_scales`` ``[E, 2I, H/32]``
(rows interleaved) and ``down_proj_blocks`` / ``down_proj_scales`` instead of the weights.
:func:`per_expert_tensors` turns all of them into the per-expert projections (gate rows, then up rows)
the MoE layer loads (the model's ``checkpoint_tensors``), so bf16, MXFP4 and ``atom quantize`` output (Quark,
per expert: ``atom quantize`` reads the checkpoint through the same function) share one path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from atom_core.config import DecoderConfig, text_config
from atom_core.errors import CheckpointError, UnsupportedConfigError
from atom_core.host import Host
from atom_core.layers.moe import FusedMoE, Router, RouterConfig
from atom_core.layers.params import materialize
from atom_core.loader import WeightMapper
from atom_core.loader.experts import with_experts
from atom_core.models.llama import DENSE_MAPPER, AttentionOptions, LlamaForCausalLM
from atom_core.quant.mxfp4 import gpt_oss_expert_layout

SWIGLU = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}  # the activation atom_kernels.fused_moe implements
GPT_OSS_MAPPER = with_experts(DENSE_MAPPER)

_STACKED = re.compile(r"^(?P<module>(?:.*\.)?experts)\.(?P<tensor>gate_up_proj|down_proj)(?P<kind>|_bias|_blocks|_scales)$")


class GptOssMoE(nn.Module):
    """Router with a bias, softmax over the top-k logits, experts with biases and the clamped SwiGLU."""

    def __init__(self, hidden_size: int, text: Any, *, host: Host, prefix: str):
        super().__init__()
        # softmax over all logits renormalised over the top k = softmax over the top-k logits
        config = RouterConfig(num_experts=text.num_local_experts, top_k=text.num_experts_per_tok, renormalize=True,
                              weights_in_input_dtype=True, bias=True)
        self.router = Router(hidden_size, config)
        self.experts = FusedMoE(text.num_local_experts, hidden_size, text.intermediate_size, host=host,
                                prefix=f"{prefix}.experts", activation="swigluoai", bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        topk_weights, topk_ids = self.router(x)
        return self.experts(x, topk_weights, topk_ids)


def per_expert_tensors(weights: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """gpt-oss' stacked expert tensors as per-expert ``experts.<e>.<gate|up|down>_proj.<weight|bias|weight_scale>``
    (gate = even rows/columns of the interleaved gate|up, up = odd); every other tensor passes unchanged."""
    blocks: dict[str, Any] = {}
    for name, tensor in weights:
        match = _STACKED.match(name)
        if match is None:
            yield name, tensor
            continue
        module, proj, kind = match["module"], match["tensor"], match["kind"]
        if kind in ("_blocks", "_scales"):  # MXFP4: a projection's blocks and scales convert together
            key = f"{module}.{proj}"
            blocks.setdefault(key, {})[kind] = tensor
            if len(blocks[key]) < 2:
                continue
            packed, scales = gpt_oss_expert_layout(materialize(blocks[key]["_blocks"]),
                                                   materialize(blocks.pop(key)["_scales"]))
            yield from _split(module, proj, "weight", packed)
            yield from _split(module, proj, "weight_scale", scales)
            continue
        t = materialize(tensor)
        if kind == "_bias":
            yield from _split(module, proj, "bias", t)
        else:  # bf16 weights are stored in x out: transpose to out x in
            yield from _split(module, proj, "weight", t.transpose(1, 2))
    if blocks:
        raise CheckpointError(f"gpt-oss MXFP4 experts with *_blocks or *_scales missing: {', '.join(sorted(blocks))}")


def _split(module: str, proj: str, suffix: str, t: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """Per-expert slices of a stacked ``[E, out, ...]`` tensor (gate_up: even rows gate, odd rows up)."""
    for e in range(t.shape[0]):
        if proj == "gate_up_proj":
            yield f"{module}.{e}.gate_proj.{suffix}", t[e, 0::2]
            yield f"{module}.{e}.up_proj.{suffix}", t[e, 1::2]
        else:
            yield f"{module}.{e}.down_proj.{suffix}", t[e]


class GptOssForCausalLM(LlamaForCausalLM):
    weight_mapper = GPT_OSS_MAPPER

    def __init__(self, hf_config: Any, host: Host, prefix: str = ""):
        text = text_config(hf_config)
        for key, value in SWIGLU.items():
            if getattr(text, key, value) != value:
                raise UnsupportedConfigError(f"gpt-oss {key} = {getattr(text, key)!r}: ATOM's experts implement {value}")
        super().__init__(hf_config, host, prefix)

    def attention_options(self, cfg: Any) -> AttentionOptions:
        return AttentionOptions(qkv_bias=True, o_bias=True, sinks=True)

    def build_mlp(self, hf_config: Any, cfg: DecoderConfig, layer_id: int, *, host: Host, prefix: str) -> nn.Module:
        return GptOssMoE(cfg.hidden_size, text_config(hf_config), host=host, prefix=prefix)

    checkpoint_tensors = staticmethod(per_expert_tensors)

    def mapper(self) -> WeightMapper:
        return GPT_OSS_MAPPER
