"""Plain-torch MRoPE: the specification."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from atom_kernels.ops.rms_norm.reference import rms_norm
from atom_kernels.ops.rotary_embedding.reference import rotate


def check_section(mrope_section: Sequence[int], rotary_dim: int) -> tuple[int, int, int]:
    """``mrope_section`` as three ints summing to ``rotary_dim // 2``, or a ValueError saying why not."""
    section = tuple(int(s) for s in mrope_section)
    if len(section) != 3 or min(section) < 0 or sum(section) * 2 != rotary_dim:
        raise ValueError(
            f"mrope_section {list(mrope_section)} must be three non-negative ints summing to rotary_dim/2 = {rotary_dim // 2}"
        )
    return section


def section_rows(mrope_section: Sequence[int], interleaved: bool) -> torch.Tensor:
    """``[rotary_dim // 2]`` int64: the position row (0 = time, 1 = height, 2 = width) of each frequency."""
    t, h, w = (int(s) for s in mrope_section)
    i = torch.arange(t + h + w)
    if interleaved:
        rows = torch.zeros_like(i)
        rows[(i % 3 == 1) & (i < 3 * h)] = 1
        rows[(i % 3 == 2) & (i < 3 * w)] = 2
        return rows
    return (i >= t).long() + (i >= t + h).long()


def mrope_cos_sin(positions: torch.Tensor, cos_sin_cache: torch.Tensor, mrope_section: Sequence[int],
                  interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos``, ``sin`` ``[T, rotary_dim // 2]`` fp32: each frequency read at its own row's position."""
    half = cos_sin_cache.shape[-1] // 2
    check_section(mrope_section, 2 * half)
    rows3 = positions.reshape(1, -1).expand(3, -1) if positions.dim() == 1 else positions
    table = cos_sin_cache.float()[rows3.long()]  # [3, T, rotary_dim]
    pick = section_rows(mrope_section, interleaved).to(table.device)
    index = pick.view(1, 1, half).expand(1, table.shape[1], half)
    cos = table[..., :half].gather(0, index)[0]
    sin = table[..., half:].gather(0, index)[0]
    return cos, sin


def mrope(positions, q, k, cos_sin_cache, head_size, mrope_section, interleaved=False, *,
          q_weight=None, k_weight=None, eps=1e-6, weight_offset=0.0):
    rotary_dim = cos_sin_cache.shape[-1]
    cos, sin = mrope_cos_sin(positions, cos_sin_cache, mrope_section, interleaved)
    cos, sin = cos[:, None, :], sin[:, None, :]
    for x, weight in ((q, q_weight), (k, k_weight)):
        if x is None:
            continue
        heads = x.view(x.shape[0], -1, head_size)
        if weight is not None:
            heads.copy_(rms_norm(heads, weight, eps, None, weight_offset))
        heads[..., :rotary_dim] = rotate(heads[..., :rotary_dim], cos, sin, True).to(x.dtype)
    return q, k
