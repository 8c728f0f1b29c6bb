"""DeepSeek sparse attention (DeepSeek-V3.2, GLM-5) inside vLLM, for atom-core's sparse latent-attention models.

Each sparse layer is one vLLM attention layer of its own, :class:`VllmSparseLatentAttention`, registered in vLLM's
forward context under the layer's name.  It reports an ``MLAAttentionSpec`` whose row per token is the latent
``kv_c | k_pe`` followed by the token's indexer key (``index_head_dim``, the model's dtype; a layer without its own
indexer, GLM-5's shared ones, keeps those columns unused so every layer has the same page size and vLLM puts them in
one cache group).  vLLM sizes, allocates and binds that cache; its metadata comes from atom-vllm's own backend
(:class:`AtomSparseLatentBackend`, the builder of :mod:`atom_vllm.attention_backend`: ``query_start_loc``,
``seq_lens``, ``block_table``, ``slot_mapping``), so vLLM's platform is never asked for a sparse MLA backend (its
CPU platform refuses one: "Sparse Attention is not supported on CPU.").  Every step, prompt and decode alike, runs
atom-core's native step (:func:`atom_core.runtime.sparse_attention.sparse_step`) over that cache:

    latent row and indexer key of each new token -> the cache, at slot_mapping
    scores    = indexer_scores(index_q, weights, the indexer keys of each request's context)
    positions = topk_indices(scores, topk)
    out       = sparse_mla(absorbed q, the latent rows at those positions)

Refused at construction, in one line each: any ``kv_cache_dtype`` but ``auto`` (FP8 caches among them), decode context parallelism,
speculative decoding.  Refused at the first forward: a step captured in a CUDA graph (serve with ``enforce_eager``:
the step has not been checked under vLLM's graph padding) and vLLM's micro-batches (dual-batch overlap).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any, ClassVar

import torch
from torch import nn

from atom_core.errors import UnsupportedConfigError
from atom_core.host import LatentAttentionSpec
from atom_core.runtime.latent_attention import LatentAttention
from atom_core.runtime.sparse_attention import sparse_step
from atom_vllm import compat

MODEL_DTYPE_CACHES = ("auto",)  # vLLM's cache_dtype values this layer serves: the model's dtype
SPEC_MODULE = "vllm.v1.kv_cache_interface"  # MLAAttentionSpec, every supported release
LAYER_BASE = "vllm.model_executor.layers.attention_layer_base"  # AttentionLayerBase, every supported release


def check_config(vllm_config: Any, prefix: str) -> None:
    """An :class:`UnsupportedConfigError` naming the first setting this layer cannot serve."""
    cache_dtype = str(getattr(vllm_config.cache_config, "cache_dtype", "auto"))
    if cache_dtype not in MODEL_DTYPE_CACHES:
        raise UnsupportedConfigError(f"{prefix}: atom-vllm's sparse attention keeps its cache in the model's dtype, "
                                     f"not kv_cache_dtype={cache_dtype}; serve without --kv-cache-dtype")
    dcp = getattr(vllm_config.parallel_config, "decode_context_parallel_size", 1) or 1
    if dcp > 1:
        raise UnsupportedConfigError(f"{prefix}: decode context parallelism ({dcp}) is not supported by atom-vllm's "
                                     "sparse attention; run without it")
    if getattr(vllm_config, "speculative_config", None) is not None:
        raise UnsupportedConfigError(f"{prefix}: speculative decoding with atom-vllm's sparse attention is not "
                                     "supported; serve without --speculative-config")


@functools.cache
def backend_class() -> type:
    """``AtomSparseLatentBackend``: atom-vllm's attention backend (its metadata builder) with a latent cache of one
    ``head_size`` row per token, built on first use (it imports vLLM)."""
    from atom_vllm.attention_backend import AtomAttentionBackend

    class AtomSparseLatentBackend(AtomAttentionBackend):
        supported_kv_cache_dtypes: ClassVar[list[str]] = list(MODEL_DTYPE_CACHES)

        @staticmethod
        def get_impl_cls():
            raise NotImplementedError("VllmSparseLatentAttention attends itself; it has no vLLM AttentionImpl")

        @classmethod
        def is_mla(cls) -> bool:
            return True

        @classmethod
        def supports_head_size(cls, head_size: int) -> bool:
            return head_size > 0

        # up to 0.27 vLLM asks the backend for the cache shape; from 0.32 it makes the MLA shape itself
        @staticmethod
        def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_size: int,
                               cache_dtype_str: str = "auto") -> tuple[int, ...]:
            return (num_blocks, block_size, head_size)

        @staticmethod
        def get_kv_cache_stride_order(include_num_layers_dimension: bool = False) -> tuple[int, ...]:
            return (1, 0, 2, 3) if include_num_layers_dimension else (0, 1, 2)

    return AtomSparseLatentBackend


class _SparseLatentAttention(LatentAttention):
    """``forward(q, kv_c, k_pe, index) -> out`` over vLLM's paged cache: a vLLM attention layer (vLLM finds it in its
    forward context, sizes its cache from :meth:`get_kv_cache_spec` and binds it as ``kv_cache``) that is atom-core's
    latent attention (``w_uk`` / ``w_uv`` split after loading by :meth:`finish_loading`)."""

    def __init__(self, host: Any, prefix: str, num_heads: int, scale: float, mla: LatentAttentionSpec):
        super().__init__(host, -1, num_heads, scale, mla)
        self.sparse = mla.sparse
        self.layer_name = prefix
        self.row = self.kv_lora_rank + self.rope_dim + self.sparse.index_head_dim
        self.kv_cache: Any = torch.tensor([])  # until vLLM binds its blocks
        self.kv_sharing_target_layer_name = None
        compat.register_forward_context_layer(host.vllm_config, prefix, self)

    # -- vLLM's AttentionLayerBase
    def get_attn_backend(self) -> type:
        return backend_class()

    def get_kv_cache_spec(self, vllm_config: Any) -> Any:
        spec = importlib.import_module(SPEC_MODULE).MLAAttentionSpec
        return spec(block_size=vllm_config.cache_config.block_size, num_kv_heads=1, head_size=self.row,
                    dtype=self.dtype)

    def bind_kv_cache(self, kv_cache: Any) -> None:
        self.kv_cache = kv_cache

    # -- atom-core's sparse latent attention
    def forward(self, q: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor,
                index: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        from vllm.forward_context import get_forward_context

        host = self._host[0]
        if self.w_uk is None:
            raise RuntimeError(f"{self.layer_name}: sparse attention used before its weights were loaded")
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise UnsupportedConfigError(f"{self.layer_name}: atom-vllm's sparse attention is not run in CUDA graphs; "
                                         "serve with enforce_eager (--enforce-eager)")
        metadata = get_forward_context().attn_metadata
        if isinstance(metadata, list):  # one metadata dict per micro-batch
            raise UnsupportedConfigError(f"{self.layer_name}: atom-vllm's sparse attention does not run vLLM's "
                                         "micro-batches (dual-batch overlap); serve without --enable-dbo")
        md = metadata.get(self.layer_name) if isinstance(metadata, dict) else None
        if md is None:  # vLLM's profiling and warm-up runs: no cache bound, nothing to attend
            return q.new_zeros(q.shape[0], self.num_heads * self.v_dim)
        rows = compat.latent_cache_rows(self.kv_cache)[..., None, :]  # [blocks, block_size, 1, row]
        latent = self.kv_lora_rank + self.rope_dim
        out, host.sparse_selection = sparse_step(
            self, q, kv_c, k_pe, index, rows[..., :latent], rows[..., latent:], md.slot_mapping, md.block_table,
            md.seq_lens, md.query_start_loc, host.sparse_selection)
        return out


@functools.cache
def layer_class() -> type:
    """``VllmSparseLatentAttention``, built on first use: its base, vLLM's ``AttentionLayerBase``, is how vLLM finds
    the layers it makes caches for."""
    base = importlib.import_module(LAYER_BASE).AttentionLayerBase
    return type("VllmSparseLatentAttention", (_SparseLatentAttention, base),
                {"__module__": __name__, "__doc__": _SparseLatentAttention.__doc__})


def sparse_latent_attention(host: Any, prefix: str, num_heads: int, scale: float, mla: LatentAttentionSpec) -> nn.Module:
    """The layer :meth:`atom_vllm.host.VllmHost.attention` returns for a sparse ``mla`` (this rank's heads)."""
    check_config(host.vllm_config, prefix)
    return layer_class()(host, prefix, num_heads, scale, mla)
