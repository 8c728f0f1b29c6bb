"""Plain-torch gated RMSNorm: the specification."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def check_args(x, z, weight) -> None:
    if x.shape != z.shape or x.dim() not in (2, 3):
        raise ValueError(f"rms_norm_gated: x and z must be equal [T, N] or [T, heads, N], got {tuple(x.shape)}, {tuple(z.shape)}")
    if tuple(weight.shape) != (x.shape[-1],):
        raise ValueError(f"rms_norm_gated: weight must be [{x.shape[-1]}], got {tuple(weight.shape)}")


def rms_norm_gated(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    check_args(x, z, weight)
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.float() * F.silu(z.float())).to(x.dtype)
