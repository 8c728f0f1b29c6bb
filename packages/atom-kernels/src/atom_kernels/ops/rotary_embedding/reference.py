"""Plain-torch rotary embedding: the specification."""

from __future__ import annotations

import torch


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """Rotate ``x[..., :2*cos.shape[-1]]`` (fp32 math); ``cos``/``sin`` broadcast over heads."""
    if is_neox:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def rotary_embedding(positions, q, k, cos_sin_cache, head_size, is_neox=True):
    rotary_dim = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache.index_select(0, positions.reshape(-1).long()).float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    for x in (q, k):
        if x is None:
            continue
        heads = x.view(x.shape[0], -1, head_size)
        heads[..., :rotary_dim] = rotate(heads[..., :rotary_dim], cos, sin, is_neox).to(x.dtype)
    return q, k
