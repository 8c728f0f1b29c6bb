"""Plain-torch routing: the specification, written as transformers' routers compute it."""

from __future__ import annotations

import torch

SCORINGS = ("softmax", "sigmoid")


def check_args(router_logits, top_k, scoring, correction_bias, n_group, topk_group) -> None:
    if router_logits.dim() != 2:
        raise ValueError(f"topk_routing: router_logits must be [tokens, experts], got {tuple(router_logits.shape)}")
    experts = router_logits.shape[1]
    if scoring not in SCORINGS:
        raise ValueError(f"topk_routing: scoring {scoring!r} is not one of {SCORINGS}")
    if not 0 < top_k <= experts:
        raise ValueError(f"topk_routing: top_k={top_k} with {experts} experts")
    if correction_bias is not None and tuple(correction_bias.shape) != (experts,):
        raise ValueError(f"topk_routing: correction_bias shape {tuple(correction_bias.shape)}, expected ({experts},)")
    if n_group > 1:
        if experts % n_group:
            raise ValueError(f"topk_routing: {experts} experts do not split into {n_group} groups")
        if experts // n_group < 2:
            raise ValueError("topk_routing: grouped top-k scores a group by its two best experts; groups need >= 2")
        if not 0 < topk_group <= n_group:
            raise ValueError(f"topk_routing: topk_group={topk_group} with n_group={n_group}")
        if top_k > topk_group * (experts // n_group):
            raise ValueError(f"topk_routing: top_k={top_k} exceeds the experts of {topk_group} groups")


def topk_routing(
    router_logits: torch.Tensor,
    top_k: int,
    *,
    scoring: str = "softmax",
    renormalize: bool = True,
    correction_bias: torch.Tensor | None = None,
    n_group: int = 1,
    topk_group: int = 1,
    routed_scaling_factor: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    check_args(router_logits, top_k, scoring, correction_bias, n_group, topk_group)
    logits = router_logits.float()
    tokens, experts = logits.shape
    if scoring == "softmax":
        scores = torch.softmax(logits, dim=-1)
        choice = scores
    else:
        scores = logits.sigmoid()
        choice = scores + correction_bias.float() if correction_bias is not None else scores
    if n_group > 1:
        grouped = choice.view(tokens, n_group, experts // n_group)
        group_scores = grouped.topk(2, dim=-1)[0].sum(dim=-1)
        best_groups = group_scores.topk(topk_group, dim=-1)[1]
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, best_groups, True)
        expert_mask = group_mask[:, :, None].expand(-1, -1, experts // n_group).reshape(tokens, experts)
        choice = choice.masked_fill(~expert_mask, float("-inf"))
    ids = choice.topk(top_k, dim=-1)[1]
    weights = scores.gather(1, ids)
    if renormalize:
        denominator = weights.sum(dim=-1, keepdim=True)
        weights = weights / (denominator + 1e-20 if scoring == "sigmoid" else denominator)
    return weights * routed_scaling_factor, ids.to(torch.int32)
