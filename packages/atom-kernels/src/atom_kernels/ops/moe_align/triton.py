"""Triton alignment, no host sync, no loops over runtime bounds (Triton's CPU interpreter cannot run
those with NumPy 2.4; every repetition here is a grid dimension instead).

Small batches (at most ``SINGLE_CHUNK_PAIRS`` pairs, i.e. decode) take one launch: every program
counts and ranks all pairs from registers, then writes its own tile of rows and blocks.  Larger ones
take three launches over chunks of pairs:

1. ``count`` (a program per chunk): the local expert of each pair, its rank among the chunk's pairs of
   the same expert, and the chunk's per-expert counts (a one-hot ``[chunk, experts]`` tile);
2. ``layout`` (a program per tile of rows): from the whole count table, each expert's padded run; the
   block -> expert table and the sentinel in every row of the tile;
3. ``scatter`` (a program per chunk): each pair goes to ``run start + earlier chunks' count + rank``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.ops._pdl import pdl_keywords, start_dependent
from atom_kernels.ops.moe_align import max_blocks
from atom_kernels.ops.moe_align.reference import check_args

SINGLE_CHUNK_PAIRS = 256
ROWS_PER_PROGRAM = 256


@triton.jit
def _local_ids(topk_ids_ptr, map_ptr, offs, num_pairs, num_experts, HAS_MAP: tl.constexpr):
    valid = offs < num_pairs
    ids = tl.load(topk_ids_ptr + offs, mask=valid, other=0).to(tl.int32)
    if HAS_MAP:
        ids = tl.load(map_ptr + ids, mask=valid, other=-1).to(tl.int32)
    return tl.where(valid & (ids >= 0) & (ids < num_experts), ids, -1)


@triton.jit
def _count_and_rank(local, EXPERTS_P2: tl.constexpr):
    """Per-expert counts of ``local`` and each entry's 0-based rank among the entries of its expert."""
    onehot = (local[:, None] == tl.arange(0, EXPERTS_P2)[None, :]).to(tl.int32)
    counts = tl.sum(onehot, axis=0)
    rank = tl.sum((tl.cumsum(onehot, axis=0) - 1) * onehot, axis=1)
    return counts, rank


@triton.jit
def _runs(counts, BLOCK_M: tl.constexpr):
    """Each expert's run of rows padded to BLOCK_M: (start, end, total rows)."""
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    end = tl.cumsum(padded, axis=0)
    return end - padded, end, tl.sum(padded, axis=0)


@triton.jit
def _write_blocks(block_experts_ptr, tile, end, total, num_blocks, BLOCK_M: tl.constexpr, ROWS: tl.constexpr):
    """The expert of each row block whose first row lies in this tile of rows: the number of runs that
    end at or before that row (-1 past the last run)."""
    blocks = tile * (ROWS // BLOCK_M) + tl.arange(0, ROWS // BLOCK_M)
    first_row = blocks * BLOCK_M
    expert = tl.sum((end[None, :] <= first_row[:, None]).to(tl.int32), axis=1)
    expert = tl.where(first_row < total, expert, -1)
    tl.store(block_experts_ptr + blocks, expert, mask=blocks < num_blocks)


@triton.jit
def _align_single_chunk_kernel(
    topk_ids_ptr, map_ptr, sorted_ptr, block_experts_ptr, num_padded_ptr,
    num_pairs, num_experts, max_rows, num_blocks,
    HAS_MAP: tl.constexpr, PAIRS_P2: tl.constexpr, EXPERTS_P2: tl.constexpr, BLOCK_M: tl.constexpr,
    ROWS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    start_dependent(PDL)  # programmatic dependent launch (ops/_pdl.py)
    tile = tl.program_id(0)
    pairs = tl.arange(0, PAIRS_P2)
    local = _local_ids(topk_ids_ptr, map_ptr, pairs, num_pairs, num_experts, HAS_MAP)
    counts, rank = _count_and_rank(local, EXPERTS_P2)
    start, end, total = _runs(counts, BLOCK_M)
    experts = tl.arange(0, EXPERTS_P2)
    dest = tl.sum(tl.where(experts[None, :] == local[:, None], start[None, :], 0), axis=1) + rank
    dest = tl.where(local >= 0, dest, -1)
    rows = tile * ROWS + tl.arange(0, ROWS)
    hit = dest[None, :] == rows[:, None]
    pair = tl.sum(tl.where(hit, pairs[None, :], 0), axis=1)
    found = tl.sum(hit.to(tl.int32), axis=1) > 0
    tl.store(sorted_ptr + rows, tl.where(found, pair, num_pairs), mask=rows < max_rows)
    _write_blocks(block_experts_ptr, tile, end, total, num_blocks, BLOCK_M, ROWS)
    if tile == 0:
        tl.store(num_padded_ptr, total)


@triton.jit
def _align_count_kernel(
    topk_ids_ptr, map_ptr, local_ptr, rank_ptr, counts_ptr, num_pairs, num_experts,
    HAS_MAP: tl.constexpr, CHUNK: tl.constexpr, EXPERTS_P2: tl.constexpr,
    PDL: tl.constexpr = False,
):
    start_dependent(PDL)  # programmatic dependent launch (ops/_pdl.py)
    chunk = tl.program_id(0)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    local = _local_ids(topk_ids_ptr, map_ptr, offs, num_pairs, num_experts, HAS_MAP)
    counts, rank = _count_and_rank(local, EXPERTS_P2)
    tl.store(local_ptr + offs, local, mask=offs < num_pairs)
    tl.store(rank_ptr + offs, rank, mask=offs < num_pairs)
    tl.store(counts_ptr + chunk * EXPERTS_P2 + tl.arange(0, EXPERTS_P2), counts)


@triton.jit
def _count_table(counts_ptr, num_chunks, below, CHUNKS_P2: tl.constexpr, EXPERTS_P2: tl.constexpr):
    """Per-expert sums of the count table's rows ``< below`` (of ``num_chunks`` rows)."""
    chunks = tl.arange(0, CHUNKS_P2)
    keep = (chunks < num_chunks) & (chunks < below)
    table = tl.load(counts_ptr + chunks[:, None] * EXPERTS_P2 + tl.arange(0, EXPERTS_P2)[None, :],
                    mask=keep[:, None], other=0)
    return tl.sum(table, axis=0)


@triton.jit
def _align_layout_kernel(
    counts_ptr, sorted_ptr, block_experts_ptr, num_padded_ptr, num_chunks, num_pairs, max_rows, num_blocks,
    CHUNKS_P2: tl.constexpr, EXPERTS_P2: tl.constexpr, BLOCK_M: tl.constexpr, ROWS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    start_dependent(PDL)  # programmatic dependent launch (ops/_pdl.py)
    tile = tl.program_id(0)
    counts = _count_table(counts_ptr, num_chunks, num_chunks, CHUNKS_P2, EXPERTS_P2)
    start, end, total = _runs(counts, BLOCK_M)
    rows = tile * ROWS + tl.arange(0, ROWS)
    tl.store(sorted_ptr + rows, tl.zeros([ROWS], dtype=tl.int32) + num_pairs, mask=rows < max_rows)
    _write_blocks(block_experts_ptr, tile, end, total, num_blocks, BLOCK_M, ROWS)
    if tile == 0:
        tl.store(num_padded_ptr, total)


@triton.jit
def _align_scatter_kernel(
    local_ptr, rank_ptr, counts_ptr, sorted_ptr, num_chunks, num_pairs,
    CHUNK: tl.constexpr, CHUNKS_P2: tl.constexpr, EXPERTS_P2: tl.constexpr, BLOCK_M: tl.constexpr,
    PDL: tl.constexpr = False,
):
    start_dependent(PDL)  # programmatic dependent launch (ops/_pdl.py)
    chunk = tl.program_id(0)
    start, _, _ = _runs(_count_table(counts_ptr, num_chunks, num_chunks, CHUNKS_P2, EXPERTS_P2), BLOCK_M)
    base = start + _count_table(counts_ptr, num_chunks, chunk, CHUNKS_P2, EXPERTS_P2)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    local = tl.load(local_ptr + offs, mask=offs < num_pairs, other=-1)
    keep = local >= 0
    rank = tl.load(rank_ptr + offs, mask=keep, other=0)
    experts = tl.arange(0, EXPERTS_P2)
    dest = tl.sum(tl.where(experts[None, :] == local[:, None], base[None, :], 0), axis=1) + rank
    tl.store(sorted_ptr + dest, offs, mask=keep)


def chunk_size(experts_p2: int, num_pairs: int) -> int:
    """Pairs per program of the multi-chunk path: a one-hot tile near 32K entries, at most ~256 chunks."""
    by_tile = max(16, min(1024, 32768 // experts_p2))
    return max(by_tile, triton.next_power_of_2(triton.cdiv(num_pairs, 256)))


def moe_align_block_size(topk_ids, num_experts, block_m, expert_map=None):
    check_args(topk_ids, num_experts, block_m, expert_map)
    device = topk_ids.device
    ids = topk_ids.reshape(-1)
    if not ids.is_contiguous():
        ids = ids.contiguous()
    num_pairs = ids.numel()
    blocks = max_blocks(num_pairs, num_experts, block_m)
    max_rows = blocks * block_m
    sorted_ids = torch.empty((max_rows,), dtype=torch.int32, device=device)
    block_experts = torch.empty((blocks,), dtype=torch.int32, device=device)
    num_padded = torch.zeros((1,), dtype=torch.int32, device=device)
    if num_pairs == 0:
        return sorted_ids, block_experts, num_padded
    pdl_launch = pdl_keywords(device)
    experts_p2 = triton.next_power_of_2(num_experts)
    rows = max(ROWS_PER_PROGRAM, block_m)
    tiles = triton.cdiv(max_rows, rows)
    map_arg = expert_map if expert_map is not None else ids
    has_map = expert_map is not None
    if num_pairs <= SINGLE_CHUNK_PAIRS:
        _align_single_chunk_kernel[(tiles,)](
            ids, map_arg, sorted_ids, block_experts, num_padded, num_pairs, num_experts, max_rows, blocks,
            HAS_MAP=has_map, PAIRS_P2=triton.next_power_of_2(num_pairs), EXPERTS_P2=experts_p2,
            BLOCK_M=block_m, ROWS=rows, **pdl_launch, num_warps=4,
        )
        return sorted_ids, block_experts, num_padded
    chunk = chunk_size(experts_p2, num_pairs)
    num_chunks = triton.cdiv(num_pairs, chunk)
    chunks_p2 = triton.next_power_of_2(num_chunks)
    local = torch.empty((num_pairs,), dtype=torch.int32, device=device)
    rank = torch.empty((num_pairs,), dtype=torch.int32, device=device)
    counts = torch.empty((num_chunks, experts_p2), dtype=torch.int32, device=device)
    _align_count_kernel[(num_chunks,)](
        ids, map_arg, local, rank, counts, num_pairs, num_experts,
        HAS_MAP=has_map, CHUNK=chunk, EXPERTS_P2=experts_p2, **pdl_launch, num_warps=8,
    )
    _align_layout_kernel[(tiles,)](
        counts, sorted_ids, block_experts, num_padded, num_chunks, num_pairs, max_rows, blocks,
        CHUNKS_P2=chunks_p2, EXPERTS_P2=experts_p2, BLOCK_M=block_m, ROWS=rows, **pdl_launch, num_warps=4,
    )
    _align_scatter_kernel[(num_chunks,)](
        local, rank, counts, sorted_ids, num_chunks, num_pairs,
        CHUNK=chunk, CHUNKS_P2=chunks_p2, EXPERTS_P2=experts_p2, BLOCK_M=block_m, **pdl_launch, num_warps=8,
    )
    return sorted_ids, block_experts, num_padded


def unsupported(topk_ids, num_experts, block_m, expert_map=None) -> str | None:
    if block_m < 1 or block_m & (block_m - 1):
        return f"block_m {block_m} is not a power of two"
    return None
