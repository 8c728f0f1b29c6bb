"""Qwen3.5 (dense and MoE): Qwen3-Next's hybrid decoder with interleaved multimodal rotary positions, fed
by Qwen3-VL's vision tower (without deepstack).

    image embeddings = visual(pixels)                                      (qwen3_vl_vision)
    h = embed(ids), image placeholder rows replaced by the image embeddings
    for each layer (config.layer_types):
        h = h + mixer(rmsnorm₀(h))      linear_attention: GatedDeltaNet (layers/gdn.py)
                                        full_attention:   o_proj(attn(mrope(q̂), mrope(k̂), v) ⊙ σ(gate))
        h = h + mlp(rmsnorm₀(h))        Qwen3.5: SwiGLU MLP; Qwen3.5-MoE: sparse MoE + σ-gated shared expert
    logits = lm_head(rmsnorm₀(h))

Positions are ``[3, T]`` (time, height, width; :mod:`atom_core.mrope_positions`); the rotation covers
``partial_rotary_factor`` (0.25: 64 of 256 dims) with ``mrope_section`` (11, 11, 10) interleaved, and runs
in one kernel with the zero-centred q/k norms (``atom_kernels.mrope``).  The checkpoint stores the GDN
projections separately (``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``: :data:`QWEN3_5_CHECKPOINT`);
they load into the same two fused GEMMs as Qwen3-Next's.  Multi-token-prediction weights (``mtp.*``) are
not used.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from atom_core.config import DecoderConfig, text_config
from atom_core.errors import UnsupportedConfigError
from atom_core.host import Host
from atom_core.layers.gdn import QWEN3_5_CHECKPOINT, packed_modules
from atom_core.layers.moe import RouterConfig, SparseMoeBlock
from atom_core.loader import WeightMapper
from atom_core.loader.experts import with_experts
from atom_core.loader.mapper import TIED_LM_HEAD
from atom_core.models.llama import DENSE_MAPPER, GatedMLP
from atom_core.models.qwen3_next import Qwen3NextModel
from atom_core.models.qwen3_vl import Qwen3VLForConditionalGeneration
from atom_core.models.qwen3_vl_vision import VisionModel

MAPPER = dataclasses.replace(
    DENSE_MAPPER,
    packed={**DENSE_MAPPER.packed, **packed_modules(QWEN3_5_CHECKPOINT)},
    renames=(*DENSE_MAPPER.renames, (r"\.patch_embed\.proj\.", ".patch_embed.")),
    ignored=(*DENSE_MAPPER.ignored, r"^mtp\."),
)
TIED_MAPPER = dataclasses.replace(MAPPER, tied=TIED_LM_HEAD)
MOE_MAPPER = with_experts(MAPPER)
TIED_MOE_MAPPER = with_experts(TIED_MAPPER)


def dense_mlp(hf_config: Any, cfg: DecoderConfig, layer_id: int, *, host: Host, prefix: str) -> nn.Module:
    return GatedMLP(cfg.hidden_size, cfg.intermediate_size, bias=False, host=host, prefix=prefix)


def moe_router(text: Any) -> RouterConfig:
    """Softmax top-k, always renormalised, weights in the activation dtype."""
    return RouterConfig(num_experts=text.num_experts, top_k=text.num_experts_per_tok, renormalize=True,
                        weights_in_input_dtype=True)


def sparse_moe(hf_config: Any, cfg: DecoderConfig, layer_id: int, *, host: Host, prefix: str) -> nn.Module:
    """Every layer: routed experts plus a σ-gated shared expert."""
    text = text_config(hf_config)
    shared = GatedMLP(cfg.hidden_size, text.shared_expert_intermediate_size, bias=False, host=host,
                      prefix=f"{prefix}.shared_expert")
    return SparseMoeBlock(cfg.hidden_size, moe_router(text), text.moe_intermediate_size, host=host, prefix=prefix,
                          shared_expert=shared, shared_expert_gate=True)


class Qwen3_5Model(nn.Module):
    """The checkpoint's ``model``: ``visual`` (Qwen3-VL's tower) and ``language_model`` (the hybrid decoder)."""

    build_mlp = staticmethod(dense_mlp)

    def __init__(self, hf_config: Any, cfg: DecoderConfig, *, host: Host, prefix: str):
        super().__init__()
        self.visual = VisionModel(hf_config.vision_config, host=host, prefix=f"{prefix}.visual", deepstack=False)

        def build_mlp(layer_id: int, mlp_prefix: str) -> nn.Module:
            return self.build_mlp(hf_config, cfg, layer_id, host=host, prefix=mlp_prefix)

        self.language_model = Qwen3NextModel(hf_config, cfg, host=host, prefix=f"{prefix}.language_model",
                                             build_mlp=build_mlp, gdn_checkpoint=QWEN3_5_CHECKPOINT)


class Qwen3_5MoeModel(Qwen3_5Model):
    build_mlp = staticmethod(sparse_moe)


class Qwen3_5ForConditionalGeneration(Qwen3VLForConditionalGeneration):
    """Qwen3-VL's multimodal interface (prompt positions, image embeddings, placeholder merging) over the
    hybrid decoder; the tower has no deepstack, so ``deepstack`` is always None."""

    weight_mapper = MAPPER
    model_class = Qwen3_5Model
    rope_defaults = {"mrope_section": [11, 11, 10]}  # transformers' Qwen3.5 rotary assumes these

    def mapper(self) -> WeightMapper:
        return TIED_MAPPER if self.decoder_config.tie_word_embeddings else MAPPER

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None, deepstack: Any = None) -> torch.Tensor:
        if deepstack is not None:
            raise UnsupportedConfigError(f"{type(self).__name__} has no deepstack layers, got deepstack inputs")
        return self.model.language_model(input_ids, positions, inputs_embeds)


class Qwen3_5MoeForConditionalGeneration(Qwen3_5ForConditionalGeneration):
    weight_mapper = MOE_MAPPER
    model_class = Qwen3_5MoeModel

    def mapper(self) -> WeightMapper:
        return TIED_MOE_MAPPER if self.decoder_config.tie_word_embeddings else MOE_MAPPER
