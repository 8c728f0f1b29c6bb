"""ATOM's attention modules under SGLang as SGLang's layer setup sees them."""

from __future__ import annotations

from typing import Any


class RadixAttentionView:
    """A module wrapping SGLang's RadixAttention as ``self.attn`` that also reads as it.

    SGLang's layer setup (``compute_attention_and_moe_layers``) takes ``layer.self_attn.attn`` as a layer's attention,
    which in ATOM's models is this wrapper, and under its prefill CUDA graphs RadixAttention calls the attention
    backend through SGLang's unified attention op with that module as the layer: what the backend reads of it
    (``k_scale``, ``tp_q_head_num``, ``layer_id``...) and the wrapper lacks comes from the RadixAttention."""

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "attn" or name.startswith("__"):
                raise
            return getattr(super().__getattr__("attn"), name)
