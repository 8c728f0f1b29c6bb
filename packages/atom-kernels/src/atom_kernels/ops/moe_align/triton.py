"""Triton alignment, no host sync.

On the multi-chunk path the launch's constexprs depend on the expert count and ``block_m`` only, never on the pairs:
a loop whose length follows the pairs (one-hot tiles per chunk, steps of the prefix sum) takes its trip count at run
time, so a batch of a new size compiles nothing in the middle of serving.  Such loops are ``while`` loops under
Triton's CPU interpreter (``USE_WHILE``: it cannot run a ``for`` over a runtime bound with NumPy 2.4, see
``_triton_common``) and ``for`` loops on the GPU.

Each program holds 2-D tiles of at most ``MAX_TILE_ENTRIES`` entries whatever the token count (:func:`plan`): the
pairs are ranked through one-hot ``[pair_tile, experts]`` tiles, ``pair_tile`` chosen from the experts alone, and a
program that has more pairs to go through loops over such tiles.  (Before, the count kernel's one tile grew with the
pairs: 16384 tokens x top-8 x 128 experts asked for 256 KiB of shared memory on an H200.)

Small batches (at most ``SINGLE_CHUNK_PAIRS`` pairs, i.e. decode) take one launch: every program counts all pairs
(tile by tile) and writes its own tile of rows (the block -> expert table and the sentinel in each padding row);
program 0 also ranks the pairs and writes each to its row.  Larger ones take three launches:

1. ``count`` (a program per chunk of ``chunk_tiles`` one-hot tiles): the local expert of each pair, its rank among
   the chunk's pairs of the same expert, and the chunk's per-expert counts (a row of the ``[chunks, experts]``
   table; at most ``MAX_CHUNKS`` chunks: the chunk grows by whole tiles with the pairs);
2. ``prefix`` (a program per block of experts): the exclusive prefix sum of the table over chunks, in place, a
   fixed ``[chunk_step, expert_block]`` tile at a time, and each expert's total;
3. ``place`` (a program per tile of rows, then one per chunk): from the totals, each expert's padded run; a row tile
   writes the block -> expert table and the sentinel in each of its padding rows, a chunk writes each of its pairs to
   ``run start + earlier chunks' count + rank`` (the two sets of rows are disjoint, so no order between them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atom_kernels.ops._pdl import pdl_keywords, start_dependent
from atom_kernels.ops._triton_common import use_while
from atom_kernels.ops.moe_align import max_blocks
from atom_kernels.ops.moe_align.reference import check_args

SINGLE_CHUNK_PAIRS = 256
ROWS_PER_PROGRAM = 256
# Entries of the largest one-hot tile ([pairs, experts], int32, and its cumsum over pairs) a program holds.  sm_90
# (tests/sm90_compile.py): 16K entries take 1-64 KiB of shared memory and 104-170 registers a thread, no spill; the
# old count kernel's [512, 128] tile at 16384 tokens x top-8 (64K entries) took 262144 bytes, over the 232448 an
# H200 program may use.  A tile of N int32 entries needs at most 4N bytes of shared memory (staged whole).
MAX_TILE_ENTRIES = 16384
MAX_PAIR_TILE = 1024  # pairs per one-hot tile at most (few experts): keeps the per-pair vectors small
MIN_PAIR_TILE = 16
MAX_CHUNKS = 1024  # count/scatter programs at most: past MAX_CHUNKS one-hot tiles, a program loops over several
PREFIX_TILE_ENTRIES = 4096  # the prefix kernel's [chunks, experts] step
PREFIX_EXPERTS = 64  # experts per prefix program at most


@dataclass(frozen=True)
class Plan:
    """The launch configuration of one alignment: a function of ``(num_pairs, num_experts, block_m)`` only, with
    every tile a program holds bounded whatever the number of pairs.  On the multi-chunk path only ``chunk_tiles``,
    ``chunks``, ``tiles`` (runtime arguments and grid sizes) depend on the pairs; the tile shapes and warps (the
    kernels' constexprs and compile options) depend on ``(num_experts, block_m)`` alone."""

    num_pairs: int
    num_experts: int
    block_m: int
    experts_p2: int
    single: bool  # one launch (decode)
    pair_tile: int  # pairs per one-hot [pair_tile, experts_p2] tile
    chunk_tiles: int  # one-hot tiles per count/scatter program (constexpr on the single-launch path, else runtime)
    chunks: int  # count/scatter programs (1 on the single-launch path)
    expert_block: int  # experts per prefix program (0 on the single-launch path)
    chunk_step: int  # chunks per step of a prefix program's loop, fixed per expert_block (0 on the single path)
    rows: int  # rows per layout program
    tiles: int  # layout programs
    num_warps: int  # of the count and place kernels

    @property
    def chunk(self) -> int:
        """Pairs per count/scatter program."""
        return self.pair_tile * self.chunk_tiles

    @property
    def prefix_programs(self) -> int:
        return self.experts_p2 // self.expert_block if self.expert_block else 0

    @property
    def prefix_steps(self) -> int:
        """Steps of a prefix program's loop (the kernel computes them from ``chunks``)."""
        return triton.cdiv(self.chunks, self.chunk_step) if self.chunk_step else 0

    @property
    def tile_entries(self) -> dict:
        """Entries of each 2-D tile a program holds: the one-hot tile (its cumsum, the scatter's lookup of each pair's
        row), a prefix step, a layout program's ``[blocks, experts]`` comparison and ``[blocks, block_m]`` rows."""
        return {"onehot": self.pair_tile * self.experts_p2, "prefix": self.chunk_step * self.expert_block,
                "blocks": self.rows // self.block_m * self.experts_p2, "rows": self.rows}

    @property
    def max_tile_entries(self) -> int:
        return max(self.tile_entries.values())

    @property
    def shared_memory_bound(self) -> int:
        """Bytes of shared memory a program could need at most: its largest int32 tile staged whole."""
        return 4 * self.max_tile_entries

    @property
    def grid(self) -> dict:
        """Programs per launch (all on grid axis 0)."""
        if self.single:
            return {"single": self.tiles}
        return {"count": self.chunks, "prefix": self.prefix_programs, "place": self.tiles + self.chunks}


def plan(num_pairs: int, num_experts: int, block_m: int) -> Plan:
    experts_p2 = triton.next_power_of_2(num_experts)
    rows = max(ROWS_PER_PROGRAM, block_m)
    tiles = triton.cdiv(max_blocks(num_pairs, num_experts, block_m) * block_m, rows)
    by_tile = max(MIN_PAIR_TILE, min(MAX_PAIR_TILE, MAX_TILE_ENTRIES // experts_p2))
    if num_pairs <= SINGLE_CHUNK_PAIRS:
        pairs_p2 = triton.next_power_of_2(max(num_pairs, 1))
        pair_tile = min(pairs_p2, by_tile)
        return Plan(num_pairs, num_experts, block_m, experts_p2, True, pair_tile, pairs_p2 // pair_tile, 1, 0, 0,
                    rows, tiles, 4)
    # the fewest tiles per program that keep the programs at MAX_CHUNKS at most (a runtime trip count: any number)
    chunk_tiles = triton.cdiv(triton.cdiv(num_pairs, by_tile), MAX_CHUNKS)
    chunks = triton.cdiv(num_pairs, by_tile * chunk_tiles)
    expert_block = min(experts_p2, PREFIX_EXPERTS)
    # the prefix tile is as large as the bound allows whatever the chunks (rows past the last chunk are masked): a
    # constexpr shrunk to the chunks would compile a variant per power of two of them
    chunk_step = max(1, PREFIX_TILE_ENTRIES // expert_block)
    # sm_90: a [128, 128] one-hot tile on 8 warps takes 64 KiB of shared memory and 255 registers, on 4 warps 2 KiB
    # and 168; tiles of more pairs spill on 4 warps ([1024, 16]: 104 bytes)
    num_warps = 8 if by_tile > 128 else 4
    return Plan(num_pairs, num_experts, block_m, experts_p2, False, by_tile, chunk_tiles, chunks, expert_block,
                chunk_step, rows, tiles, num_warps)


@triton.jit
def _local_ids(topk_ids_ptr, map_ptr, offs, num_pairs, num_experts, HAS_MAP: tl.constexpr):
    valid = offs < num_pairs
    ids = tl.load(topk_ids_ptr + offs, mask=valid, other=0).to(tl.int32)
    if HAS_MAP:
        ids = tl.load(map_ptr + ids, mask=valid, other=-1).to(tl.int32)
    return tl.where(valid & (ids >= 0) & (ids < num_experts), ids, -1)


@triton.jit
def _onehot(local, EXPERTS_P2: tl.constexpr):
    return (local[:, None] == tl.arange(0, EXPERTS_P2)[None, :]).to(tl.int32)


@triton.jit
def _ranks(onehot, before):
    """Each entry's 0-based rank among the entries of its expert, counting ``before[e]`` earlier ones of expert e."""
    return tl.sum(tl.where(onehot != 0, tl.cumsum(onehot, axis=0) + (before - 1)[None, :], 0), axis=1)


@triton.jit
def _runs(counts, BLOCK_M: tl.constexpr):
    """Each expert's run of rows padded to BLOCK_M: (start, end, total rows)."""
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    end = tl.cumsum(padded, axis=0)
    return end - padded, end, tl.sum(padded, axis=0)


@triton.jit
def _write_layout(sorted_ptr, block_experts_ptr, tile, counts, start, end, total, num_pairs, num_blocks,
                  BLOCK_M: tl.constexpr, ROWS: tl.constexpr):
    """Tile ``tile`` of ROWS rows: the expert of each of its row blocks (the number of runs that end at or before the
    block's first row; -1 past the last run) and the sentinel in each of its rows that no pair fills (a run's padding,
    or past the last run).  The rows pairs fill are left to the scatter."""
    blocks = tile * (ROWS // BLOCK_M) + tl.arange(0, ROWS // BLOCK_M)
    first_row = blocks * BLOCK_M
    after = end[None, :] > first_row[:, None]  # [blocks, experts]: the runs that end past the block's first row
    in_use = first_row < total
    expert = tl.where(in_use, tl.sum((~after).to(tl.int32), axis=1), -1)
    tl.store(block_experts_ptr + blocks, expert, mask=blocks < num_blocks)
    # the block's run is the first that ends past its first row; its pairs fill rows up to start + count
    filled = tl.min(tl.where(after, (start + counts)[None, :], 2147483647), axis=1)
    filled = tl.where(in_use, filled, 0)
    rows = first_row[:, None] + tl.arange(0, BLOCK_M)[None, :]
    pad = (rows >= filled[:, None]) & (blocks < num_blocks)[:, None]
    tl.store(sorted_ptr + rows, tl.zeros([ROWS // BLOCK_M, BLOCK_M], dtype=tl.int32) + num_pairs, mask=pad)


@triton.jit(do_not_specialize=["num_pairs", "num_blocks"])
def _align_single_chunk_kernel(
    topk_ids_ptr, map_ptr, sorted_ptr, block_experts_ptr, num_padded_ptr,
    num_pairs, num_experts, num_blocks,
    HAS_MAP: tl.constexpr, PAIR_TILE: tl.constexpr, CHUNK_TILES: tl.constexpr, EXPERTS_P2: tl.constexpr,
    BLOCK_M: tl.constexpr, ROWS: tl.constexpr,
    PDL: tl.constexpr = False,
):
    start_dependent(PDL)  # programmatic dependent launch (ops/_pdl.py)
    tile = tl.program_id(0)
    counts = tl.zeros([EXPERTS_P2], dtype=tl.int32)
    for t in range(CHUNK_TILES):
        pairs = t * PAIR_TILE + tl.arange(0, PAIR_TILE)
        local = _local_ids(topk_ids_ptr, map_ptr, pairs, num_pairs, num_experts, HAS_MAP)
        counts += tl.sum(_onehot(local, EXPERTS_P2), axis=0)
    start, end, total = _runs(counts, BLOCK_M)
    _write_layout(sorted_ptr, block_experts_ptr, tile, counts, start, end, total, num_pairs, num_blocks, BLOCK_M, ROWS)
    if tile == 0:
        tl.store(num_padded_ptr, total)
        before = start  # rows taken in each run by the pairs of earlier tiles
        for t in range(CHUNK_TILES):
            pairs = t * PAIR_TILE + tl.arange(0, PAIR_TILE)
            local = _local_ids(topk_ids_ptr, map_ptr, pairs, num_pairs, num_experts, HAS_MAP)
            onehot = _onehot(local, EXPERTS_P2)
            tl.store(sorted_ptr + _ranks(onehot, before), pairs, mask=local >= 0)
            before += tl.sum(onehot, axis=0)


@triton.jit
def _count_tile(topk_ids_ptr, map_ptr, local_ptr, rank_ptr, counts, tile, num_pairs, num_experts,
                HAS_MAP: tl.constexpr, PAIR_TILE: tl.constexpr, EXPERTS_P2: tl.constexpr):
    """One-hot tile ``tile``: each pair's local expert and rank (after ``counts`` earlier pairs of its expert) stored;
    returns the counts with the tile's pairs added."""
    offs = tile * PAIR_TILE + tl.arange(0, PAIR_TILE)
    local = _local_ids(topk_ids_ptr, map_ptr, offs, num_pairs, num_experts, HAS_MAP)
    onehot = _onehot(local, EXPERTS_P2)
    tl.store(local_ptr + offs, local, mask=offs < num_pairs)
    tl.store(rank_ptr + offs, _ranks(onehot, counts), mask=offs < num_pairs)
    return counts + tl.sum(onehot, axis=0)


@triton.jit(do_not_specialize=["num_pairs", "chunk_tiles"])  # sizes: one compile for every token count
def _align_count_kernel(
    topk_ids_ptr, map_ptr, local_ptr, rank_ptr, counts_ptr, num_pairs, num_experts, chunk_tiles,
    HAS_MAP: tl.constexpr, PAIR_TILE: tl.constexpr, EXPERTS_P2: tl.constexpr, USE_WHILE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    start_dependent(PDL)  # programmatic dependent launch (ops/_pdl.py)
    chunk = tl.program_id(0)
    counts = tl.zeros([EXPERTS_P2], dtype=tl.int32)
    if USE_WHILE:  # the CPU interpreter (see _triton_common)
        t = 0
        while t < chunk_tiles:
            counts = _count_tile(topk_ids_ptr, map_ptr, local_ptr, rank_ptr, counts, chunk * chunk_tiles + t, num_pairs,
                                 num_experts, HAS_MAP, PAIR_TILE, EXPERTS_P2)
            t += 1
    else:
        for t in range(chunk_tiles):
            counts = _count_tile(topk_ids_ptr, map_ptr, local_ptr, rank_ptr, counts, chunk * chunk_tiles + t, num_pairs,
                                 num_experts, HAS_MAP, PAIR_TILE, EXPERTS_P2)
    tl.store(counts_ptr + chunk * EXPERTS_P2 + tl.arange(0, EXPERTS_P2), counts)


@triton.jit
def _prefix_step(counts_ptr, experts, above, step, num_chunks, CHUNK_STEP: tl.constexpr, EXPERTS_P2: tl.constexpr):
    """Rows ``step * CHUNK_STEP ..`` of the count table's ``experts`` columns replaced by their exclusive prefix sum
    after ``above``; returns ``above`` with the rows added."""
    chunks = step * CHUNK_STEP + tl.arange(0, CHUNK_STEP)
    ptrs = counts_ptr + chunks[:, None] * EXPERTS_P2 + experts[None, :]
    keep = (chunks < num_chunks)[:, None]
    table = tl.load(ptrs, mask=keep, other=0)
    tl.store(ptrs, tl.cumsum(table, axis=0) - table + above[None, :], mask=keep)
    return above + tl.sum(table, axis=0)


@triton.jit(do_not_specialize=["num_chunks"])
def _align_prefix_kernel(
    counts_ptr, totals_ptr, num_chunks,
    CHUNK_STEP: tl.constexpr, EXPERT_BLOCK: tl.constexpr, EXPERTS_P2: tl.constexpr, USE_WHILE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """Over a block of experts' columns of the ``[chunks, experts]`` count table, CHUNK_STEP rows at a time
    (``cdiv(num_chunks, CHUNK_STEP)`` steps, the last masked past ``num_chunks``): each entry replaced by the sum of
    the entries above it (in place), and each column's sum."""
    start_dependent(PDL)  # programmatic dependent launch (ops/_pdl.py)
    experts = tl.program_id(0) * EXPERT_BLOCK + tl.arange(0, EXPERT_BLOCK)
    above = tl.zeros([EXPERT_BLOCK], dtype=tl.int32)
    if USE_WHILE:  # the CPU interpreter (see _triton_common)
        step = 0
        while step * CHUNK_STEP < num_chunks:
            above = _prefix_step(counts_ptr, experts, above, step, num_chunks, CHUNK_STEP, EXPERTS_P2)
            step += 1
    else:
        for step in range(tl.cdiv(num_chunks, CHUNK_STEP)):
            above = _prefix_step(counts_ptr, experts, above, step, num_chunks, CHUNK_STEP, EXPERTS_P2)
    tl.store(totals_ptr + experts, above)


@triton.jit
def _place_tile(local_ptr, rank_ptr, sorted_ptr, experts, base, tile, num_pairs, PAIR_TILE: tl.constexpr):
    """Each pair of one-hot tile ``tile`` written to its row: ``base`` of its expert plus its rank."""
    offs = tile * PAIR_TILE + tl.arange(0, PAIR_TILE)
    local = tl.load(local_ptr + offs, mask=offs < num_pairs, other=-1)
    keep = local >= 0
    rank = tl.load(rank_ptr + offs, mask=keep, other=0)
    dest = tl.sum(tl.where(experts[None, :] == local[:, None], base[None, :], 0), axis=1) + rank
    tl.store(sorted_ptr + dest, offs, mask=keep)


@triton.jit(do_not_specialize=["num_pairs", "num_blocks", "num_tiles", "chunk_tiles"])  # one compile for every size
def _align_place_kernel(
    local_ptr, rank_ptr, counts_ptr, totals_ptr, sorted_ptr, block_experts_ptr, num_padded_ptr,
    num_pairs, num_blocks, num_tiles, chunk_tiles,
    PAIR_TILE: tl.constexpr, EXPERTS_P2: tl.constexpr, BLOCK_M: tl.constexpr, ROWS: tl.constexpr,
    USE_WHILE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    start_dependent(PDL)  # programmatic dependent launch (ops/_pdl.py)
    pid = tl.program_id(0)
    experts = tl.arange(0, EXPERTS_P2)
    counts = tl.load(totals_ptr + experts)
    start, end, total = _runs(counts, BLOCK_M)
    if pid < num_tiles:
        _write_layout(sorted_ptr, block_experts_ptr, pid, counts, start, end, total, num_pairs, num_blocks, BLOCK_M,
                      ROWS)
        if pid == 0:
            tl.store(num_padded_ptr, total)
    else:
        chunk = pid - num_tiles
        base = start + tl.load(counts_ptr + chunk * EXPERTS_P2 + experts)  # the chunk's first row in each run
        if USE_WHILE:  # the CPU interpreter (see _triton_common)
            t = 0
            while t < chunk_tiles:
                _place_tile(local_ptr, rank_ptr, sorted_ptr, experts, base, chunk * chunk_tiles + t, num_pairs,
                            PAIR_TILE)
                t += 1
        else:
            for t in range(chunk_tiles):
                _place_tile(local_ptr, rank_ptr, sorted_ptr, experts, base, chunk * chunk_tiles + t, num_pairs,
                            PAIR_TILE)


def moe_align_block_size(topk_ids, num_experts, block_m, expert_map=None):
    check_args(topk_ids, num_experts, block_m, expert_map)
    device = topk_ids.device
    ids = topk_ids.reshape(-1)
    if not ids.is_contiguous():
        ids = ids.contiguous()
    num_pairs = ids.numel()
    blocks = max_blocks(num_pairs, num_experts, block_m)
    sorted_ids = torch.empty((blocks * block_m,), dtype=torch.int32, device=device)
    block_experts = torch.empty((blocks,), dtype=torch.int32, device=device)
    num_padded = torch.zeros((1,), dtype=torch.int32, device=device)
    if num_pairs == 0:
        return sorted_ids, block_experts, num_padded
    p = plan(num_pairs, num_experts, block_m)
    pdl_launch = pdl_keywords(device)
    map_arg = expert_map if expert_map is not None else ids
    has_map = expert_map is not None
    if p.single:
        _align_single_chunk_kernel[(p.tiles,)](
            ids, map_arg, sorted_ids, block_experts, num_padded, num_pairs, num_experts, blocks,
            HAS_MAP=has_map, PAIR_TILE=p.pair_tile, CHUNK_TILES=p.chunk_tiles, EXPERTS_P2=p.experts_p2,
            BLOCK_M=block_m, ROWS=p.rows, **pdl_launch, num_warps=p.num_warps,
        )
        return sorted_ids, block_experts, num_padded
    local = torch.empty((num_pairs,), dtype=torch.int32, device=device)
    rank = torch.empty((num_pairs,), dtype=torch.int32, device=device)
    counts = torch.empty((p.chunks, p.experts_p2), dtype=torch.int32, device=device)
    totals = torch.empty((p.experts_p2,), dtype=torch.int32, device=device)
    # the pairs reach these kernels only as runtime ints and grid sizes: one compile each per (experts, block_m, map)
    _align_count_kernel[(p.chunks,)](
        ids, map_arg, local, rank, counts, num_pairs, num_experts, p.chunk_tiles,
        HAS_MAP=has_map, PAIR_TILE=p.pair_tile, EXPERTS_P2=p.experts_p2, USE_WHILE=use_while(), **pdl_launch,
        num_warps=p.num_warps,
    )
    _align_prefix_kernel[(p.prefix_programs,)](
        counts, totals, p.chunks, CHUNK_STEP=p.chunk_step, EXPERT_BLOCK=p.expert_block, EXPERTS_P2=p.experts_p2,
        USE_WHILE=use_while(), **pdl_launch, num_warps=4,
    )
    _align_place_kernel[(p.tiles + p.chunks,)](
        local, rank, counts, totals, sorted_ids, block_experts, num_padded, num_pairs, blocks, p.tiles, p.chunk_tiles,
        PAIR_TILE=p.pair_tile, EXPERTS_P2=p.experts_p2, BLOCK_M=block_m, ROWS=p.rows, USE_WHILE=use_while(),
        **pdl_launch, num_warps=p.num_warps,
    )
    return sorted_ids, block_experts, num_padded


def unsupported(topk_ids, num_experts, block_m, expert_map=None) -> str | None:
    if block_m < 1 or block_m & (block_m - 1):
        return f"block_m {block_m} is not a power of two"
    return None
