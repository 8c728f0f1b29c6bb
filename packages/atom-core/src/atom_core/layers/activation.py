"""Gated activations."""

from __future__ import annotations

import torch
from torch import nn

from atom_kernels import silu_and_mul


class SiluAndMul(nn.Module):
    """``[gate | up] -> silu(gate) · up``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul(x)
