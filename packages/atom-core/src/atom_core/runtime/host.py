"""The native host: builds attention over ATOM's paged KV cache and holds the step context."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from atom_core.errors import UnsupportedConfigError
from atom_core.host import SingleRank, TensorParallel
from atom_core.runtime.attention import PagedAttention
from atom_core.runtime.compressed_attention import CompressedAttention
from atom_core.runtime.context import StepContext
from atom_core.runtime.kv_cache import KVCache
from atom_core.runtime.latent_attention import LatentAttention
from atom_core.runtime.sparse_attention import SparseLatentAttention
from atom_core.runtime.state_pool import NativeLinearAttentionState, StatePool, StateSpec
from atom_kernels.gdn import K_MAJOR


class NativeHost:
    linear_attention_layout = K_MAJOR  # the layout of its GDN SSM state pools (a class attribute tests may change)
    attention_sinks_dtype = torch.float32  # ATOM's paged attention reads sinks in fp32

    def __init__(self, tp: TensorParallel | None = None, quant: Any = None, max_positions: int | None = None):
        self.tp = tp or SingleRank()
        # the positions the model's rotary tables cover (None: the config's max_position_embeddings); the runner
        # sizes them by what it runs and grows them (atom_core.layers.rotary.grow_position_tables)
        self.max_positions = max_positions
        self.quant = quant
        self.context: StepContext | None = None
        self.kv_cache: KVCache | None = None
        self.attention_layers: list[PagedAttention | LatentAttention | CompressedAttention] = []
        self.state_specs: list[StateSpec] = []
        self.state_pool: StatePool | None = None
        # this step's top-k positions from the last sparse attention layer with its own indexer (GLM-5's shared
        # layers reuse them)
        self.sparse_selection: torch.Tensor | None = None

    def attention(self, prefix: str, layer_id: int, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                  *, sliding_window: int | None = None, sinks: torch.Tensor | None = None, mla: Any = None,
                  compressed: Any = None) -> nn.Module:
        if compressed is not None:
            if mla is not None or sliding_window is None or sinks is None or num_kv_heads != 1:
                raise UnsupportedConfigError(f"{prefix}: compressed attention takes one shared K=V head, a sliding "
                                             "window and sinks, and no latent attention")
            layer = CompressedAttention(self, len(self.attention_layers), num_heads, head_dim, scale, sliding_window,
                                        sinks, compressed)
            self.attention_layers.append(layer)
            return layer
        if mla is not None:
            if sliding_window is not None or sinks is not None:
                raise UnsupportedConfigError(f"{prefix}: latent attention with a sliding window or sinks")
            latent_class = SparseLatentAttention if mla.sparse is not None else LatentAttention
            layer = latent_class(self, len(self.attention_layers), num_heads, scale, mla)
            self.attention_layers.append(layer)
            return layer
        layer = PagedAttention(self, len(self.attention_layers), num_heads, num_kv_heads, head_dim, scale,
                               sliding_window, sinks)
        self.attention_layers.append(layer)
        return layer

    def linear_attention_state(self, prefix: str, layer_id: int, conv_shape, ssm_shape, dtype,
                               mix) -> NativeLinearAttentionState:
        """Per-sequence GDN state in this host's pool (SSM state in fp32, ``ssm_layout`` K-major)."""
        self.state_specs.append(StateSpec(prefix, tuple(conv_shape), tuple(ssm_shape), dtype, torch.float32))
        return NativeLinearAttentionState(self, len(self.state_specs) - 1, mix, self.linear_attention_layout)

    def allocate_state_pool(self, num_slots: int, device: torch.device) -> StatePool | None:
        """Pools for ``num_slots`` sequences (None when the model has no linear-attention layers)."""
        if self.state_specs and (self.state_pool is None or self.state_pool.num_slots < num_slots):
            self.state_pool = StatePool(self.state_specs, num_slots, self.linear_attention_layout, device)
        return self.state_pool

    def allocate_kv_cache(self, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device) -> KVCache:
        shapes = [layer.kv_shapes for layer in self.attention_layers]
        self.kv_cache = KVCache(shapes, num_blocks, block_size, dtype, device)
        return self.kv_cache
