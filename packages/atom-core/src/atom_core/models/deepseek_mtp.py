"""DeepSeek-V3 / R1 multi-token prediction (MTP): the draft model of speculative decoding, built from the layers a
checkpoint carries past its decoder (``model.layers.<num_hidden_layers + i>``, ``num_nextn_predict_layers`` of them).

    per MTP layer, at position p (the target's hidden state h_p, the token t_{p+1} that follows it):
        e   = embed(t_{p+1})                  zero at position 0 (``zero_first_embedding``)
        x   = eh_proj([rmsnorm_e(e) | rmsnorm_h(h_p)])           eh_proj: [H, 2H]
        y   = decoder_layer(x) + its residual                    latent attention over the layer's own KV cache
        logits = shared_head.head(shared_head.norm(y))           a guess at t_{p+2}

``h_p`` is the target's last hidden state (after its final norm); a second draft step takes the layer's own
``shared_head.norm(y)`` in its place (as vLLM's and SGLang's MTP layers recycle it).  Draft step ``k`` runs layer
``k mod num_nextn_predict_layers``.  The token embedding is the target's (``model.embed_tokens``); the copy DeepSeek
stores in each MTP layer (``model.layers.<n>.embed_tokens``) is equal to it and is skipped.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from atom_core.config import DecoderConfig, text_config
from atom_core.errors import UnsupportedConfigError
from atom_core.host import Host
from atom_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from atom_core.layers.linear import ReplicatedLinear
from atom_core.layers.norm import RMSNorm
from atom_core.loader import WeightMapper
from atom_core.loader.experts import with_experts
from atom_core.models.base import CausalLM
from atom_core.models.deepseek_v3 import LATENT_MAPPER, DeepseekV3ForCausalLM, LatentDecoderLayer
from atom_core.models.glm4_moe import RENAMES

# a decoder layer's modules inside an MTP layer: ``model.layers.<n>.<module>`` -> ``model.layers.<n>.mtp_block.<module>``
BLOCK_MODULES = ("self_attn", "mlp", "input_layernorm", "post_attention_layernorm")
MTP_RENAMES = ((rf"^(model\.layers\.\d+)\.({'|'.join(BLOCK_MODULES)})\.", r"\1.mtp_block.\2."),)


def mtp_layer_ids(cfg: Any) -> list[int]:
    """The checkpoint layer indices of the MTP layers; a config without any is an :class:`UnsupportedConfigError`."""
    count = getattr(cfg, "num_nextn_predict_layers", None) or 0
    if count < 1:
        raise UnsupportedConfigError("config.json: num_nextn_predict_layers is missing or 0: the checkpoint has no "
                                     "multi-token-prediction layer to draft with")
    return [cfg.num_hidden_layers + i for i in range(count)]


class SharedHead(nn.Module):
    def __init__(self, cfg: DecoderConfig, *, host: Host):
        super().__init__()
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, host=host)


class MTPLayer(nn.Module):
    def __init__(self, block: nn.Module, cfg: DecoderConfig, *, host: Host, prefix: str):
        super().__init__()
        self.enorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hnorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.eh_proj = ReplicatedLinear(2 * cfg.hidden_size, cfg.hidden_size, bias=False, host=host,
                                        prefix=f"{prefix}.eh_proj")
        self.shared_head = SharedHead(cfg, host=host)
        self.mtp_block = block

    def forward(self, positions: torch.Tensor, embeds: torch.Tensor, previous_hidden: torch.Tensor,
                zero_first_embedding: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        if zero_first_embedding:
            embeds = embeds.masked_fill((positions == 0)[:, None], 0.0)
        x = self.eh_proj(torch.cat([self.enorm(embeds), self.hnorm(previous_hidden)], dim=-1))
        y, residual = self.mtp_block(positions, x, None)
        y = y + residual
        return y, self.shared_head.norm(y)


class MTPModel(nn.Module):
    def __init__(self, layers: dict[str, MTPLayer], cfg: DecoderConfig, *, host: Host):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, host=host)
        self.layers = nn.ModuleDict(layers)


class DeepSeekMTP(DeepseekV3ForCausalLM):
    """The MTP layers of a ``DeepseekV3ForCausalLM`` checkpoint as a draft model (vLLM's ``DeepSeekMTPModel``).

    ``forward(input_ids, positions, previous_hidden, step)`` returns ``(y, shared_head.norm(y))``: the hidden states
    ``compute_logits(y, step)`` turns into the draft's logits, and the ones the next draft step takes as
    ``previous_hidden`` (the pair vLLM's and SGLang's drafters expect of ``DeepSeekMTPModel``).  It shares its host
    (and so the KV-cache slots of each position) with the target: the native runner builds both over one host.

    ``zero_first_embedding``: the token embedding at position 0 is zeroed, as vLLM's MTP layer does; SGLang's does not
    (its adapter turns it off)."""

    zero_first_embedding = True

    def __init__(self, hf_config: Any, host: Host, prefix: str = ""):
        CausalLM.__init__(self, hf_config, host)  # the target's decoder is not built: only the MTP layers
        self.config = hf_config
        text = text_config(hf_config)
        cfg = DecoderConfig.from_hf(hf_config)
        self.decoder_config = cfg
        self.layer_ids = mtp_layer_ids(text)
        options = self.attention_options(hf_config)
        model_prefix = f"{prefix}.model" if prefix else "model"
        layers = {}
        for layer_id in self.layer_ids:
            layer_prefix = f"{model_prefix}.layers.{layer_id}"
            block = LatentDecoderLayer(
                cfg, options, layer_id, host=host, prefix=f"{layer_prefix}.mtp_block",
                build_mlp=lambda lid, mlp_prefix: self.build_mlp(hf_config, cfg, lid, host=host, prefix=mlp_prefix))
            layers[str(layer_id)] = MTPLayer(block, cfg, host=host, prefix=layer_prefix)
        self.model = MTPModel(layers, cfg, host=host)

    def _layer(self, step: int) -> MTPLayer:
        return self.model.layers[str(self.layer_ids[step % len(self.layer_ids)])]

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, previous_hidden: torch.Tensor,
                step: int = 0, inputs_embeds: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        embeds = inputs_embeds if inputs_embeds is not None else self.model.embed_tokens(input_ids)
        return self._layer(step)(positions, embeds, previous_hidden, self.zero_first_embedding)

    def compute_logits(self, hidden: torch.Tensor, step: int = 0) -> torch.Tensor:
        head = self._layer(step).shared_head
        return head.head.compute_logits(head.norm(hidden))

    def mapper(self) -> WeightMapper:
        text = text_config(self.config)
        target = tuple(rf"^model\.layers\.{i}\." for i in range(text.num_hidden_layers))
        copies = tuple(rf"^model\.layers\.{i}\.embed_tokens\." for i in self.layer_ids)
        return with_experts(LATENT_MAPPER, renames=(*RENAMES, *MTP_RENAMES),
                            ignored=(*target, *copies, r"^model\.norm\.", r"^lm_head\."))
