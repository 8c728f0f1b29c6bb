"""Plain-torch RMSNorm: the specification."""

from __future__ import annotations

import torch


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float) -> torch.Tensor:
    xf = x.float()
    inv_rms = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (xf * inv_rms * (weight.float() + weight_offset)).to(x.dtype)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    weight_offset: float = 0.0,
):
    if residual is None:
        return _norm(x, weight, eps, weight_offset)
    summed = x + residual
    return _norm(summed, weight, eps, weight_offset), summed
