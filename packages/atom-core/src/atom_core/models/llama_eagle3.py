"""EAGLE-3 draft heads over Llama-family targets (Llama, Qwen3): the draft model of speculative decoding, a separate
checkpoint (``LlamaForCausalLMEagle3`` / ``Eagle3LlamaForCausalLM`` in its config) beside the target's.

    at position p (the target's residual stream entering layers l_1, l_2, l_3 at p: a_1, a_2, a_3; the token t_{p+1}):
        h = fc([a_1 ; a_2 ; a_3])                     fc: [H, 3 * target_hidden_size]
        x = attn([input_layernorm(embed(t_{p+1})) ; hidden_norm(h)]) + h       attention input is 2H wide
        y = mlp(post_attention_layernorm(x)) + x
        logits = lm_head(norm(y))                     over the draft vocabulary (draft_vocab_size tokens)
        draft token d -> target token d + d2t[d]

``l_1 .. l_3`` are the config's ``eagle_aux_hidden_state_layer_ids`` (at the top level or in ``eagle_config``),
else the target's default (layers 2, n / 2 and n - 3 of n); layer i's input is the output of layer i - 1 (layer 0's
is the token embedding), as vLLM's targets record them.  A second draft step takes the draft's own ``y`` in place of
``h`` (no ``fc``).  With ``norm_before_residual`` the residual is ``hidden_norm(h)`` instead of ``h``.  The token
embedding is the checkpoint's ``embed_tokens`` when it has one, else the target's; ``t2d`` (the inverse map) is
not needed and skipped.  Checkpoint names: ``fc``, ``midlayer.*`` or ``layers.0.*``, ``norm``, ``lm_head``, ``d2t``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from atom_core.config import DecoderConfig
from atom_core.config_checks import config_file
from atom_core.errors import CheckpointError, UnsupportedConfigError
from atom_core.host import Host
from atom_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from atom_core.layers.linear import QKVParallelLinear, ReplicatedLinear
from atom_core.layers.norm import RMSNorm
from atom_core.loader import WeightMapper, load_weights
from atom_core.models.base import CausalLM
from atom_core.models.llama import DENSE_MAPPER, Attention, AttentionOptions, GatedMLP, _join

EAGLE3_MAPPER = WeightMapper(
    renames=((r"^midlayer\.", "model.layers.0."), (r"^(layers|fc|norm|embed_tokens)\.", r"model.\1.")),
    packed=DENSE_MAPPER.packed,
    ignored=(r"^t2d$",),
)
NUM_AUX_LAYERS = 3


def aux_layer_ids(draft_config: Any, target: Any) -> tuple[int, ...]:
    """The target layers whose input hidden states the draft reads, checked against the target's layer count."""
    where = config_file(draft_config)
    eagle = getattr(draft_config, "eagle_config", None) or {}
    if not isinstance(eagle, dict):
        raise UnsupportedConfigError(f"{where}: eagle_config must be an object, got {eagle!r}")
    if eagle.get("use_aux_hidden_state", True) is not True:
        raise UnsupportedConfigError(f"{where}: eagle_config.use_aux_hidden_state is off: ATOM runs EAGLE-3 drafts "
                                     "(fc over the target's auxiliary hidden states) only")
    ids = getattr(draft_config, "eagle_aux_hidden_state_layer_ids", None) or eagle.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        ids = target.get_eagle3_aux_hidden_state_layers()
    n = target.decoder_config.num_layers
    if (not isinstance(ids, (list, tuple)) or len(ids) != NUM_AUX_LAYERS
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n for i in ids)):
        raise UnsupportedConfigError(f"{where}: eagle_aux_hidden_state_layer_ids must be {NUM_AUX_LAYERS} layer "
                                     f"indices of the target's {n} layers (0 .. {n - 1}), got {ids!r}")
    return tuple(ids)


class Eagle3DecoderLayer(nn.Module):
    """The draft's one decoder layer: attention over ``[input_layernorm(embeds) ; hidden_norm(hidden)]``."""

    def __init__(self, cfg: DecoderConfig, options: AttentionOptions, layer_id: int, *, norm_before_residual: bool,
                 host: Host, prefix: str):
        super().__init__()
        self.norm_before_residual = norm_before_residual
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, options, layer_id, host=host, prefix=f"{prefix}.self_attn")
        self.self_attn.qkv_proj = QKVParallelLinear(  # 2H in: the token embedding beside the hidden state
            2 * cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, bias=options.qkv_bias, host=host,
            prefix=f"{prefix}.self_attn.qkv_proj")
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias, host=host, prefix=f"{prefix}.mlp")

    def forward(self, positions: torch.Tensor, embeds: torch.Tensor,
                hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = self.self_attn(positions, torch.cat([self.input_layernorm(embeds), normed], dim=-1))
        x, residual = self.post_attention_layernorm(x, residual)
        return self.mlp(x), residual


class Eagle3Model(nn.Module):
    def __init__(self, cfg: DecoderConfig, options: AttentionOptions, *, fc_in: int, norm_before_residual: bool,
                 host: Host, prefix: str, layer_name_index: int = 0):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, host=host)
        self.fc = ReplicatedLinear(fc_in, cfg.hidden_size, bias=False, host=host, prefix=f"{prefix}.fc")
        # layer 0 of the draft's own config (its sliding window); the host caches its K/V beside the target's layers,
        # under the name layers.<layer_name_index> (a host that names caches by layer gives the target's layer count)
        self.layers = nn.ModuleList([Eagle3DecoderLayer(cfg, options, 0, norm_before_residual=norm_before_residual,
                                                        host=host, prefix=f"{prefix}.layers.{layer_name_index}")])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Eagle3LlamaForCausalLM(CausalLM):
    """An EAGLE-3 draft checkpoint over a Llama-family ``target`` (vLLM's ``Eagle3LlamaForCausalLM``).

    ``forward(input_ids, positions, previous_hidden, step)`` returns ``(norm(y), y)``: the hidden states
    ``compute_logits`` turns into logits over the target's vocabulary (tokens outside the draft vocabulary at -inf),
    and the ones the next draft step takes as ``previous_hidden``.  At step 0 ``previous_hidden`` is the target's
    auxiliary hidden states concatenated (``[T, 3 * target_hidden_size]``), projected by ``fc``.
    ``checkpoint_names``: the draft checkpoint's tensor names (it may omit ``embed_tokens``, then the target's is
    used, and ``d2t`` when its vocabulary is the target's).  ``layer_name_index``: the layer index in the names of
    the draft layer's host modules (its attention cache); its parameters stay ``model.layers.0.*``."""

    weight_mapper = EAGLE3_MAPPER

    def __init__(self, hf_config: Any, host: Host, prefix: str = "", *, target: Any = None,
                 checkpoint_names: Iterable[str] = (), layer_name_index: int = 0):
        where = config_file(hf_config)
        if target is None:  # a host adapter that builds drafts without their target
            raise UnsupportedConfigError(f"{where}: an EAGLE-3 draft is built over its target model (the native "
                                         "runner's --speculative N --draft DIR); this host does not pass one")
        super().__init__(hf_config, host)
        self.config = hf_config
        cfg = DecoderConfig.from_hf(hf_config)
        self.decoder_config = cfg
        if cfg.num_layers != 1:
            raise UnsupportedConfigError(f"{where}: num_hidden_layers must be 1 for an EAGLE-3 draft, got {cfg.num_layers}")
        target_cfg = target.decoder_config
        if cfg.vocab_size != target_cfg.vocab_size:
            raise UnsupportedConfigError(f"{where}: vocab_size {cfg.vocab_size} is not the target's {target_cfg.vocab_size}")
        self.draft_vocab_size = getattr(hf_config, "draft_vocab_size", None) or cfg.vocab_size
        if not isinstance(self.draft_vocab_size, int) or not 0 < self.draft_vocab_size <= cfg.vocab_size:
            raise UnsupportedConfigError(f"{where}: draft_vocab_size must be an integer in 1 .. vocab_size "
                                         f"({cfg.vocab_size}), got {self.draft_vocab_size!r}")
        target_hidden = getattr(hf_config, "target_hidden_size", None) or cfg.hidden_size
        if target_hidden != target_cfg.hidden_size:
            raise UnsupportedConfigError(f"{where}: target_hidden_size {target_hidden} is not the target's hidden "
                                         f"size {target_cfg.hidden_size}")
        self.aux_hidden_state_layers = aux_layer_ids(hf_config, target)
        names = set(checkpoint_names)
        self.has_embedding = bool({"embed_tokens.weight", "model.embed_tokens.weight"} & names)
        self.has_d2t = "d2t" in names
        if not self.has_d2t and self.draft_vocab_size != cfg.vocab_size:
            raise CheckpointError(f"{where}: draft_vocab_size {self.draft_vocab_size} is not the vocabulary's "
                                  f"{cfg.vocab_size} and the checkpoint has no d2t (draft -> target token offsets)")
        bias = bool(getattr(hf_config, "attention_bias", False))
        self.model = Eagle3Model(cfg, AttentionOptions(qkv_bias=bias, o_bias=bias), fc_in=NUM_AUX_LAYERS * target_hidden,
                                 host=host, prefix=_join(prefix, "model"), layer_name_index=layer_name_index,
                                 norm_before_residual=bool(getattr(hf_config, "norm_before_residual", False)))
        if not self.has_embedding:
            self.model.embed_tokens = target.model.embed_tokens  # shared, loaded with the target
        self.lm_head = ParallelLMHead(self.draft_vocab_size, cfg.hidden_size, host=host)
        self.d2t = nn.Parameter(torch.zeros(self.draft_vocab_size, dtype=torch.int64), requires_grad=False)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, previous_hidden: torch.Tensor,
                step: int = 0, inputs_embeds: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        embeds = inputs_embeds if inputs_embeds is not None else self.model.embed_tokens(input_ids)
        hidden = self.model.fc(previous_hidden) if step == 0 else previous_hidden
        y, residual = self.model.layers[0](positions, embeds, hidden)
        return self.model.norm(y, residual)

    def compute_logits(self, hidden: torch.Tensor, step: int = 0) -> torch.Tensor:
        draft = self.lm_head.compute_logits(hidden)
        logits = draft.new_full((draft.shape[0], self.decoder_config.vocab_size), float("-inf"))
        logits[:, self.target_ids] = draft
        return logits

    def load_weights(self, weights: Iterable[tuple[str, Any]], *, strict: bool = True) -> set[str]:
        optional = set()
        if not self.has_embedding:
            optional.add("model.embed_tokens.weight")
        if not self.has_d2t:
            optional.add("d2t")
        loaded = load_weights(self, weights, self.mapper(), strict=strict, skip_param=lambda name: name in optional)
        target_ids = torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t.data
        bad = ((target_ids < 0) | (target_ids >= self.decoder_config.vocab_size)).nonzero()
        checkpoint = Path(config_file(self.config)).parent
        if len(bad):
            d = int(bad[0])
            raise CheckpointError(f"{checkpoint}: d2t maps draft token {d} to {int(target_ids[d])}, "
                                  f"outside the target's vocabulary of {self.decoder_config.vocab_size}")
        if len(torch.unique(target_ids)) != self.draft_vocab_size:
            raise CheckpointError(f"{checkpoint}: d2t maps two draft tokens to one target token")
        self.target_ids = target_ids
        return loaded
