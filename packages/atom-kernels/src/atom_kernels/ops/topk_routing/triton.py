"""Triton routing: one program per token.  The token's E logits are held as a ``[groups, group size]``
tile (one group when ungrouped), so the group scores are row reductions; the top-k is ``top_k`` rounds
of "take the largest, remove it" (ties go to the lower expert id).  fp32 math throughout."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.ops._pdl import pdl_keywords, start_dependent
from atom_kernels.ops.topk_routing.reference import check_args

MAX_EXPERTS = 4096
MAX_TOP_K = 64


def unsupported(router_logits, top_k, *, scoring="softmax", renormalize=True, correction_bias=None,
                n_group=1, topk_group=1, routed_scaling_factor=1.0) -> str | None:
    if router_logits.dim() != 2 or router_logits.shape[1] > MAX_EXPERTS:
        return f"router_logits {tuple(router_logits.shape)}: expects [tokens, <= {MAX_EXPERTS} experts]"
    if top_k > MAX_TOP_K:
        return f"top_k {top_k} > {MAX_TOP_K}"
    return None


@triton.jit
def _topk_routing_kernel(
    logits_ptr, logits_stride, bias_ptr, weights_ptr, ids_ptr, scaling,
    GROUPS: tl.constexpr, GROUP_SIZE: tl.constexpr, GROUPS_P2: tl.constexpr, GROUP_SIZE_P2: tl.constexpr,
    TOPK_GROUP: tl.constexpr, TOP_K: tl.constexpr, TOP_K_P2: tl.constexpr,
    SIGMOID: tl.constexpr, HAS_BIAS: tl.constexpr, RENORMALIZE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    start_dependent(PDL)  # programmatic dependent launch (ops/_pdl.py)
    token = tl.program_id(0).to(tl.int64)
    group = tl.arange(0, GROUPS_P2)
    member = tl.arange(0, GROUP_SIZE_P2)
    valid = (group[:, None] < GROUPS) & (member[None, :] < GROUP_SIZE)
    expert = group[:, None] * GROUP_SIZE + member[None, :]
    x = tl.load(logits_ptr + token * logits_stride + expert, mask=valid, other=0.0).to(tl.float32)
    if SIGMOID:
        scores = tl.sigmoid(x)
        choice = scores
        if HAS_BIAS:
            choice = choice + tl.load(bias_ptr + expert, mask=valid, other=0.0).to(tl.float32)
    else:
        x = tl.where(valid, x, float("-inf"))
        e = tl.exp(x - tl.max(tl.max(x, axis=1), axis=0))
        e = tl.where(valid, e, 0.0)
        scores = e / tl.sum(tl.sum(e, axis=1), axis=0)
        choice = scores
    choice = tl.where(valid, choice, float("-inf"))

    if GROUPS > 1:
        # a group scores the sum of its two best choices; only the TOPK_GROUP best groups stay eligible
        best = tl.max(choice, axis=1)
        first = tl.min(tl.where(choice == best[:, None], member[None, :], GROUP_SIZE_P2), axis=1)
        second = tl.max(tl.where(member[None, :] == first[:, None], float("-inf"), choice), axis=1)
        group_score = tl.where(group < GROUPS, best + second, float("-inf"))
        keep = group < 0
        for _ in tl.static_range(TOPK_GROUP):
            top = tl.max(group_score, axis=0)
            pick = tl.min(tl.where(group_score == top, group, GROUPS_P2), axis=0)
            keep = keep | (group == pick)
            group_score = tl.where(group == pick, float("-inf"), group_score)
        choice = tl.where(keep[:, None], choice, float("-inf"))

    slot = tl.arange(0, TOP_K_P2)
    out_w = tl.zeros([TOP_K_P2], dtype=tl.float32)
    out_id = tl.zeros([TOP_K_P2], dtype=tl.int32)
    for i in tl.static_range(TOP_K):
        top = tl.max(tl.max(choice, axis=1), axis=0)
        pick = tl.min(tl.min(tl.where(choice == top, expert, GROUPS * GROUP_SIZE), axis=1), axis=0)
        weight = tl.sum(tl.sum(tl.where(expert == pick, scores, 0.0), axis=1), axis=0)
        out_w = tl.where(slot == i, weight, out_w)
        out_id = tl.where(slot == i, pick, out_id)
        choice = tl.where(expert == pick, float("-inf"), choice)
    if RENORMALIZE:
        total = tl.sum(out_w, axis=0)
        if SIGMOID:
            total = total + 1e-20
        out_w = out_w / total
    keep_slot = slot < TOP_K
    tl.store(weights_ptr + token * TOP_K + slot, out_w * scaling, mask=keep_slot)
    tl.store(ids_ptr + token * TOP_K + slot, out_id, mask=keep_slot)


def topk_routing(router_logits, top_k, *, scoring="softmax", renormalize=True, correction_bias=None,
                 n_group=1, topk_group=1, routed_scaling_factor=1.0):
    check_args(router_logits, top_k, scoring, correction_bias, n_group, topk_group)
    tokens, experts = router_logits.shape
    if router_logits.stride(-1) != 1:
        router_logits = router_logits.contiguous()
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=router_logits.device)
    groups = n_group if n_group > 1 else 1
    group_size = experts // groups
    if tokens > 0:
        pdl_launch = pdl_keywords(router_logits.device)
        _topk_routing_kernel[(tokens,)](
            router_logits, router_logits.stride(0),
            correction_bias if correction_bias is not None else router_logits, weights, ids,
            float(routed_scaling_factor),
            GROUPS=groups, GROUP_SIZE=group_size,
            GROUPS_P2=triton.next_power_of_2(groups), GROUP_SIZE_P2=triton.next_power_of_2(group_size),
            TOPK_GROUP=topk_group if groups > 1 else 1, TOP_K=top_k, TOP_K_P2=triton.next_power_of_2(top_k),
            SIGMOID=scoring == "sigmoid", HAS_BIAS=correction_bias is not None, RENORMALIZE=renormalize,
            **pdl_launch, num_warps=1 if experts <= 256 else 4,
        )
    return weights, ids
