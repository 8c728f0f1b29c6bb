"""The native host: builds attention over ATOM's paged KV cache and holds the step context."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from atom_core.errors import UnsupportedConfigError
from atom_core.host import SingleRank, TensorParallel
from atom_core.runtime.attention import PagedAttention
from atom_core.runtime.context import StepContext
from atom_core.runtime.kv_cache import KVCache


class NativeHost:
    def __init__(self, tp: TensorParallel | None = None, quant: Any = None):
        self.tp = tp or SingleRank()
        self.quant = quant
        self.context: StepContext | None = None
        self.kv_cache: KVCache | None = None
        self.attention_layers: list[PagedAttention] = []

    def attention(self, prefix: str, layer_id: int, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                  *, sliding_window: int | None = None, sinks: torch.Tensor | None = None, mla: Any = None) -> nn.Module:
        if mla is not None:
            raise UnsupportedConfigError(f"{prefix}: the native host has no MLA attention")
        layer = PagedAttention(self, len(self.attention_layers), num_heads, num_kv_heads, head_dim, scale,
                               sliding_window, sinks)
        self.attention_layers.append(layer)
        return layer

    def linear_attention_state(self, prefix: str, layer_id: int, conv_shape, ssm_shape, dtype):
        raise UnsupportedConfigError(f"{prefix}: linear-attention state is not available in this build")

    def allocate_kv_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device) -> KVCache:
        shapes = [(layer.num_kv_heads, layer.head_dim) for layer in self.attention_layers]
        self.kv_cache = KVCache(shapes, num_blocks, block_size, dtype, device)
        return self.kv_cache
