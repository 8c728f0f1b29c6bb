"""Mixtral: Mistral's attention (optionally sliding-window) with a sparse MoE block in every layer.

    weights, ids = top-k of softmax(x Wᵣᵀ), renormalised
    y = Σ_j weights_j · expert_{ids_j}(x)         experts: SwiGLU MLPs (w1 gate, w3 up, w2 down)

Checkpoints name the block ``block_sparse_moe`` and the expert projections ``w1``/``w3``/``w2``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from atom_core.config import DecoderConfig, text_config
from atom_core.host import Host
from atom_core.layers.moe import RouterConfig, SparseMoeBlock
from atom_core.loader import WeightMapper
from atom_core.loader.experts import with_experts
from atom_core.models.llama import DENSE_MAPPER, TIED_DENSE_MAPPER, LlamaForCausalLM

RENAMES = ((r"\.block_sparse_moe\.", ".mlp."),)
MIXTRAL_MAPPER = with_experts(DENSE_MAPPER, renames=RENAMES)
TIED_MIXTRAL_MAPPER = with_experts(TIED_DENSE_MAPPER, renames=RENAMES)


class MixtralForCausalLM(LlamaForCausalLM):
    weight_mapper = MIXTRAL_MAPPER

    def build_mlp(self, hf_config: Any, cfg: DecoderConfig, layer_id: int, *, host: Host, prefix: str) -> nn.Module:
        text = text_config(hf_config)
        router = RouterConfig(num_experts=text.num_local_experts, top_k=text.num_experts_per_tok, renormalize=True)
        return SparseMoeBlock(cfg.hidden_size, router, cfg.intermediate_size, host=host, prefix=prefix)

    def mapper(self) -> WeightMapper:
        return TIED_MIXTRAL_MAPPER if self.decoder_config.tie_word_embeddings else MIXTRAL_MAPPER
