"""Plain-torch rotary embedding: the specification.

:func:`rotated` is the out-of-place form (new tensors, inputs untouched): the specification the in-place
:func:`rotary_embedding` writes back, and the form a compiled forward traces (``atom_kernels.library``)."""

from __future__ import annotations

import torch

from atom_kernels.ops.rms_norm.reference import rms_norm


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """Rotate ``x[..., :2*cos.shape[-1]]`` (fp32 math); ``cos``/``sin`` broadcast over heads."""
    if is_neox:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def cos_sin(positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos``, ``sin`` ``[T, rotary_dim // 2]`` fp32 at ``positions`` ``[T]``."""
    return cos_sin_cache.index_select(0, positions.reshape(-1).long()).float().chunk(2, dim=-1)


def rotated_heads(x: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, head_size: int, is_neox: bool,
                  weight: torch.Tensor | None = None, eps: float = 1e-6, weight_offset: float = 0.0):
    """A new tensor of ``x``'s shape and dtype: each head of ``x`` (``[T, heads * head_size]`` or ``[T, heads,
    head_size]``, any strides) RMS-normalised by ``weight`` when given (rounded to x's dtype), then its first
    ``2 * cos.shape[-1]`` dims rotated by ``cos``/``sin`` ``[T, rotary_dim // 2]``; None for None."""
    if x is None:
        return None
    heads = x.reshape(x.shape[0], -1, head_size)
    if weight is not None:
        heads = rms_norm(heads, weight, eps, None, weight_offset)
    rotary_dim = 2 * cos.shape[-1]
    out = rotate(heads[..., :rotary_dim], cos[:, None, :], sin[:, None, :], is_neox).to(x.dtype)
    if rotary_dim < head_size:
        out = torch.cat((out, heads[..., rotary_dim:]), dim=-1)
    return out.reshape(x.shape)


def rotated(positions, q, k, cos_sin_cache, head_size, is_neox=True):
    """``rotary_embedding``'s result as new tensors ``(q', k')``; q and k are left as they are."""
    cos, sin = cos_sin(positions, cos_sin_cache)
    return rotated_heads(q, cos, sin, head_size, is_neox), rotated_heads(k, cos, sin, head_size, is_neox)


def write_back(q, k, new: tuple) -> tuple:
    """``(q, k)`` with the out-of-place results ``new`` copied into them (the in-place ops' contract)."""
    for x, result in zip((q, k), new):
        if x is not None:
            x.copy_(result)
    return q, k


def rotary_embedding(positions, q, k, cos_sin_cache, head_size, is_neox=True):
    return write_back(q, k, rotated(positions, q, k, cos_sin_cache, head_size, is_neox))
