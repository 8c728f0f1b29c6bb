"""Plain-torch top-k selection: a stable descending sort (ties: lowest position first), the first ``k`` finite
entries, then ascending order.  Rows go in chunks to bound the sort's memory at host sizes."""

from __future__ import annotations

import torch

ROW_BUDGET = 1 << 25  # scores sorted at once


def check_topk_args(scores, k) -> None:
    if scores.dim() != 2 or not isinstance(k, int) or k <= 0:
        raise ValueError(f"topk_indices: scores {tuple(scores.shape)} must be [T, N] and k ({k!r}) a positive int")


def topk_indices(scores, k):
    check_topk_args(scores, k)
    tokens, width = scores.shape
    out = torch.full((tokens, k), -1, dtype=torch.int32, device=scores.device)
    take = min(k, width)
    chunk = max(1, ROW_BUDGET // max(1, width))
    for start in range(0, tokens, chunk):
        rows = scores[start : start + chunk].float()
        values, order = torch.sort(rows, dim=-1, descending=True, stable=True)
        chosen = torch.where(values[:, :take] > float("-inf"), order[:, :take], width)  # width: not selected
        chosen = chosen.sort(dim=-1).values
        out[start : start + chunk, :take] = torch.where(chosen < width, chosen, -1).to(torch.int32)
    return out
