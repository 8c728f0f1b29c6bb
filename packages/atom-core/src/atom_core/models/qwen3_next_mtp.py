"""Qwen3-Next multi-token prediction (MTP): the draft model of speculative decoding, built from the ``mtp.*`` tensors
a Qwen3-Next checkpoint carries beside its decoder (``num_nextn_predict_layers`` layers; transformers models none).

    at position p (the target's hidden state h_p after its final norm, the token t_{p+1} that follows it):
        e = embed(t_{p+1})
        x = fc([rmsnorm₀_e(e) ; rmsnorm₀_h(h_p)])       mtp.fc: [H, 2H]; mtp.pre_fc_norm_embedding / _hidden
        y = rmsnorm₀(decoder_layer(x) + its residual)    mtp.layers.<i>: gated full attention over the layer's own
                                                          KV cache, the sparse MoE MLP; mtp.norm
        logits = lm_head(y)                              a guess at t_{p+2}

rmsnorm₀ is Qwen3-Next's zero-centred RMSNorm.  A second draft step takes ``y`` as its ``h`` (as vLLM's
``Qwen3NextMTP`` and SGLang's ``Qwen3NextForCausalLMMTP`` do); draft step ``k`` runs layer
``k mod num_nextn_predict_layers``.  The token embedding and the LM head are the target's (``model.embed_tokens``,
``lm_head``).  The MTP layers have no linear-attention state: only the target's Gated DeltaNet layers keep one.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from atom_core.config import DecoderConfig, text_config
from atom_core.host import Host
from atom_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from atom_core.layers.linear import ReplicatedLinear
from atom_core.layers.norm import RMSNorm
from atom_core.loader import WeightMapper
from atom_core.loader.experts import with_experts
from atom_core.loader.mapper import TIED_LM_HEAD
from atom_core.models.base import CausalLM
from atom_core.models.deepseek_mtp import mtp_layer_ids
from atom_core.models.llama import DENSE_MAPPER, _join
from atom_core.models.qwen3_next import FULL_ATTENTION, Qwen3NextDecoderLayer, qwen3_next_mlp

# the target's decoder: its tensors are not the draft's
MTP_MAPPER = with_experts(DENSE_MAPPER, ignored=(r"^model\.layers\.", r"^model\.norm\."))


class Qwen3NextMultiTokenPredictor(nn.Module):
    """The ``mtp.*`` modules: the pre-projection norms, ``fc``, the decoder layers and the final norm."""

    def __init__(self, hf_config: Any, cfg: DecoderConfig, num_layers: int, *, host: Host, prefix: str):
        super().__init__()
        self.pre_fc_norm_embedding = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, zero_centered=True)
        self.pre_fc_norm_hidden = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, zero_centered=True)
        self.fc = ReplicatedLinear(2 * cfg.hidden_size, cfg.hidden_size, bias=False, host=host, prefix=f"{prefix}.fc")

        def build_mlp(layer_id: int, mlp_prefix: str) -> nn.Module:
            return qwen3_next_mlp(hf_config, cfg, layer_id, host=host, prefix=mlp_prefix)

        # layer i's MLP follows the config's rule for layer i (mlp_only_layers, decoder_sparse_step), as the hosts'
        # MTP classes build it
        self.layers = nn.ModuleList(
            Qwen3NextDecoderLayer(hf_config, cfg, i, host=host, prefix=f"{prefix}.layers.{i}", build_mlp=build_mlp,
                                  layer_type=FULL_ATTENTION)
            for i in range(num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, zero_centered=True)

    def forward(self, positions: torch.Tensor, embeds: torch.Tensor, previous_hidden: torch.Tensor,
                step: int) -> torch.Tensor:
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(previous_hidden)], dim=-1))
        y, residual = self.layers[step % len(self.layers)](positions, x, None)
        y, _ = self.norm(y, residual)
        return y


class Qwen3NextEmbedding(nn.Module):
    """The target's token embedding (``model.embed_tokens``), which the draft shares."""

    def __init__(self, cfg: DecoderConfig, *, host: Host):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, host=host)


class Qwen3NextMTP(CausalLM):
    """The ``mtp.*`` layers of a ``Qwen3NextForCausalLM`` checkpoint as a draft model (vLLM's ``Qwen3NextMTP``).

    ``forward(input_ids, positions, previous_hidden, step)`` returns ``(y, y)``: the hidden states
    ``compute_logits(y, step)`` turns into the draft's logits, and the ones the next draft step takes as
    ``previous_hidden`` (the pair :class:`atom_core.runtime.speculative.SpeculativeDecoder` expects of a draft).  It
    shares its host with the target; its attention layers get KV caches of their own."""

    weight_mapper = MTP_MAPPER

    def __init__(self, hf_config: Any, host: Host, prefix: str = ""):
        super().__init__(hf_config, host)
        self.config = hf_config
        cfg = DecoderConfig.from_hf(hf_config)
        self.decoder_config = cfg
        num_layers = len(mtp_layer_ids(text_config(hf_config)))
        self.model = Qwen3NextEmbedding(cfg, host=host)
        self.mtp = Qwen3NextMultiTokenPredictor(hf_config, cfg, num_layers, host=host, prefix=_join(prefix, "mtp"))
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, host=host)
        if cfg.tie_word_embeddings:
            self.lm_head.tie_to(self.model.embed_tokens)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, previous_hidden: torch.Tensor,
                step: int = 0, inputs_embeds: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        embeds = inputs_embeds if inputs_embeds is not None else self.model.embed_tokens(input_ids)
        y = self.mtp(positions, embeds, previous_hidden, step)
        return y, y

    def compute_logits(self, hidden: torch.Tensor, step: int = 0) -> torch.Tensor:
        return self.lm_head.compute_logits(hidden)

    def mapper(self) -> WeightMapper:
        if self.decoder_config.tie_word_embeddings:
            return dataclasses.replace(MTP_MAPPER, tied=TIED_LM_HEAD)
        return MTP_MAPPER

