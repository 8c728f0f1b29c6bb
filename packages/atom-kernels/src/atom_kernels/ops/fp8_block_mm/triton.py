"""Triton block-scaled FP8 GEMM: K steps of exactly one scale block (128), each block's partial
product scaled by its activation-group and weight-block scales (kernel in ``fp8_gemm``)."""

from __future__ import annotations

import torch

from atom_kernels.ops.fp8_gemm import fp8_gemm

SCALE_BLOCK_K = 128


def unsupported(a, a_scale, b, b_scale, block_size=(128, 128), bias=None, out_dtype=torch.bfloat16) -> str | None:
    bn, bk = block_size
    if bk != SCALE_BLOCK_K:
        return f"the Triton kernel steps K in blocks of {SCALE_BLOCK_K}, not {bk}"
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        return f"shapes a {tuple(a.shape)} and b {tuple(b.shape)} do not multiply"
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        return "operands must be float8_e4m3fn"
    if a.stride(1) != 1 or b.stride(1) != 1:
        return "operands must be K-contiguous"
    kb = -(-a.shape[1] // bk)
    if tuple(a_scale.shape) != (a.shape[0], kb) or tuple(b_scale.shape) != (-(-b.shape[0] // bn), kb):
        return f"scale shapes {tuple(a_scale.shape)}, {tuple(b_scale.shape)} do not match the blocks"
    return None


def fp8_block_mm(a, a_scale, b, b_scale, block_size=(128, 128), bias=None, out_dtype=torch.bfloat16, config=None):
    return fp8_gemm(a, b, a_scale.float(), b_scale.float(), bias, out_dtype, blockwise=True,
                    block_n=block_size[0], config=config)
