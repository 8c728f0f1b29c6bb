"""The vLLM host: what an ATOM model gets from vLLM when it is built inside vLLM.

* attention: vLLM's own ``Attention`` layer (where it lives depends on the version: :mod:`atom_vllm.compat`),
  registered under the layer's dotted name; it reads the step's metadata (positions, sequence lengths, KV
  slots) from vLLM's forward context and owns the paged KV cache vLLM allocates for it.  ATOM's models
  pass it q/k/v of shape ``[T, heads * head_dim]``.  Latent attention (``mla=``) gets vLLM's ``MLAAttention``
  over vLLM's latent cache (:mod:`atom_vllm.latent`); sparse latent attention (DeepSeek-V3.2, GLM-5) a layer
  of atom-vllm's own over vLLM's paged cache (:mod:`atom_vllm.sparse`).
* linear_attention_state: a vLLM ``MambaBase`` layer over vLLM's mamba-state cache (:mod:`atom_vllm.hybrid`).
* tp: vLLM's tensor-parallel group (``vllm.distributed``).
* quant: atom-core's own parse of the checkpoint's ``quantization_config``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from atom_vllm import compat


class VllmTensorParallel:
    """vLLM's tensor-parallel group, in atom-core's :class:`~atom_core.host.TensorParallel` shape."""

    @property
    def rank(self) -> int:
        from vllm.distributed import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank()

    @property
    def world_size(self) -> int:
        from vllm.distributed import get_tensor_model_parallel_world_size

        return get_tensor_model_parallel_world_size()

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        from vllm.distributed import tensor_model_parallel_all_reduce

        return tensor_model_parallel_all_reduce(x)

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        from vllm.distributed import tensor_model_parallel_all_gather

        return tensor_model_parallel_all_gather(x, dim)


class VllmHost:
    def __init__(self, vllm_config: Any, quant: Any = None):
        self.vllm_config = vllm_config
        self.cache_config = vllm_config.cache_config
        self.tp = VllmTensorParallel()
        self.quant = quant
        self.attention_layers: dict[str, nn.Module] = {}
        self.linear_attention_layers: dict[str, nn.Module] = {}
        # this step's top-k positions from the last sparse attention layer with its own indexer (GLM-5's shared
        # layers reuse them: atom_vllm.sparse)
        self.sparse_selection: torch.Tensor | None = None
        # vLLM's attention backends take sinks in the model's dtype (FlashAttention-3 refuses fp32 ones; vLLM's own
        # gpt-oss stores them in bf16, as the checkpoints do)
        self.attention_sinks_dtype = vllm_config.model_config.dtype

    def _cache_config_for(self, sliding_window: int | None) -> Any:
        # vLLM's Attention falls back to the model-wide cache_config.sliding_window when a layer passes no
        # window of its own; ATOM decides per layer, so a full-attention layer gets a config without one.
        config = self.cache_config
        if sliding_window is None and config is not None and getattr(config, "sliding_window", None) is not None:
            config = copy.copy(config)
            config.sliding_window = None
        return config

    def attention(self, prefix: str, layer_id: int, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                  *, sliding_window: int | None = None, sinks: torch.Tensor | None = None, mla: Any = None) -> nn.Module:
        if mla is not None:
            if mla.sparse is not None:
                from atom_vllm.sparse import sparse_latent_attention

                layer = sparse_latent_attention(self, prefix, num_heads, scale, mla)
            else:
                from atom_vllm.latent import latent_attention

                layer = latent_attention(self.vllm_config, prefix, num_heads, scale, mla)
            self.attention_layers[prefix] = layer
            return layer
        extra = {"sinks": sinks} if sinks is not None else {}
        layer = compat.attention_class()(
            num_heads, head_dim, scale, num_kv_heads=num_kv_heads, cache_config=self._cache_config_for(sliding_window),
            quant_config=None, per_layer_sliding_window=sliding_window, prefix=prefix, **extra,
        )
        self.attention_layers[prefix] = layer
        return layer

    def linear_attention_state(self, prefix: str, layer_id: int, conv_shape, ssm_shape, dtype, mix) -> nn.Module:
        """A vLLM ``MambaBase`` layer holding this layer's conv and SSM state in vLLM's cache (see
        :mod:`atom_vllm.hybrid`): registered in vLLM's forward context, bound to its state blocks by vLLM,
        read per step from vLLM's GDN metadata; ``mix`` runs as one opaque op (a graph split point)."""
        from atom_vllm.hybrid import linear_attention_state

        layer = linear_attention_state(self.vllm_config, prefix, conv_shape, ssm_shape, dtype, mix)
        self.linear_attention_layers[prefix] = layer
        return layer
