"""vLLM model classes for every catalog architecture, generated from the catalog.

``atom_vllm.models.<Arch>`` is built on first access (vLLM imports ``"atom_vllm.models:<Arch>"`` lazily,
in its inspection subprocess and in each worker): a subclass of atom-core's model for that architecture
that speaks vLLM's model interface and is built against a :class:`~atom_vllm.host.VllmHost`.  Parameter
names are atom-core's own, so vLLM's weight iterator feeds atom-core's loader (with its coverage check)
unchanged.  Capabilities add vLLM interfaces (:mod:`atom_vllm.capabilities`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

import torch

from atom_core import catalog
from atom_core.build import build_model
from atom_core.errors import UnsupportedConfigError
from atom_vllm import lora
from atom_vllm.capabilities import missing, mixins, plan, vllm_bases
from atom_vllm.compilation import compiles, support_torch_compile
from atom_vllm.eagle import EAGLE3, Eagle3Target, build_eagle3_draft_class, eagle3_targets
from atom_vllm.host import VllmHost
from atom_vllm.plugin import vllm_logger


class VllmModelAdapter:
    """vLLM's text-generation model interface over an atom-core ``CausalLM``.

    A wrapper's bases are ``(*capability mixins, VllmModelAdapter, *vLLM interfaces, atom-core class)``: the
    mixins implement vLLM's interfaces, so the interfaces' own stubs and defaults never answer; calls meant
    for the atom-core model name it (``atom_class``) rather than rely on ``super()``."""

    atom_spec: ClassVar[catalog.ArchSpec]
    atom_class: ClassVar[type]  # the atom-core model class (last in the bases)
    packed_modules_mapping: ClassVar[dict[str, list[str]]]

    def __init__(self, *, vllm_config: Any, prefix: str = ""):
        lora.prepare(vllm_config, self.atom_spec.name)
        hf_config = vllm_config.model_config.hf_config
        _, host = build_model(hf_config, lambda quant: VllmHost(vllm_config, quant=quant), into=self, prefix=prefix,
                              spec=self.atom_spec)
        self.host = [host]  # a list keeps the host out of the module tree
        self.checkpoint_dir = vllm_config.model_config.model  # names a file vLLM's reader cannot open (atom_core.loader)
        vllm_logger().info("vLLM builds ATOM's %s (%s)", self.atom_spec.name, self.atom_spec.model)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.atom_class.embed_input_ids(self, input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, intermediate_tensors: Any = None,
                inputs_embeds: torch.Tensor | None = None, **atom_inputs: Any) -> torch.Tensor:
        """``atom_inputs``: extra inputs of the atom-core model's forward that a capability's mixin supplies
        (Qwen3-VL's ``deepstack``); vLLM itself passes none."""
        if intermediate_tensors is not None:
            raise UnsupportedConfigError(f"{type(self).__name__}: ATOM's models do not support pipeline parallelism yet")
        return self.atom_class.forward(self, input_ids, positions, inputs_embeds, **atom_inputs)

    def compute_logits(self, hidden_states: torch.Tensor, sampling_metadata: Any = None) -> torch.Tensor:
        # vLLM <= 0.10.2 passed sampling_metadata; 0.11+ does not.  Every TP rank gets the full vocabulary.
        return self.atom_class.compute_logits(self, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Consume vLLM's weight iterator with atom-core's loader: a checkpoint tensor the model does not use,
        or a parameter no tensor wrote, is an error naming them (vLLM then checks the returned set too)."""
        return self.atom_class.load_weights(self, weights, strict=True)


# the draft architectures whose forward vLLM's MTP proposer unpacks as a pair (its ``model_returns_tuple``, every tested
# release); the others return one tensor, which for ATOM's drafts there is both halves of the pair (Qwen3NextMTP)
PAIR_DRAFTS = frozenset({"DeepSeekMTPModel"})


class VllmDraftAdapter:
    """vLLM's draft-model interface (its ``DeepSeekMTP``: ``forward(input_ids, positions, hidden_states, ...,
    spec_step_idx)``, ``compute_logits(hidden_states, spec_step_idx)``) over an atom-core draft model.  vLLM builds it
    from ``--speculative-config`` (method ``mtp``) with the draft's config in ``speculative_config.draft_model_config``,
    and shares the target's token embedding with it."""

    atom_spec: ClassVar[catalog.DraftSpec]
    atom_class: ClassVar[type]
    packed_modules_mapping: ClassVar[dict[str, list[str]]]

    def __init__(self, *, vllm_config: Any, prefix: str = ""):
        draft = getattr(getattr(vllm_config, "speculative_config", None), "draft_model_config", None)
        model_config = draft or vllm_config.model_config
        _, host = build_model(model_config.hf_config, lambda quant: VllmHost(vllm_config, quant=quant), into=self,
                              prefix=prefix, spec=self.atom_spec)
        self.host = [host]
        self.checkpoint_dir = model_config.model
        vllm_logger().info("vLLM builds ATOM's %s draft (%s)", self.atom_spec.name, self.atom_spec.model)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor, hidden_states: torch.Tensor,
                intermediate_tensors: Any = None, inputs_embeds: torch.Tensor | None = None,
                spec_step_idx: int = 0) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        """``(hidden states for compute_logits, hidden states for the next draft step)`` where vLLM's drafter
        unpacks a pair (:data:`PAIR_DRAFTS`), else the first alone (the drafter feeds it to both)."""
        if intermediate_tensors is not None:
            raise UnsupportedConfigError(f"{type(self).__name__}: ATOM's draft models do not support pipeline "
                                         "parallelism yet")
        out = self.atom_class.forward(self, input_ids, positions, hidden_states, spec_step_idx, inputs_embeds)
        if self.atom_spec.name in PAIR_DRAFTS:
            return out
        if out[0] is not out[1]:
            raise UnsupportedConfigError(f"{self.atom_spec.name}: vLLM's drafter takes one hidden state from this draft, "
                                         "but ATOM's draft recycles another one into its next step")
        return out[0]

    def compute_logits(self, hidden_states: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        return self.atom_class.compute_logits(self, hidden_states, spec_step_idx)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return self.atom_class.load_weights(self, weights, strict=True)


def build_draft_class(spec: catalog.DraftSpec) -> type:
    if spec.method == EAGLE3:
        return build_eagle3_draft_class(spec)
    atom_cls = spec.model_class()
    namespace = {
        "__module__": __name__, "__qualname__": spec.name, "__doc__": f"ATOM's {spec.name} draft ({spec.model}) inside vLLM.",
        "atom_spec": spec, "atom_class": atom_cls,
        "packed_modules_mapping": dict(atom_cls.weight_mapper.packed_modules_mapping),
    }
    return type(spec.name, (VllmDraftAdapter, atom_cls), namespace)


def build_class(spec: catalog.ArchSpec) -> type:
    reasons = missing(spec)
    if reasons:
        raise UnsupportedConfigError(f"atom-vllm cannot serve {spec.name} yet: {'; '.join(reasons)}")
    atom_cls = spec.model_class()
    namespace = {
        "__module__": __name__,
        "__qualname__": spec.name,
        "__doc__": f"ATOM's {spec.name} ({spec.model}) inside vLLM.",
        "atom_spec": spec,
        "atom_class": atom_cls,
        "packed_modules_mapping": dict(atom_cls.weight_mapper.packed_modules_mapping),
    }
    eagle = ((Eagle3Target,), (_supports_eagle3(),)) if spec.name in eagle3_targets() else ((), ())
    cls = type(spec.name, (*mixins(spec), *eagle[0], VllmModelAdapter, *vllm_bases(spec), *eagle[1], atom_cls), namespace)
    return support_torch_compile(cls) if compiles(spec) else cls


def _supports_eagle3() -> type:
    from vllm.model_executor.models.interfaces import SupportsEagle3

    return SupportsEagle3


_classes: dict[str, type] = {}


def __getattr__(name: str) -> type:
    if name in catalog.ARCHITECTURES:
        if name not in _classes:
            _classes[name] = build_class(catalog.ARCHITECTURES[name])
        return _classes[name]
    draft = next((d for d in catalog.DRAFTS.values() if name in (d.name, *d.aliases)), None)
    if draft is not None:
        if draft.name not in _classes:
            _classes[draft.name] = build_draft_class(draft)
        return _classes[draft.name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *plan()[0]])
