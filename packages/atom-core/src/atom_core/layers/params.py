"""How a parameter maps onto checkpoint tensors: which dims are split over tensor parallelism
(and in what units), and which logical shards of a fused layer it holds.

Parameters carry these as attributes so any loader — ATOM's own or a host's — can place a
checkpoint tensor without knowing which layer the parameter belongs to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def make_param(shape: tuple[int, ...], dtype: torch.dtype, **meta: Any) -> nn.Parameter:
    """An uninitialised, non-trainable parameter with loading metadata (see :func:`annotate`)."""
    param = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
    annotate(param, **meta)
    return param


def annotate(
    param: nn.Parameter,
    *,
    output_dim: int | None = None,
    input_dim: int | None = None,
    out_divisor: int = 1,
    in_divisor: int = 1,
    per_shard: bool = False,
    weight_loader: Callable[..., None] | None = None,
) -> nn.Parameter:
    """Attach loading metadata.

    * ``output_dim`` / ``input_dim``: the dims of this parameter that follow the layer's output /
      input features, or None.  ``out_divisor`` / ``in_divisor``: how many features one element along
      that dim covers (1 for a weight, the block size for block scales, 2 for packed 4-bit codes...).
    * ``per_shard``: one element per logical shard of a fused layer (per-tensor scales).
    * ``weight_loader``: a loader of its own instead of the layer's.
    """
    param.output_dim = output_dim
    param.input_dim = input_dim
    param.out_divisor = out_divisor
    param.in_divisor = in_divisor
    param.per_shard = per_shard
    if weight_loader is not None:
        param.weight_loader = weight_loader
    return param


def divide(numerator: int, denominator: int, what: str = "") -> int:
    if numerator % denominator:
        raise ValueError(f"{what or numerator} ({numerator}) is not divisible by {denominator}")
    return numerator // denominator


def copy_checked(target: torch.Tensor, source: Any, name: str = "") -> None:
    """Copy a checkpoint tensor (or lazy slice) into ``target`` after checking the shape."""
    shape = tuple(source.shape)
    if shape != tuple(target.shape):
        raise ValueError(f"shape mismatch{' for ' + name if name else ''}: checkpoint {shape}, expected {tuple(target.shape)}")
    target.copy_(materialize(source))


def materialize(source: Any) -> torch.Tensor:
    """A tensor from a checkpoint tensor or a lazily read slice of one."""
    return source if isinstance(source, torch.Tensor) else source.to_tensor()


def default_weight_loader(param: nn.Parameter, loaded: Any, shard_id: Any = None) -> None:
    """Whole-tensor copy for parameters no layer claims (norm weights, ...)."""
    if shard_id is not None:
        raise ValueError(f"parameter takes no shard, got shard {shard_id!r}")
    copy_checked(param.data, loaded)
