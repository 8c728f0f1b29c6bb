"""AITER RMSNorm (ROCm). Unverified here: nobody on the team has an AMD GPU."""

from __future__ import annotations

import torch


def unsupported(x, weight, eps, residual=None, weight_offset=0.0) -> str | None:
    if weight_offset != 0.0:
        return "aiter rms_norm has no weight offset"
    if x.dtype not in (torch.float16, torch.bfloat16):
        return f"aiter rms_norm takes fp16/bf16, not {x.dtype}"
    return None


def rms_norm(x, weight, eps, residual=None, weight_offset=0.0):
    import aiter

    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    if residual is None:
        return aiter.rms_norm(x2, weight, eps).view(x.shape)
    res2 = residual.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty_like(x2)
    summed = torch.empty_like(x2)
    aiter.rmsnorm2d_fwd_with_add(out, x2, res2, summed, weight, eps)
    return out.view(x.shape), summed.view(x.shape)
