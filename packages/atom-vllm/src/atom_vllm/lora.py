"""vLLM's LoRA manager driving ATOM's linear layers (``--enable-lora``, ``LoRARequest``).

vLLM loads, batches and evicts the adapters as it does for its own classes; each of ATOM's linear layers gets an
:class:`atom_core.lora.LoraSlots` (``max_loras`` slots of ``max_lora_rank`` per output shard, a fused q|k|v or
gate|up layer included) that :class:`AtomLinearWithLoRA` writes when vLLM activates an adapter in a slot and
clears when it evicts one.  The layer adds the delta itself, over any base weight format; each token's slot is
vLLM's punica wrapper's ``token_lora_indices`` (``-1``: no adapter).

What vLLM then refuses itself (its adapter loader checks the adapter's modules against the model's LoRA modules,
naming the unexpected ones): adapters on MoE experts, routers that are not linear layers, embeddings and the LM
head.  Refused here, one line each, when ATOM's class is built: a vLLM release whose LoRA internals were not
checked (:data:`atom_vllm.compat.LORA_INTERNALS_CHECKED`) and ``fully_sharded_loras``.
"""

from __future__ import annotations

import functools
from typing import Any

from atom_core.errors import UnsupportedConfigError
from atom_core.layers.linear import LinearBase
from atom_core.lora import LoraSlots
from atom_vllm import compat


def adapts(module: Any) -> bool:
    """An ATOM linear layer that applies a LoRA delta in its forward (not latent attention's absorbed kv_b_proj)."""
    return isinstance(module, LinearBase) and module.adapts_in_forward


class PunicaTokens:
    """Each token's slot for :class:`~atom_core.lora.LoraSlots`: vLLM's punica wrapper's ``token_lora_indices``
    (vLLM refreshes them before every step), None until vLLM gives the layer its wrapper."""

    def __init__(self) -> None:
        self.punica_wrapper = None

    @property
    def token_adapter(self):
        return None if self.punica_wrapper is None else self.punica_wrapper.token_lora_indices


@functools.cache
def wrapper_class() -> type:
    """``AtomLinearWithLoRA``, built on first use (it subclasses vLLM's ``BaseLayerWithLoRA``)."""
    from vllm.lora.layers import BaseLayerWithLoRA

    class AtomLinearWithLoRA(BaseLayerWithLoRA):
        """One of ATOM's linear layers under vLLM's LoRA manager: ``set_lora``'s tensors (full size, B scaled by
        vLLM; a list per packed checkpoint module for a fused layer, None where the adapter has none) go to the
        layer's shards in order."""

        def __init__(self, base_layer: LinearBase):
            super().__init__()
            self.base_layer = base_layer
            self.tokens = PunicaTokens()

        @classmethod
        def can_replace_layer(cls, source_layer, lora_config, packed_modules_list, model_config=None) -> bool:
            if not adapts(source_layer):
                return False
            shards = len(source_layer.shard_ids)
            if shards > 1 and len(packed_modules_list) != shards:
                raise UnsupportedConfigError(
                    f"{source_layer.prefix}: vLLM packs {packed_modules_list} into it but ATOM's layer has {shards} "
                    "shards: the model's packed_modules_mapping does not match its layers")
            return True

        def create_lora_weights(self, max_loras: int, lora_config, model_config=None) -> None:
            self.base_layer.lora = LoraSlots(self.tokens, self.base_layer, max_loras, lora_config.max_lora_rank)

        def reset_lora(self, index: int) -> None:
            self.base_layer.lora.clear(index)

        def set_lora(self, index: int, lora_a, lora_b) -> None:
            a_list = lora_a if isinstance(lora_a, list) else [lora_a]
            b_list = lora_b if isinstance(lora_b, list) else [lora_b]
            shards = len(self.base_layer.shard_ids)
            if len(a_list) != shards or len(b_list) != shards:
                raise UnsupportedConfigError(f"{self.base_layer.prefix}: vLLM gives {len(a_list)} LoRA modules for "
                                             f"ATOM's layer of {shards} shards")
            self.base_layer.lora.clear(index)
            for shard, (a, b) in enumerate(zip(a_list, b_list)):
                if a is not None and b is not None:
                    self.base_layer.lora.write(index, shard, a, b, f"LoRA slot {index}: {self.base_layer.prefix}")

        def set_mapping(self, punica_wrapper) -> None:
            self.punica_wrapper = punica_wrapper
            self.tokens.punica_wrapper = punica_wrapper

        def forward(self, *args, **kwargs):
            return self.base_layer(*args, **kwargs)

    return AtomLinearWithLoRA


def prepare(vllm_config: Any, arch: str) -> None:
    """Called as ATOM's class is built: with LoRA on, let vLLM's manager wrap ATOM's layers (or refuse, one line)."""
    lora_config = getattr(vllm_config, "lora_config", None)
    if lora_config is None:
        return
    version = compat.vllm_version()
    if not compat.lora_internals_checked(version):
        raise UnsupportedConfigError(
            f"{arch}: vLLM's LoRA (--enable-lora) with ATOM's class is checked on vLLM "
            f"{', '.join(compat.LORA_INTERNALS_CHECKED)} only (it hooks vLLM's LoRA internals), not {version}; set "
            f"ATOM_TAKE_OVER=none, or leave {arch} out of it, to serve it with vLLM's own class")
    if getattr(lora_config, "fully_sharded_loras", False):
        raise UnsupportedConfigError(f"{arch}: vLLM's --fully-sharded-loras is not supported with ATOM's class; "
                                     "leave it off (ATOM's layers shard the adapters as their weights)")
    compat.install_lora_layers(wrapper_class(), adapts)
