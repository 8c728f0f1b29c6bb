"""atom-vllm's indexer-key cache (:mod:`atom_vllm.sparse`) built under a vLLM config on vLLM's CPU platform, that
platform's answer to a sparse latent-attention layer, and which of the catalog's sparse-attention architectures vLLM's
own registry serves; reports, as JSON, what vLLM sees.

    python sparse_cache_probe.py OUT_JSON

Runs in a fresh process: the CPU platform must be in place before vLLM is imported (:mod:`vllm_probe`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

BLOCK_SIZE, HEAD_DIM, LATENT = 16, 64, 576  # LATENT: DeepSeek-V3's kv_lora_rank + qk_rope_head_dim
NAME = "model.layers.0.self_attn.indexer.k_cache"


def probe() -> dict:
    import torch
    from vllm import ModelRegistry
    from vllm.config import CacheConfig, VllmConfig, set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    from atom_core import catalog
    from atom_vllm.sparse import indexer_key_cache

    config = VllmConfig(cache_config=CacheConfig(block_size=BLOCK_SIZE))
    own = set(ModelRegistry.get_supported_archs())
    out: dict = {"own_sparse_archs": {spec.name: spec.name in own for spec in catalog.ARCHITECTURES.values()
                                      if catalog.SPARSE_ATTENTION in spec.capabilities}}
    with set_current_vllm_config(config):
        layer = indexer_key_cache(config, NAME, HEAD_DIM, torch.float32)
        spec = layer.get_kv_cache_spec(config)
        out["spec"] = {"class": type(spec).__name__, "block_size": spec.block_size, "num_kv_heads": spec.num_kv_heads,
                       "head_size": spec.head_size, "dtype": str(spec.dtype)}
        out["registered"] = config.compilation_config.static_forward_context.get(NAME) is layer
        try:
            indexer_key_cache(config, NAME, HEAD_DIM, torch.float32)
            out["duplicate"] = None
        except ValueError as err:
            out["duplicate"] = str(err)
        try:
            get_attn_backend(LATENT, torch.float32, "auto", use_mla=True, use_sparse=True)
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
