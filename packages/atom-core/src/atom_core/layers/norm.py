"""RMSNorm (optionally zero-centred: the weight is stored as ``w - 1``)."""

from __future__ import annotations

import torch
from torch import nn

from atom_core.layers.params import make_param
from atom_kernels import rms_norm


class RMSNorm(nn.Module):
    """``y = x / rms(x) · (w + offset)``; with a residual, ``s = x + residual`` is normalised and returned."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, zero_centered: bool = False):
        super().__init__()
        self.eps = eps
        self.weight_offset = 1.0 if zero_centered else 0.0
        self.weight = make_param((hidden_size,), torch.get_default_dtype())

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return rms_norm(x, self.weight, self.eps, residual, self.weight_offset)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, offset={self.weight_offset}"
