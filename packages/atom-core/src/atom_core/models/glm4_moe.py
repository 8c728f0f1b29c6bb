"""GLM-4.5 / GLM-4.6 (``Glm4MoeForCausalLM``): Llama-style attention with q/k/v bias (optional per-head
q/k RMSNorm, rotary on the first ``partial_rotary_factor`` of each head), dense MLPs in the first
``first_k_dense_replace`` layers and DeepSeek-V3-style MoE blocks after:

    s = sigmoid(x Wᵣᵀ)                                     (fp32)
    ids = top-k of s + correction_bias, among the topk_group best of n_group groups
    weights = s[ids] / Σ s[ids] · routed_scaling_factor    (renormalised when norm_topk_prob)
    y = Σ_j weights_j · expert_{ids_j}(x) + shared_experts(x)

Real checkpoints carry a multi-token-prediction layer after the last decoder layer
(``model.layers.<num_hidden_layers>.*``); ATOM does not run it and skips its tensors.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from atom_core.config import DecoderConfig, text_config
from atom_core.host import Host
from atom_core.layers.moe import RouterConfig, SparseMoeBlock
from atom_core.loader import WeightMapper
from atom_core.loader.experts import with_experts
from atom_core.models.llama import DENSE_MAPPER, TIED_DENSE_MAPPER, AttentionOptions, GatedMLP, LlamaForCausalLM

RENAMES = ((r"\.mlp\.shared_experts\.", ".mlp.shared_expert."),)


def glm_router(cfg: Any) -> RouterConfig:
    return RouterConfig(
        num_experts=cfg.n_routed_experts, top_k=cfg.num_experts_per_tok, scoring="sigmoid",
        renormalize=bool(cfg.norm_topk_prob), n_group=cfg.n_group or 1, topk_group=cfg.topk_group or 1,
        routed_scaling_factor=cfg.routed_scaling_factor, correction_bias=True, fp32_logits=True,
    )


def mtp_layer_names(cfg: Any) -> tuple[str, ...]:
    """Regexes of the multi-token-prediction layers' tensors (indices past the decoder layers)."""
    first = cfg.num_hidden_layers
    count = getattr(cfg, "num_nextn_predict_layers", None) or 0
    return tuple(rf"^model\.layers\.{first + i}\." for i in range(count))


class Glm4MoeForCausalLM(LlamaForCausalLM):
    weight_mapper = with_experts(DENSE_MAPPER, renames=RENAMES)

    def attention_options(self, cfg: Any) -> AttentionOptions:
        return AttentionOptions(qkv_bias=bool(cfg.attention_bias), o_bias=False, qk_norm=bool(getattr(cfg, "use_qk_norm", False)))

    def build_mlp(self, hf_config: Any, cfg: DecoderConfig, layer_id: int, *, host: Host, prefix: str) -> nn.Module:
        text = text_config(hf_config)
        if layer_id < text.first_k_dense_replace:
            return super().build_mlp(hf_config, cfg, layer_id, host=host, prefix=prefix)
        shared = None
        if text.n_shared_experts:
            shared = GatedMLP(cfg.hidden_size, text.moe_intermediate_size * text.n_shared_experts, bias=False, host=host,
                              prefix=f"{prefix}.shared_expert")
        return SparseMoeBlock(cfg.hidden_size, glm_router(text), text.moe_intermediate_size, host=host, prefix=prefix,
                              shared_expert=shared)

    def mapper(self) -> WeightMapper:
        base = TIED_DENSE_MAPPER if self.decoder_config.tie_word_embeddings else DENSE_MAPPER
        return with_experts(base, renames=RENAMES, ignored=mtp_layer_names(text_config(self.config)))
