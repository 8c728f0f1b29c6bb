"""AITER routing (ROCm): ``aiter.topk_softmax`` and ``aiter.biased_grouped_topk``.

Unverified here: nobody on the team has an AMD GPU; the calls follow AITER's published signatures
(``topk_softmax(topk_weights, topk_indices, token_expert_indices, gating_output, need_renorm)``,
``biased_grouped_topk(gating_output, correction_bias, topk_weights, topk_ids, num_expert_group,
topk_group, need_renorm, routed_scaling_factor)``).
"""

from __future__ import annotations

import torch


def unsupported(router_logits, top_k, *, scoring="softmax", renormalize=True, correction_bias=None,
                n_group=1, topk_group=1, routed_scaling_factor=1.0) -> str | None:
    if router_logits.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"aiter routing takes fp16/bf16/fp32 logits, not {router_logits.dtype}"
    if scoring == "softmax" and (n_group > 1 or correction_bias is not None):
        return "aiter topk_softmax has no grouped or biased variant"
    if scoring == "sigmoid" and correction_bias is None:
        return "aiter biased_grouped_topk needs a correction bias"
    return None


def topk_routing(router_logits, top_k, *, scoring="softmax", renormalize=True, correction_bias=None,
                 n_group=1, topk_group=1, routed_scaling_factor=1.0):
    import aiter

    tokens = router_logits.shape[0]
    device = router_logits.device
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=device)
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=device)
    if scoring == "softmax":
        token_expert = torch.empty((tokens, top_k), dtype=torch.int32, device=device)
        aiter.topk_softmax(weights, ids, token_expert, router_logits.float().contiguous(), renormalize)
        if routed_scaling_factor != 1.0:
            weights.mul_(routed_scaling_factor)
    else:
        aiter.biased_grouped_topk(
            router_logits.contiguous(), correction_bias.to(router_logits.dtype), weights, ids,
            max(n_group, 1), max(topk_group, 1), renormalize, routed_scaling_factor,
        )
    return weights, ids
