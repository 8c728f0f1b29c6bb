"""Plain-torch alignment: the specification, one expert at a time."""

from __future__ import annotations

import torch

from atom_kernels.ops.moe_align import max_blocks


def check_args(topk_ids, num_experts, block_m, expert_map) -> None:
    if topk_ids.dim() != 2:
        raise ValueError(f"moe_align_block_size: topk_ids must be [tokens, k], got {tuple(topk_ids.shape)}")
    if block_m < 1 or num_experts < 1:
        raise ValueError(f"moe_align_block_size: block_m={block_m}, num_experts={num_experts}")
    if expert_map is not None and expert_map.dim() != 1:
        raise ValueError(f"moe_align_block_size: expert_map must be 1-D, got {tuple(expert_map.shape)}")


def local_expert_ids(topk_ids: torch.Tensor, expert_map: torch.Tensor | None) -> torch.Tensor:
    flat = topk_ids.reshape(-1).long()
    return expert_map.long()[flat] if expert_map is not None else flat


def moe_align_block_size(topk_ids, num_experts, block_m, expert_map=None):
    check_args(topk_ids, num_experts, block_m, expert_map)
    local = local_expert_ids(topk_ids, expert_map)
    num_pairs = local.numel()
    blocks = max_blocks(num_pairs, num_experts, block_m)
    device = topk_ids.device
    sorted_ids = torch.full((blocks * block_m,), num_pairs, dtype=torch.int32, device=device)
    block_experts = torch.full((blocks,), -1, dtype=torch.int32, device=device)
    row = 0
    for expert in range(num_experts):
        pairs = (local == expert).nonzero().flatten()
        if pairs.numel() == 0:
            continue
        sorted_ids[row : row + pairs.numel()] = pairs.to(torch.int32)
        used = -(-pairs.numel() // block_m)
        block_experts[row // block_m : row // block_m + used] = expert
        row += used * block_m
    return sorted_ids, block_experts, torch.tensor([row], dtype=torch.int32, device=device)
