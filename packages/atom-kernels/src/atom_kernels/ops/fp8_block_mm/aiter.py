"""AITER block-scaled FP8 GEMM (ROCm ``aiter.gemm_a8w8_blockscale(XQ [M, K], WQ [N, K], x_scale
[M, K/128], w_scale [N/128, K/128], dtype)``). Unverified here: nobody on the team has an AMD GPU;
older AITER releases took ``x_scale`` transposed (``[K/128, M]``)."""

from __future__ import annotations

import functools

import torch


@functools.cache
def _arch_has_e4m3fn() -> bool:
    return getattr(torch.cuda.get_device_properties(0), "gcnArchName", "").startswith("gfx950")


def unsupported(a, a_scale, b, b_scale, block_size=(128, 128), bias=None, out_dtype=torch.bfloat16) -> str | None:
    if tuple(block_size) != (128, 128):
        return "aiter gemm_a8w8_blockscale takes 128x128 blocks"
    if bias is not None:
        return "aiter gemm_a8w8_blockscale takes no bias"
    if out_dtype not in (torch.bfloat16, torch.float16):
        return f"aiter writes bf16/fp16, not {out_dtype}"
    if not _arch_has_e4m3fn():
        return "this GPU's AITER fp8 type is e4m3fnuz, not e4m3fn"
    return None


def fp8_block_mm(a, a_scale, b, b_scale, block_size=(128, 128), bias=None, out_dtype=torch.bfloat16):
    import aiter

    return aiter.gemm_a8w8_blockscale(a, b, a_scale.float().contiguous(), b_scale.float().contiguous(), dtype=out_dtype)
