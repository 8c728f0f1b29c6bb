"""RMSNorm (optionally zero-centred: the weight is stored as ``w - 1``), and RMSNorm over features that are
split across the tensor-parallel ranks."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from atom_core.host import TensorParallel
from atom_core.layers.params import copy_checked, make_param, materialize
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


class ShardedRMSNorm(nn.Module):
    """RMSNorm over a feature dim that a column-parallel layer splits across the ranks (MiniMax-M2's q/k norms
    span every head of the projection): each rank holds the weight's slice ``span = (start, size, full)`` of the
    checkpoint's ``[full]`` vector, and the mean square is the average of the ranks' local mean squares (every rank
    holds ``size`` features; where kv heads are replicated over ranks each distinct head counts equally often)."""

    def __init__(self, span: tuple[int, int, int], eps: float, *, tp: TensorParallel):
        super().__init__()
        self.start, size, self.full = span
        self.eps = eps
        self.tp = tp
        self.weight = make_param((size,), torch.get_default_dtype(), weight_loader=self.load_slice)

    def load_slice(self, param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
        if tuple(loaded.shape) != (self.full,):
            raise ValueError(f"shape mismatch: checkpoint {tuple(loaded.shape)}, expected ({self.full},)")
        copy_checked(param.data, materialize(loaded)[self.start : self.start + param.shape[0]])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.world_size == 1:
            return rms_norm(x, self.weight, self.eps)
        xf = x.float()
        mean_square = self.tp.all_reduce(xf.pow(2).mean(dim=-1, keepdim=True)) / self.tp.world_size
        return (xf * torch.rsqrt(mean_square + self.eps) * self.weight.float()).to(x.dtype)

    def extra_repr(self) -> str:
        return f"[{self.start}:{self.start + self.weight.shape[0]}] of {self.full}, eps={self.eps}"


class LayerNorm(nn.Module):
    """LayerNorm with weight and bias (the vision towers' blocks and mergers, DeepSeek sparse attention's indexer key)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = make_param((hidden_size,), torch.get_default_dtype())
        self.bias = make_param((hidden_size,), torch.get_default_dtype())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)
