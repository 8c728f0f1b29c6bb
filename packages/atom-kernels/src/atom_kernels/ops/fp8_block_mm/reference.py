"""Plain-torch block-scaled FP8 GEMM: the specification."""

from __future__ import annotations

import torch

from atom_kernels.formats import expand_blocks


def fp8_block_mm(a, a_scale, b, b_scale, block_size=(128, 128), bias=None, out_dtype=torch.bfloat16):
    m, k = a.shape
    n = b.shape[0]
    bn, bk = block_size
    a32 = a.float() * expand_blocks(a_scale.float(), (1, bk), (m, k))
    b32 = b.float() * expand_blocks(b_scale.float(), (bn, bk), (n, k))
    out = a32 @ b32.t()
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)
