"""atom-vllm's sparse attention layer (:mod:`atom_vllm.sparse`) built under a vLLM config on vLLM's CPU platform:
the cache spec it reports, its registration, what it refuses, that platform's answer to a sparse latent-attention
layer of vLLM's own, and which of the catalog's sparse-attention architectures vLLM's own registry serves; reports,
as JSON, what vLLM sees.

    python sparse_probe.py OUT_JSON

Runs in a fresh process: the CPU platform must be in place before vLLM is imported (:mod:`vllm_probe`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

BLOCK_SIZE, KV_LORA_RANK, ROPE, INDEX_DIM = 16, 512, 64, 128  # DeepSeek-V3.2's latent row and indexer key
NAME = "model.layers.0.self_attn.attn"


def probe() -> dict:
    import torch
    from torch import nn
    from vllm import ModelRegistry
    from vllm.config import CacheConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.v1.attention.selector import get_attn_backend

    from atom_core import catalog
    from atom_core.errors import UnsupportedConfigError
    from atom_core.host import LatentAttentionSpec, SparseSelectionSpec
    from atom_vllm.sparse import sparse_latent_attention

    mla = LatentAttentionSpec(KV_LORA_RANK, 32, ROPE, 32, nn.Linear(KV_LORA_RANK, 64),
                              SparseSelectionSpec(INDEX_DIM, 8, 0.1))
    config = VllmConfig(cache_config=CacheConfig(block_size=BLOCK_SIZE))
    own = set(ModelRegistry.get_supported_archs())
    out: dict = {"own_sparse_archs": {spec.name: spec.name in own for spec in catalog.ARCHITECTURES.values()
                                      if catalog.SPARSE_ATTENTION in spec.capabilities}}
    with set_current_vllm_config(config):
        host = SimpleNamespace(vllm_config=config, sparse_selection=None)  # what the layer reads of VllmHost
        layer = sparse_latent_attention(host, NAME, 2, 0.1, mla)
        spec = layer.get_kv_cache_spec(config)
        out["spec"] = {"class": type(spec).__name__, "block_size": spec.block_size, "num_kv_heads": spec.num_kv_heads,
                       "head_size": spec.head_size, "dtype": str(spec.dtype)}
        out["layer_base"] = isinstance(layer, AttentionLayerBase)
        out["backend"] = {"mla": layer.get_attn_backend().is_mla(),
                          "shape": list(layer.get_attn_backend().get_kv_cache_shape(3, BLOCK_SIZE, 1, spec.head_size))}
        out["registered"] = config.compilation_config.static_forward_context.get(NAME) is layer
        refusals = {}
        for what, attempt in {
            "duplicate": lambda: sparse_latent_attention(host, NAME, 2, 0.1, mla),
            "fp8_cache": lambda: sparse_latent_attention(SimpleNamespace(vllm_config=VllmConfig(cache_config=CacheConfig(
                block_size=BLOCK_SIZE, cache_dtype="fp8"))), "model.layers.1.self_attn.attn", 2, 0.1, mla),
        }.items():
            try:
                attempt()
                refusals[what] = None
            except UnsupportedConfigError as err:
                refusals[what] = str(err)
        out["refusals"] = refusals
        try:
            get_attn_backend(KV_LORA_RANK + ROPE, torch.float32, "auto", use_mla=True, use_sparse=True)
            out["sparse_backend"] = "selected"
        except (NotImplementedError, ValueError) as err:
            out["sparse_backend"] = f"{type(err).__name__}: {err}"
    return out


def main(out: str) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from vllm_probe import _cpu_platform_without_triton, _force_cpu_platform

    _force_cpu_platform()
    _cpu_platform_without_triton()
    Path(out).write_text(json.dumps(probe(), indent=1))
    os._exit(0)  # vLLM's background threads sometimes keep a finished process alive


if __name__ == "__main__":
    main(sys.argv[1])
