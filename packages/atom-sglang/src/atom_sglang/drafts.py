"""Speculative decoding in SGLang: ATOM's draft models under SGLang's names, and what SGLang's EAGLE worker asks
of ATOM's targets.

SGLang's EAGLE worker (``--speculative-algorithm EAGLE3`` / ``NEXTN`` / ``EAGLE``) builds the draft as a model of
its own (a second ModelRunner with its own KV pool) and drives it through the ordinary model contract:

    target                                            draft
    set_eagle3_layers_to_capture(ids)  (EAGLE-3)      built as cls(config=draft config, quant_config=...)
    forward -> LogitsProcessorOutput, whose           forward(input_ids, positions, forward_batch): the target's
      hidden_states SGLang hands the draft in           (or its own previous step's) hidden states in
      forward_batch.spec_info.hidden_states             forward_batch.spec_info.hidden_states
      (EAGLE-3: the captured layers, concatenated)    -> LogitsProcessorOutput (hidden_states: the next step's)
    get_embed_and_head()                          ->  set_embed_and_head(embed, head)  (MTP drafts)
                                                      set_embed(embed), hot_token_id  (EAGLE-3)

Draft architectures (the names SGLang's ModelConfig gives a draft, :data:`SGLANG_NAMES`): a DeepSeek-V3 checkpoint's
MTP layer is ``DeepseekV3ForCausalLMNextN``, a Qwen3-Next checkpoint's ``mtp.*`` is ``Qwen3NextForCausalLMMTP``, an
EAGLE-3 checkpoint says ``LlamaForCausalLMEagle3``.  Each is generated from :data:`atom_core.catalog.DRAFTS`, and only
where ATOM serves one of the draft's targets: SGLang's own target keeps SGLang's own draft.

SGLang's drafter has no step index: every draft step runs the one MTP layer SGLang plans a KV pool for
(``num_nextn_predict_layers`` layers; SGLang's own classes build one), and an EAGLE-3 step applies ``fc`` when the
hidden states are wider than the draft (the target's concatenated layers), as SGLang's own class decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch
from torch import nn

from atom_core import catalog
from atom_core.build import build_model
from atom_core.config import DecoderConfig, load_hf_config, text_config
from atom_core.errors import UnsupportedConfigError
from atom_core.loader import Checkpoint
from atom_core.models.llama import LlamaForCausalLM
from atom_sglang import compat
from atom_sglang.host import SGLangHost
from atom_sglang.prefill_graph import layer_model

EAGLE3 = "eagle3"

# atom-core's draft name -> the architecture SGLang's ModelConfig gives that draft
SGLANG_NAMES = {
    "DeepSeekMTPModel": "DeepseekV3ForCausalLMNextN",
    "Qwen3NextMTP": "Qwen3NextForCausalLMMTP",
    "Eagle3LlamaForCausalLM": "LlamaForCausalLMEagle3",
}


def eagle3_targets() -> frozenset[str]:
    """The target architectures of ATOM's EAGLE-3 drafts (their SGLang classes capture auxiliary hidden states)."""
    return frozenset(t for spec in catalog.DRAFTS.values() if spec.method == EAGLE3 for t in spec.targets)


class Eagle3Target:
    """What SGLang's model runner asks of an EAGLE-3 target (first in the wrapper's bases).

    ``set_eagle3_layers_to_capture(None)`` captures the input of layers 2, n/2 and n-3; explicit ids (the draft
    config's ``eagle_aux_hidden_state_layer_ids``) capture the *output* of each named layer, i.e. the input of layer
    ``id + 1``, as SGLang's own targets do.  The wrapper's forward then hands the captured states to SGLang's
    LogitsProcessor, which gives them to the draft."""

    capture_aux_hidden_states = False

    def set_eagle3_layers_to_capture(self, layer_ids: list[int] | None = None) -> None:
        n = self.decoder_config.num_layers
        layers = self.get_eagle3_aux_hidden_state_layers() if layer_ids is None else [i + 1 for i in layer_ids]
        if any(not 0 <= i < n for i in layers):
            raise UnsupportedConfigError(
                f"{type(self).__name__}: eagle_aux_hidden_state_layer_ids {list(layer_ids)} name layers whose output "
                f"is not the input of one of the target's {n} layers (SGLang captures the input of layer id + 1)"
            )
        self.set_aux_hidden_state_layers(tuple(layers))
        self.capture_aux_hidden_states = True


class TargetShape:
    """What atom-core's EAGLE-3 draft reads of its target (widths, layer count, default layers), from the target's
    config: SGLang builds the draft without handing it the target model."""

    def __init__(self, hf_config: Any):
        self.decoder_config = DecoderConfig.from_hf(hf_config)
        self.model = nn.Module()
        self.model.embed_tokens = TargetEmbedding(self.decoder_config.hidden_size)

    def get_eagle3_aux_hidden_state_layers(self) -> tuple[int, ...]:
        return LlamaForCausalLM.get_eagle3_aux_hidden_state_layers(self)


class TargetEmbedding(nn.Module):
    """Stands for the target's token embedding in a draft checkpoint without one, until SGLang's EAGLE worker hands
    the draft the target's (``set_embed``)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.weight = torch.empty((0, hidden_size), device="meta")  # a plain attribute: no parameter to load

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.weight.is_meta:
            raise UnsupportedConfigError(
                "the EAGLE-3 draft has no embed_tokens of its own and SGLang did not give it the target's (set_embed)"
            )
        return nn.functional.embedding(input_ids, self.weight)


class SGLangDraft(nn.Module):
    """SGLang's draft-model contract over an atom-core draft model (placed before it in the generated class's bases)."""

    atom_spec: ClassVar[catalog.DraftSpec]
    atom_class: ClassVar[type]
    packed_modules_mapping: ClassVar[dict[str, list[str]]]
    capture_aux_hidden_states = False
    load_lm_head_from_target = False  # an EAGLE-3 draft keeps its own head (over its own vocabulary)

    def __init__(self, config: Any, quant_config: Any = None, prefix: str = ""):
        name = type(self).__name__
        compat.check_buildable(name)
        kwargs: dict[str, Any] = {}
        layer_offset = 0
        if self.atom_spec.method == EAGLE3:
            kwargs["target"] = TargetShape(load_hf_config(compat.target_model_path()))
            kwargs["checkpoint_names"] = Checkpoint(config._name_or_path).weight_map
            self.capture_aux_hidden_states = True  # the draft's own hidden states go to the next step
        elif self.atom_spec.name == "DeepSeekMTPModel":
            text = text_config(config)
            if text.num_nextn_predict_layers != 1:
                raise UnsupportedConfigError(
                    f"{name}: num_nextn_predict_layers is {text.num_nextn_predict_layers}; SGLang's drafter runs one "
                    "MTP layer at every step, so ATOM drafts only from a checkpoint with exactly one"
                )
            layer_offset = text.num_hidden_layers  # the draft's KV pool holds the MTP layer as its layer 0
            self.zero_first_embedding = False  # SGLang's MTP layer reads the embedding at position 0 as it is
        _, host = build_model(
            config,
            lambda quant: SGLangHost(quant=quant, layer_offset=layer_offset),
            into=self,
            prefix=prefix,
            spec=self.atom_spec,
            **kwargs,
        )
        self.atom_host = host
        refuse_body_capture(self)
        self.checkpoint_dir = getattr(config, "_name_or_path", None) or None
        logits_config = text_config(config)
        if self.atom_spec.method == EAGLE3:
            self.hot_token_id = None  # set by load_weights from d2t
            logits_config = _with_vocab(logits_config, self.draft_vocab_size)
        self.logits_processor = compat.logits_processor_class()(logits_config)
        self._weights_loaded = False
        from atom_sglang.wrapper import guard_weight_processing  # (wrapper imports this module)

        guard_weight_processing(self)  # SGLang's loader converts quantized layers again after load_weights

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: Any,
        input_embeds: torch.Tensor | None = None,
        pp_proxy_tensors: Any = None,
        **_: Any,
    ):
        if pp_proxy_tensors is not None:
            raise UnsupportedConfigError(f"{type(self).__name__}: pipeline parallelism is not supported by ATOM models")
        previous = forward_batch.spec_info.hidden_states
        step = 0
        if self.atom_spec.method == EAGLE3 and previous.shape[-1] == self.decoder_config.hidden_size:
            step = 1  # the draft's own hidden states: no fc
        host = self.atom_host
        host.forward_batch = forward_batch
        try:
            for_logits, next_hidden = self.atom_class.forward(self, input_ids, positions, previous, step, input_embeds)
        finally:
            host.forward_batch = None
        if self.atom_spec.method == EAGLE3:  # logits over the draft vocabulary; SGLang maps them by hot_token_id
            return self.logits_processor(input_ids, for_logits, self.lm_head, forward_batch, [next_hidden])
        # MTP: the next step takes the hidden states the head reads (DeepSeek: shared_head.norm(y); Qwen3-Next: y)
        return self.logits_processor(input_ids, next_hidden, self.draft_head(), forward_batch)

    def draft_head(self) -> nn.Module:
        if self.atom_spec.name == "DeepSeekMTPModel":
            return self._layer(0).shared_head.head
        return self.lm_head

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        from atom_sglang.wrapper import reset_weight_processing

        reset_weight_processing(self)
        loaded = self.atom_class.load_weights(self, weights, strict=not self._weights_loaded)
        self._weights_loaded = True
        if self.atom_spec.method == EAGLE3 and self.has_d2t:
            self.hot_token_id = self.target_ids
        return loaded

    # ------------------------------------------------------------------- sharing the target's embedding and head
    def get_embed_and_head(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.embed_tokens.weight, self.draft_head().weight

    def set_embed_and_head(self, embed: torch.Tensor, head: torch.Tensor) -> None:
        self.set_embed(embed)
        lm_head = self.draft_head()
        del lm_head.weight
        lm_head.weight = head

    def set_embed(self, embed: torch.Tensor) -> None:
        embedding = self.model.embed_tokens
        if isinstance(embedding, TargetEmbedding):
            embedding.weight = embed
            return
        del embedding.weight
        embedding.weight = embed


def refuse_body_capture(draft: nn.Module) -> None:
    """SGLang's breakable and full prefill CUDA graphs (on by default on CUDA) capture a draft's body
    (``model.model.forward``) alone and run the rest around it; ATOM's draft bodies have no such forward, so a call
    refuses with the way out instead of failing inside torch."""
    body = layer_model(draft)
    if body is None:
        return
    name = type(draft).__name__

    def forward(*args: Any, **kwargs: Any) -> Any:
        raise UnsupportedConfigError(
            f"{name}: SGLang's prefill CUDA graph captures the draft's body alone, which ATOM's draft models do not "
            "provide; run with --cuda-graph-backend-prefill disabled"
        )

    body.forward = forward


def _with_vocab(config: Any, vocab_size: int) -> Any:
    import copy

    config = copy.copy(config)
    config.vocab_size = vocab_size
    return config


def build_draft_class(spec: catalog.DraftSpec, module: str) -> type:
    """The SGLang class of ATOM's draft ``spec``, named like SGLang's own draft class."""
    atom_cls = spec.model_class()
    name = SGLANG_NAMES[spec.name]
    mapper = getattr(atom_cls, "weight_mapper", None)
    packed = mapper.packed_modules_mapping if mapper is not None else {}
    namespace = {
        "__module__": module,
        "__qualname__": name,
        "__doc__": f"ATOM's {spec.name} draft ({spec.model}) inside SGLang.",
        "atom_spec": spec,
        "atom_class": atom_cls,
        "packed_modules_mapping": {fused: list(parts) for fused, parts in packed.items()},
    }
    return type(name, (SGLangDraft, atom_cls), namespace)


def draft_classes(served: Iterable[str], module: str) -> list[type]:
    """One class per catalog draft one of whose targets ATOM serves (``served``: the architectures ATOM serves)."""
    served = set(served)
    return [
        build_draft_class(spec, module)
        for spec in catalog.DRAFTS.values()
        if spec.name in SGLANG_NAMES and served & set(spec.targets)
    ]
