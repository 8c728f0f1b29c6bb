"""AITER per-token x per-channel FP8 GEMM (ROCm ``aiter.gemm_a8w8``). Unverified here: nobody on
the team has an AMD GPU.  ``gemm_a8w8(XQ [M, K], WQ [N, K], x_scale [M, 1], w_scale [1, N], bias,
dtype)``; the operands must be the platform's fp8 type (e4m3fnuz on MI300), so e4m3fn tensors are
accepted only on MI350 (gfx950)."""

from __future__ import annotations

import functools

import torch


@functools.cache
def _arch_has_e4m3fn() -> bool:
    return getattr(torch.cuda.get_device_properties(0), "gcnArchName", "").startswith("gfx950")


def unsupported(a, a_scale, b, b_scale, bias=None, out_dtype=torch.bfloat16) -> str | None:
    if out_dtype not in (torch.bfloat16, torch.float16):
        return f"aiter gemm_a8w8 writes bf16/fp16, not {out_dtype}"
    if not _arch_has_e4m3fn():
        return "this GPU's AITER fp8 type is e4m3fnuz, not e4m3fn"
    return None


def fp8_scaled_mm(a, a_scale, b, b_scale, bias=None, out_dtype=torch.bfloat16):
    import aiter

    return aiter.gemm_a8w8(a, b, a_scale.float().reshape(-1, 1), b_scale.float().reshape(1, -1), bias, out_dtype)
