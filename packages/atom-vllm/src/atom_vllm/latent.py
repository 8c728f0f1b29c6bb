"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) inside vLLM: vLLM's own ``MLAAttention`` layer over
vLLM's latent KV cache, fed by atom-core's latent-attention models.

vLLM sizes the cache from the config (one ``kv_lora_rank + qk_rope_head_dim`` row per token, its
``is_deepseek_mla`` model_type check), writes ``kv_c | k_pe`` into it, attends in the expanded form for
prompt tokens (``kv_b_proj`` applied to the latents) and in the absorbed form for decode (``W_UK``/``W_UV``
split once from ``kv_b_proj``'s dequantized weight after loading).  Two adaptations make atom-core's pieces
fit:

* :class:`LatentProjection` presents atom-core's ``kv_b_proj`` (any of its quantization schemes) the way
  vLLM's MLA code uses a vLLM linear layer: called as ``(out, bias)``, ``weight`` / ``params_dtype`` /
  ``input_size_per_partition`` read, and dequantized by applying ``quant_method`` to an identity matrix
  (vLLM's path for a scheme it does not know), which runs atom-core's own GEMM of that scheme;
* :class:`VllmLatentAttention` (vLLM's ``MLAAttention``) takes atom-core's flat shapes: ``q`` ``[T, H * qk]``,
  ``k_pe`` ``[T, rope]``, and returns ``[T, H * v]``.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import torch
from torch import nn

from atom_core.errors import UnsupportedConfigError
from atom_core.host import LatentAttentionSpec

MLA_ATTENTION_MODULE = "vllm.model_executor.layers.attention.mla_attention"  # every supported release


class _AtomLinearMethod:
    """The ``quant_method`` vLLM finds on :class:`LatentProjection`: ``apply(layer, x, bias)`` is atom-core's
    scheme applied to atom-core's layer (vLLM dequantizes an unknown scheme as ``apply(layer, I)ᵀ``)."""

    def apply(self, layer: LatentProjection, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        linear = layer.linear
        return linear.quant_method.apply(linear, x, bias)

    def process_weights_after_loading(self, layer: LatentProjection) -> None:
        """Nothing: atom-core's loader, which also calls this, processes the model's layer itself."""


class LatentProjection(nn.Module):
    """atom-core's ``kv_b_proj`` (``kv_lora_rank -> heads * (qk_nope + v)``, this rank's heads) as vLLM's MLA
    layer uses it.  Holds no parameters of its own: the model owns the projection (and loads it); this
    module reads it, so a scheme that replaces its parameters after loading is seen as it is now."""

    def __init__(self, linear: nn.Module):
        super().__init__()
        self._linear = [linear]  # a list keeps the model's layer out of this module's tree (loaded once, by the model)
        self.input_size_per_partition = linear.in_partition
        self.output_size_per_partition = sum(linear.out_partitions)
        self.params_dtype = torch.get_default_dtype()  # the model's activation dtype (it is built under it)
        self.quant_method = _AtomLinearMethod()
        self._weight: torch.Tensor | None = None  # set when vLLM replaces `weight` (see __setattr__)

    @property
    def linear(self) -> nn.Module:
        return self._linear[0]

    @property
    def weight(self) -> torch.Tensor:
        """atom-core's stored weight (its dtype and device are what vLLM reads), or what vLLM assigned."""
        return self._weight if self._weight is not None else self.linear.weight

    def __setattr__(self, name: str, value: Any) -> None:
        # vLLM's AMX MLA backend releases the raw weight once it has packed its own copy
        # (`kv_b_proj.weight = Parameter(empty)`): the assignment replaces what `weight` returns here.
        if name == "weight":
            self.__dict__["_weight"] = value
            return
        super().__setattr__(name, value)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        """``(x W^T, None)``: vLLM's linear call convention.  An FP8 input (vLLM's FP8 prefill casts the
        latents to the weight's dtype) is widened to the activation dtype: atom-core's schemes quantize
        their own inputs."""
        if x.element_size() == 1 and x.is_floating_point():
            x = x.to(self.params_dtype)
        return self.linear(x), None


class _LatentForward:
    """atom-core's ``forward(q, kv_c, k_pe)`` on vLLM's ``MLAAttention``."""

    def forward(self, q: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
        """``q`` ``[T, H * (nope + rope)]`` (rope applied), ``kv_c`` ``[T, kv_lora_rank]`` (normalised),
        ``k_pe`` ``[T, rope]`` (rotated) -> ``[T, H * v_head_dim]``."""
        tokens = q.shape[0]
        return super().forward(q.reshape(tokens, self.num_heads, self.qk_head_dim), kv_c,
                               k_pe.reshape(tokens, 1, self.qk_rope_head_dim),
                               output_shape=(tokens, self.num_heads * self.v_head_dim))


@functools.cache
def _layer_class() -> type:
    """``VllmLatentAttention``, built on first use (its base, vLLM's ``MLAAttention``, imports vLLM)."""
    base = importlib.import_module(MLA_ATTENTION_MODULE).MLAAttention
    return type("VllmLatentAttention", (_LatentForward, base),
                {"__module__": __name__, "__doc__": "vLLM's MLAAttention taking atom-core's shapes."})


def latent_attention(vllm_config: Any, prefix: str, num_heads: int, scale: float, mla: LatentAttentionSpec) -> nn.Module:
    """The layer :meth:`atom_vllm.host.VllmHost.attention` returns for ``mla``: vLLM's ``MLAAttention``
    registered in vLLM's forward context under ``prefix``, over ``num_heads`` (this rank's) query heads."""
    dcp = getattr(vllm_config.parallel_config, "decode_context_parallel_size", 1) or 1
    if dcp > 1:
        raise UnsupportedConfigError(f"{prefix}: decode context parallelism ({dcp}) is not supported by atom-vllm's "
                                     "latent attention yet; run without it, or with ATOM_DISABLE_VLLM_PLUGIN=1")
    text = vllm_config.model_config.hf_text_config
    return _layer_class()(
        num_heads=num_heads, scale=scale, qk_nope_head_dim=mla.qk_nope_head_dim,
        qk_rope_head_dim=mla.qk_rope_head_dim, v_head_dim=mla.v_head_dim,
        q_lora_rank=getattr(text, "q_lora_rank", None) or None, kv_lora_rank=mla.kv_lora_rank,
        kv_b_proj=LatentProjection(mla.kv_b_proj), cache_config=vllm_config.cache_config, quant_config=None,
        prefix=prefix,
    )
