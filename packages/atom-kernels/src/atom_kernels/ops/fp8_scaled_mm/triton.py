"""Triton per-row x per-column scaled FP8 GEMM (the kernel lives in ``fp8_gemm``)."""

from __future__ import annotations

import torch

from atom_kernels.ops.fp8_gemm import fp8_gemm


def unsupported(a, a_scale, b, b_scale, bias=None, out_dtype=torch.bfloat16) -> str | None:
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        return f"shapes a {tuple(a.shape)} and b {tuple(b.shape)} do not multiply"
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        return "operands must be float8_e4m3fn"
    if a.stride(1) != 1 or b.stride(1) != 1:
        return "operands must be K-contiguous"
    if a_scale.numel() != a.shape[0] or b_scale.numel() != b.shape[0]:
        return "scales must be one per row of a and one per row of b"
    return None


def fp8_scaled_mm(a, a_scale, b, b_scale, bias=None, out_dtype=torch.bfloat16, config=None):
    return fp8_gemm(a, b, a_scale.float(), b_scale.float(), bias, out_dtype, blockwise=False, config=config)
