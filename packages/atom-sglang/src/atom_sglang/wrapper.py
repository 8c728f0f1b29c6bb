"""SGLang's model contract around an ATOM model.

Each served catalog architecture gets a class named exactly like the architecture (SGLang keys its
registry by ``cls.__name__``) that derives from :class:`SGLangCausalLM` and the ATOM model class, so
parameter names stay those of the ATOM model (``model.layers.0.self_attn.qkv_proj.weight``...):

    SGLang                                      ATOM
    cls(config=hf_config, quant_config=...)  -> ATOMModel(hf_config, SGLangHost(...))
    forward(input_ids, positions, forward_batch, input_embeds=None, pp_proxy_tensors=None)
        publish forward_batch on the host    -> ATOMModel.forward(input_ids, positions, input_embeds) -> hidden
        LogitsProcessor(input_ids, hidden, lm_head, forward_batch) -> LogitsProcessorOutput
    load_weights(SGLang's (name, tensor) iterator) -> atom_core.loader (mapping + coverage check)

A catalog capability may add a mixin before :class:`SGLangCausalLM` (``capabilities.mixins``): multimodal
models get :class:`atom_sglang.multimodal.SGLangMultimodal` (images through SGLang's embed routine).
Hybrid models need no mixin: their GDN layers get SGLang's state from the host
(:mod:`atom_sglang.linear_attention`), and the wrapper checks SGLang's state plan when it builds them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from atom_core import catalog, takeover
from atom_core.build import build_model
from atom_core.catalog import ArchSpec
from atom_core.config import text_config
from atom_core.env import env_take_over
from atom_core.errors import UnsupportedConfigError
from atom_sglang import capabilities, compat, drafts, lora
from atom_sglang.host import SGLangHost
from atom_sglang.linear_attention import check_state_plan
from atom_sglang.prefill_graph import install_body_forward

logger = logging.getLogger(__name__)

PROCESSED = "_atom_sglang_weights_processed"


class SGLangCausalLM(nn.Module):
    """Mixin placed before the ATOM model class in each generated wrapper's bases."""

    atom_spec: ArchSpec
    packed_modules_mapping: dict[str, list[str]]

    def __init__(self, config: Any, quant_config: Any = None, prefix: str = ""):
        name = type(self).__name__
        compat.check_buildable(name)
        lora.prepare(name)  # with LoRA on: SGLang's manager wraps ATOM's linear layers (or a one-line refusal)
        # SGLang's quant_config configures SGLang's layers; ATOM's layers read the checkpoint's
        # quantization_config with ATOM's own schemes.
        _, host = build_model(config, lambda quant: SGLangHost(quant=quant), into=self, prefix=prefix,
                              spec=self.atom_spec)
        self.atom_host = host
        install_body_forward(self, host)  # SGLang's prefill CUDA graphs call the body themselves
        # the checkpoint SGLang reads (its config comes from there): names a file its reader cannot open
        self.checkpoint_dir = getattr(config, "_name_or_path", None) or None
        if host.linear_attention_states:  # hybrid: SGLang must plan its state pool for exactly these layers
            check_state_plan(config, host.linear_attention_states, name)
        self.logits_processor = compat.logits_processor_class()(text_config(config))
        self.uses_mrope = uses_mrope(config)
        # SGLang reads the vocabulary size of get_input_embeddings() as nn.Embedding spells it
        self.get_input_embeddings().num_embeddings = text_config(config).vocab_size
        self._weights_loaded = False
        guard_weight_processing(self)
        logger.info("atom-sglang: SGLang builds %s on ATOM's %s", name, self.atom_spec.model)

    # ----------------------------------------------------------------------------------- forward
    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch: Any,
                input_embeds: torch.Tensor | None = None, pp_proxy_tensors: Any = None, get_embedding: bool = False):
        if pp_proxy_tensors is not None:
            raise UnsupportedConfigError(f"{type(self).__name__}: pipeline parallelism is not supported by ATOM models")
        if get_embedding:
            raise UnsupportedConfigError(f"{type(self).__name__}: ATOM serves it as a generation model, not embeddings")
        if self.uses_mrope and forward_batch.mrope_positions is not None:
            positions = forward_batch.mrope_positions  # [3, T]; SGLang leaves it None when serving text-only
        if input_embeds is not None:  # SGLang hands over bf16 whatever the model's dtype
            input_embeds = input_embeds.to(self.get_input_embeddings().weight.dtype)
        host = self.atom_host
        host.forward_batch = forward_batch
        try:
            hidden = self._run_model(input_ids, positions, forward_batch, input_embeds)
        finally:
            host.forward_batch = None
        if isinstance(hidden, tuple):  # an EAGLE-3 target with layers to capture: (hidden, [aux ...])
            hidden, aux = hidden
            return self.logits_processor(input_ids, hidden, self.lm_head, forward_batch, aux)
        return self.logits_processor(input_ids, hidden, self.lm_head, forward_batch)

    def _run_model(self, input_ids, positions, forward_batch, input_embeds):
        """The ATOM model's hidden states for this step (multimodal models first merge their images)."""
        return self.atom_forward(input_ids, positions, input_embeds)

    def atom_forward(self, input_ids, positions, inputs_embeds=None, **kwargs):
        """The ATOM model's own ``forward`` (this class's ``forward`` is SGLang's)."""
        return super().forward(input_ids, positions, inputs_embeds, **kwargs)

    def get_hidden_dim(self, module_name: str, layer_idx: int) -> tuple[int, int]:
        """SGLang's LoRA pool: input and output size of the linear layer a target names (``lora.hidden_dims``)."""
        return lora.hidden_dims(self, module_name, layer_idx)

    # ------------------------------------------------------------------------------------- weights
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The first call is the model load: every parameter must be written and every tensor used (a
        :class:`~atom_core.errors.CheckpointError` names the rest).  Later calls are SGLang's weight
        updates (``update_weights_from_tensor``...), which may carry a subset."""
        strict = not self._weights_loaded
        reset_weight_processing(self)
        loaded = super().load_weights(weights, strict=strict)
        self._weights_loaded = True
        return loaded

    def get_input_embeddings(self) -> nn.Module:
        for path in EMBEDDING_PATHS:
            if _has_submodule(self, path):
                return self.get_submodule(path)
        raise UnsupportedConfigError(f"{type(self).__name__}: no token embedding at {' or '.join(EMBEDDING_PATHS)}")

    def get_embed_and_head(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.get_input_embeddings().weight, self.lm_head.weight

    def set_embed_and_head(self, embed: torch.Tensor, head: torch.Tensor) -> None:
        """Share another model's embedding and head (SGLang's speculative decoding drafts)."""
        embedding = self.get_input_embeddings()
        del embedding.weight
        del self.lm_head.weight
        embedding.weight = embed
        self.lm_head.weight = head

    def get_attention_sliding_window_size(self) -> int | None:
        """The window SGLang plans its attention metadata for (exclusive of the query), or None."""
        return self.atom_host.sliding_window()


# Where ATOM's models keep their token embedding (decoders; multimodal models' language model).
EMBEDDING_PATHS = ("model.embed_tokens", "model.language_model.embed_tokens")


def _has_submodule(model: nn.Module, path: str) -> bool:
    try:
        model.get_submodule(path)
    except AttributeError:
        return False
    return True


def uses_mrope(config: Any) -> bool:
    """SGLang's own rule (ModelConfig.model_is_mrope): the text config's rope parameters carry mrope_section."""
    cfg = text_config(config)
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    return "mrope_section" in rope


def guard_weight_processing(model: nn.Module) -> None:
    """Make every layer's ``quant_method.process_weights_after_loading`` run once per load.

    SGLang's loader calls it on every module that has a ``quant_method`` (ATOM's layers included) after
    ``model.load_weights`` returns, and ATOM's loader has already run it: converting a layout twice would
    corrupt it.  ``load_weights`` clears the marks first, so a weight update converts again."""
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is None or getattr(method.process_weights_after_loading, "_atom_once", False):
            continue
        method.process_weights_after_loading = _once_per_load(method.process_weights_after_loading)


def _once_per_load(process):
    def once(layer: nn.Module) -> None:
        if getattr(layer, PROCESSED, False):
            return
        process(layer)
        setattr(layer, PROCESSED, True)

    once._atom_once = True
    return once


def reset_weight_processing(model: nn.Module) -> None:
    for module in model.modules():
        module.__dict__.pop(PROCESSED, None)


# ------------------------------------------------------------------------------------- generation
def wrapper_class(spec: ArchSpec, module: str) -> type:
    """The SGLang model class for ``spec``: named like the architecture, defined in ``module``; the
    capabilities' mixins (:func:`capabilities.mixins`) come first in its bases."""
    atom_class = spec.model_class()
    mixins = capabilities.mixins(spec)
    for mixin in mixins:
        lacking = [name for name in getattr(mixin, "REQUIRED", ()) if not hasattr(atom_class, name)]
        if lacking:
            raise UnsupportedConfigError(f"{spec.name}: ATOM's {atom_class.__name__} lacks {lacking}, which "
                                         f"{mixin.__name__} needs")
    mapper = getattr(atom_class, "weight_mapper", None)
    packed = mapper.packed_modules_mapping if mapper is not None else {}
    namespace = {
        "__module__": module,
        "__qualname__": spec.name,
        "__doc__": f"ATOM's {spec.name} ({spec.model}) inside SGLang.",
        "atom_spec": spec,
        # SGLang reads (and may extend) this dict on the class; one fresh dict per class.
        "packed_modules_mapping": {fused: list(parts) for fused, parts in packed.items()},
    }
    eagle = (drafts.Eagle3Target,) if spec.name in drafts.eagle3_targets() else ()
    return type(spec.name, (*mixins, *eagle, SGLangCausalLM, atom_class), namespace)


def entry_classes(module: str) -> list[type]:
    """One class per catalog architecture ATOM takes over (:mod:`atom_core.takeover`: do no harm): the wrapper when
    atom-sglang can serve it; else a class that refuses to build (:func:`refusing_class`), named in an error line at
    import, where :func:`leave_unserved` does not give it back to SGLang.  An architecture ATOM does not take over
    gets no class here, so SGLang resolves it to its own (0.5.21+ imports its built-in models when an architecture is
    missing from the external package; before, they are all registered and the external ones overwrite them).  A
    line in SGLang's log names the class that serves each architecture and why, once per process that imports this
    package (the launcher and each scheduler)."""
    _, skipped = capabilities.plan()
    platform = compat.platform()
    own = compat.own_architectures()
    decisions = [leave_unserved(d, skipped, own) for d in
                 takeover.decide_all("sglang", platform, catalog.ARCHITECTURES, own)]
    for line in takeover.summary("sglang", platform, decisions):
        logger.info("atom-sglang: %s", line)
    classes = []
    for name in (d.arch for d in decisions if d.atom):
        why = skipped.get(name)
        if why is None:
            try:
                classes.append(wrapper_class(catalog.get(name), module))
                continue
            except Exception as err:  # one broken catalog entry must not hide the others from SGLang
                logger.exception("atom-sglang could not build its SGLang class for %s", name)
                why = f"its SGLang class could not be built: {err}"
        logger.error("atom-sglang does not serve %s: %s. Its class refuses to build; unset "
                     "SGLANG_EXTERNAL_MODEL_PACKAGE to serve it with SGLang's own implementation.", name, why)
        classes.append(refusing_class(name, why, module))
    served = [cls.__name__ for cls in classes if issubclass(cls, SGLangCausalLM)]
    return classes + drafts.draft_classes(served, module)


def leave_unserved(decision: takeover.Decision, skipped: dict[str, str], own: frozenset[str]) -> takeover.Decision:
    """An architecture atom-sglang cannot serve yet (``skipped``: why) stays SGLang's own when SGLang has a class of
    its own and ATOM_TAKE_OVER did not name it (``all`` means every architecture ATOM can serve); named, or with no
    class of SGLang's, it gets the refusing class."""
    why = skipped.get(decision.arch)
    named = isinstance(take_over := env_take_over(), frozenset) and decision.arch in take_over
    if decision.atom and why is not None and decision.arch in own and not named:
        return takeover.Decision(decision.arch, False, f"atom-sglang cannot serve it yet ({why})")
    return decision


def refusing_class(name: str, why: str, module: str) -> type:
    """A model class named ``name`` whose construction raises, saying why atom-sglang cannot serve it (SGLang
    stops loading the model with that error)."""

    def __init__(self, config: Any = None, quant_config: Any = None, prefix: str = ""):
        raise UnsupportedConfigError(f"atom-sglang does not serve {name}: {why}. Unset SGLANG_EXTERNAL_MODEL_PACKAGE "
                                     "to serve it with SGLang's own implementation.")

    return type(name, (nn.Module,), {"__module__": module, "__qualname__": name, "__init__": __init__,
                                     "atom_refusal": why, "__doc__": f"atom-sglang refuses {name}: {why}"})
