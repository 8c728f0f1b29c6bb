"""Plain-torch scaled FP8 GEMM: the specification."""

from __future__ import annotations

import torch


def fp8_scaled_mm(a, a_scale, b, b_scale, bias=None, out_dtype=torch.bfloat16):
    a32 = a.float() * a_scale.float().reshape(-1, 1)
    b32 = b.float() * b_scale.float().reshape(-1, 1)
    out = a32 @ b32.t()
    if bias is not None:
        out = out + bias.float()
    return out.to(out_dtype)
