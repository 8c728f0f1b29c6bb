"""Plain-torch MRoPE: the specification (:func:`rotated` out of place, as a compiled forward traces it;
:func:`mrope` in place)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from atom_kernels.ops.rotary_embedding.reference import cos_sin, rotated_heads, write_back


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
    """``cos``, ``sin`` ``[T, rotary_dim // 2]`` fp32: each frequency read at its own row's position (text-only
    ``[T]`` positions: every row holds the same position, so the plain rotary table rows)."""
    half = cos_sin_cache.shape[-1] // 2
    check_section(mrope_section, 2 * half)
    if positions.dim() == 1:
        return cos_sin(positions, cos_sin_cache)
    table = cos_sin_cache.float()[positions.long()]  # [3, T, rotary_dim]
    pick = section_rows(mrope_section, interleaved).to(table.device)
    index = pick.view(1, 1, half).expand(1, table.shape[1], half)
    cos = table[..., :half].gather(0, index)[0]
    sin = table[..., half:].gather(0, index)[0]
    return cos, sin


def rotated(positions, q, k, cos_sin_cache, head_size, mrope_section, interleaved=False, *,
            q_weight=None, k_weight=None, eps=1e-6, weight_offset=0.0):
    """``mrope``'s result as new tensors ``(q', k')``; q and k are left as they are."""
    cos, sin = mrope_cos_sin(positions, cos_sin_cache, mrope_section, interleaved)
    return (rotated_heads(q, cos, sin, head_size, True, q_weight, eps, weight_offset),
            rotated_heads(k, cos, sin, head_size, True, k_weight, eps, weight_offset))


def mrope(positions, q, k, cos_sin_cache, head_size, mrope_section, interleaved=False, *,
          q_weight=None, k_weight=None, eps=1e-6, weight_offset=0.0):
    return write_back(q, k, rotated(positions, q, k, cos_sin_cache, head_size, mrope_section, interleaved,
                                    q_weight=q_weight, k_weight=k_weight, eps=eps, weight_offset=weight_offset))
