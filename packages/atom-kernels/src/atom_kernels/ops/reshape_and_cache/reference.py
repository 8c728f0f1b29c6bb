"""Plain-torch cache write: assign the valid tokens' rows at their (block, offset)."""

from __future__ import annotations

import torch

from atom_kernels.formats import FP8_MAX


def check_cache_args(k, v, k_cache, v_cache, slot_mapping) -> None:
    if k.dim() != 3 or k_cache.dim() != 4 or tuple(k.shape[1:]) != tuple(k_cache.shape[2:]):
        raise ValueError(f"reshape_and_cache: k {tuple(k.shape)} must be [T, kv_heads, D] and k_cache "
                         f"{tuple(k_cache.shape)} [num_blocks, block_size, kv_heads, D]")
    if v.dim() != 3 or v_cache.dim() != 4 or tuple(v.shape[1:]) != tuple(v_cache.shape[2:]):
        raise ValueError(f"reshape_and_cache: v {tuple(v.shape)} and v_cache {tuple(v_cache.shape)} disagree")
    if tuple(slot_mapping.shape) != (k.shape[0],) or v.shape[0] != k.shape[0]:
        raise ValueError(f"reshape_and_cache: slot_mapping {tuple(slot_mapping.shape)} must be [T], T = {k.shape[0]}")


def _store_dtype(x: torch.Tensor, scale, cache: torch.Tensor) -> torch.Tensor:
    if scale is not None:
        x = x.float() / scale.float().reshape(())
    if cache.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz):
        fp8_max = FP8_MAX if cache.dtype == torch.float8_e4m3fn else 240.0
        x = x.float().clamp(-fp8_max, fp8_max)
    return x.to(cache.dtype)


def reshape_and_cache(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None):
    check_cache_args(k, v, k_cache, v_cache, slot_mapping)
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    block, offset = slots // k_cache.shape[1], slots % k_cache.shape[1]  # indexed in place, whatever the strides
    k_cache[block, offset] = _store_dtype(k[valid], k_scale, k_cache)
    v_cache[block, offset] = _store_dtype(v[valid], v_scale, v_cache)
