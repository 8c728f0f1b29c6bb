"""EAGLE-3 under vLLM (``--speculative-config`` method ``eagle3``): ATOM's Llama-family targets as vLLM's
``SupportsEagle3`` models and ATOM's ``Eagle3LlamaForCausalLM`` draft as vLLM's EAGLE proposer drives it.

Target: vLLM's model runner asks for the auxiliary layers (``set_aux_hidden_state_layers``, from the draft's config
or the target's default) and then unpacks the target's forward as ``(hidden, [aux ...])``: atom-core's Llama-family
model already returns that pair once the layers are set.

Draft: vLLM's proposer calls ``combine_hidden_states`` (the draft's ``fc``) on the target's concatenated auxiliary
states, then ``forward(input_ids, positions, hidden_states)`` with hidden states of the draft's width at every step,
unpacks ``(hidden for compute_logits, hidden for the next step)``, and maps draft tokens into the target's
vocabulary through ``compute_logits`` (the draft's ``d2t``).  vLLM builds the draft without its target: the target's
shape comes from ``vllm_config.model_config`` (:class:`TargetShape`), and a draft checkpoint without ``embed_tokens``
gets the target's embedding from vLLM's proposer after loading (``has_own_embed_tokens`` False; a
:class:`TargetEmbedding` stands in until then).  The proposer
asserts its draft is one of vLLM's own EAGLE-3 classes, so ATOM's class is registered as a virtual subclass of
vLLM's ``Eagle3LlamaForCausalLM`` (an ``isinstance`` answer only: none of vLLM's methods are inherited).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Any, ClassVar

import torch

from atom_core import catalog
from atom_core.build import build_model
from atom_core.config import DecoderConfig
from atom_core.config_checks import config_file
from atom_core.errors import UnsupportedConfigError
from atom_core.loader import Checkpoint
from atom_core.models.llama import LlamaForCausalLM
from atom_core.models.llama_eagle3 import aux_layer_ids
from atom_vllm.host import VllmHost
from atom_vllm.plugin import vllm_logger

EAGLE3 = "eagle3"
VLLM_EAGLE3_DRAFT = ("vllm.model_executor.models.llama_eagle3", "Eagle3LlamaForCausalLM")


def eagle3_targets() -> frozenset[str]:
    """The target architectures of ATOM's EAGLE-3 drafts (their vLLM wrappers declare ``SupportsEagle3``)."""
    return frozenset(t for spec in catalog.DRAFTS.values() if spec.method == EAGLE3 for t in spec.targets)


class Eagle3Target:
    """vLLM's ``SupportsEagle3`` methods over atom-core's Llama-family model (first in the wrapper's bases, so the
    interface's defaults, which look for vLLM's own decoder class, never answer)."""

    def set_aux_hidden_state_layers(self, layers: tuple[int, ...]) -> None:
        self.atom_class.set_aux_hidden_state_layers(self, tuple(layers))

    def get_eagle3_aux_hidden_state_layers(self) -> tuple[int, ...]:
        return self.atom_class.get_eagle3_aux_hidden_state_layers(self)

    # the name vLLM's runner asks from 0.32 on
    get_eagle3_default_aux_hidden_state_layers = get_eagle3_aux_hidden_state_layers


class TargetEmbedding(torch.nn.Module):
    """Stands for the target's token embedding in a draft checkpoint without one, until vLLM's proposer puts the
    target's in its place after loading (it reads ``weight``'s width to decide, and no parameter is left to load)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.weight = torch.empty((0, hidden_size), device="meta")  # a plain attribute: no parameter, no buffer

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise UnsupportedConfigError("the EAGLE-3 draft has no embed_tokens of its own and vLLM did not give it the "
                                     "target's")


class TargetShape:
    """What atom-core's EAGLE-3 draft reads of its target (layer count, widths, default auxiliary layers), from the
    target's config: vLLM builds the draft without handing it the target model."""

    def __init__(self, hf_config: Any):
        self.decoder_config = DecoderConfig.from_hf(hf_config)
        self.model = torch.nn.Module()
        self.model.embed_tokens = TargetEmbedding(self.decoder_config.hidden_size)

    def get_eagle3_aux_hidden_state_layers(self) -> tuple[int, ...]:
        return LlamaForCausalLM.get_eagle3_aux_hidden_state_layers(self)


class VllmEagle3DraftAdapter:
    """vLLM's EAGLE-3 draft interface (its ``Eagle3LlamaForCausalLM``) over atom-core's ``Eagle3LlamaForCausalLM``."""

    atom_spec: ClassVar[catalog.DraftSpec]
    atom_class: ClassVar[type]
    packed_modules_mapping: ClassVar[dict[str, list[str]]]
    has_own_lm_head: ClassVar[bool] = True  # the draft vocabulary's head, never the target's

    def __init__(self, *, vllm_config: Any, prefix: str = ""):
        spec_config = getattr(vllm_config, "speculative_config", None)
        draft = getattr(spec_config, "draft_model_config", None)
        if draft is None:
            raise UnsupportedConfigError(f"{self.atom_spec.name}: vLLM builds this EAGLE-3 draft only from "
                                         "--speculative-config (method eagle3, model DIR)")
        if getattr(spec_config, "parallel_drafting", False):
            raise UnsupportedConfigError(f"{self.atom_spec.name}: parallel drafting (P-EAGLE) is not supported with "
                                         "ATOM's EAGLE-3 draft")
        target = TargetShape(vllm_config.model_config.hf_config)
        layers = aux_layer_ids(draft.hf_config, target)
        if len(set(layers)) != len(layers):
            raise UnsupportedConfigError(
                f"{config_file(draft.hf_config)}: eagle_aux_hidden_state_layer_ids {list(layers)} repeats a layer: "
                "vLLM's target returns each layer's hidden state once, so the draft's fc would get fewer")
        # the draft's attention layer is named after the target's last, as vLLM's own draft names it
        _, host = build_model(draft.hf_config, lambda quant: VllmHost(vllm_config, quant=quant), into=self,
                              prefix=prefix, spec=self.atom_spec, target=target,
                              checkpoint_names=Checkpoint(draft.model).weight_map,
                              layer_name_index=target.decoder_config.num_layers)
        self.has_own_embed_tokens = self.has_embedding
        self.host = [host]
        self.checkpoint_dir = draft.model
        vllm_logger().info("vLLM builds ATOM's %s draft (%s)", self.atom_spec.name, self.atom_spec.model)

    def embed_input_ids(self, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def combine_hidden_states(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The draft's ``fc`` over the target's auxiliary hidden states, concatenated."""
        return self.model.fc(hidden_states)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, hidden_states: torch.Tensor,
                inputs_embeds: torch.Tensor | None = None, intermediate_tensors: Any = None,
                **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
        if intermediate_tensors is not None:
            raise UnsupportedConfigError(f"{type(self).__name__}: ATOM's draft models do not support pipeline "
                                         "parallelism yet")
        # vLLM has already applied fc (combine_hidden_states): atom-core's later-step path, which skips it
        return self.atom_class.forward(self, input_ids, positions, hidden_states, 1, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor, *args: Any) -> torch.Tensor:
        return self.atom_class.compute_logits(self, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return self.atom_class.load_weights(self, weights, strict=True)


def build_eagle3_draft_class(spec: catalog.DraftSpec) -> type:
    """The vLLM class of ATOM's EAGLE-3 draft ``spec``, registered as a virtual subclass of vLLM's own draft class."""
    atom_cls = spec.model_class()
    namespace = {
        "__module__": "atom_vllm.models", "__qualname__": spec.name,
        "__doc__": f"ATOM's {spec.name} EAGLE-3 draft ({spec.model}) inside vLLM.",
        "atom_spec": spec, "atom_class": atom_cls,
        "packed_modules_mapping": dict(atom_cls.weight_mapper.packed_modules_mapping),
    }
    cls = type(spec.name, (VllmEagle3DraftAdapter, atom_cls), namespace)
    module, name = VLLM_EAGLE3_DRAFT
    vllm_draft = getattr(importlib.import_module(module), name)
    if not hasattr(vllm_draft, "register"):  # an ABC (vLLM's interfaces are runtime-checkable protocols)
        raise UnsupportedConfigError(f"{spec.name}: vLLM's {name} is no abstract base class here, so its EAGLE "
                                     "proposer cannot take ATOM's draft")
    vllm_draft.register(cls)
    return cls
