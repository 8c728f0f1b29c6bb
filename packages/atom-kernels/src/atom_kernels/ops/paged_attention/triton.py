"""Triton paged attention: one kernel for decode and chunked prefill, split-K over the context, then a reduce.

Stage 1, program ``(tile, kv_head, split)``.  A tile is ``BLOCK_Q`` consecutive queries of one sequence times the
``G = H / kv_heads`` query heads sharing ``kv_head`` (padded to a power of two), flattened into ``BLOCK_M`` rows,
so a decode step (one query) still gives ``tl.dot`` 16 rows when G is small and reads each K/V row once per group.
Sequence b owns tiles ``[query_start_loc[b] // BLOCK_Q + b, ...)``; the grid holds ``T // BLOCK_Q + B`` tiles (an
upper bound on the tiles any split of T queries into B sequences needs), each program finds its sequence by
counting the sequences that start at or before it, and spare tiles return at once.  So the grid depends on shapes
only and nothing is read on the host.

A tile's keys are ``[lo, hi)``: ``hi`` one past its last query's position, ``lo`` its first query's window start
(0 without a window).  Split s of ``SPLITS`` takes ``ceil((hi - lo) / SPLITS)`` of them (rounded up to BLOCK_N) and
folds them, BLOCK_N at a time, into an online softmax in base 2 with a causal / window mask per row; split 0 starts
from the sink logit (``m = sink``, ``l = 1``), which puts the sink in the denominator exactly once.  Each split
writes its normalised output and log-sum-exp; with one split it writes the output directly.  Stage 2
(:mod:`atom_kernels.ops._splitk`): the lse-weighted sum of the splits.

The split count comes from shapes (programs already in the grid, the block table's width) so a CUDA graph captured
for a token count replays for any lengths; decode of long contexts gets several splits, long prefills one.
fp8 caches are widened in registers; ``k_scale`` joins the score scale and ``v_scale`` the output (both read on the
device).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from atom_kernels.ops import _splitk as splitk
from atom_kernels.ops._triton_common import FLOAT_DTYPES, dot_dtype, dot_precision, use_while
from atom_kernels.ops.paged_attention.reference import check_paged_args

MAX_SPLITS = 32
SEQ_BLOCK = 64  # sequences a program reads per step while it finds its own
MAX_HEAD_DIM = 256
_FP8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


@dataclass(frozen=True)
class Config:
    block_m: int | None = None  # rows (queries x heads of a group) per tile; None: 16 for decode-like steps, else 64
    block_n: int | None = None  # context tokens per step; None: 64 for head dims up to 128, else 32
    num_warps: int | None = None  # None: 8 for tiles past 64 x 128 (the fp32 accumulator's registers), else 4
    num_stages: int = 2
    splits: int | None = None  # None: from the shapes (see num_splits)


DEFAULT = Config()


def num_splits(programs: int, max_context: int, device: torch.device) -> int:
    """Splits of each (query tile, KV head) program's context (see _splitk.num_splits)."""
    return splitk.num_splits(programs, max_context, device, MAX_SPLITS)


def unsupported(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, *, sliding_window=None,
                sinks=None, soft_cap=None, k_scale=None, v_scale=None) -> str | None:
    if q.dtype not in FLOAT_DTYPES:
        return f"q {q.dtype}: bf16 / fp16 / fp32 only"
    if k_cache.dtype not in FLOAT_DTYPES + _FP8 or v_cache.dtype != k_cache.dtype:
        return f"caches {k_cache.dtype} / {v_cache.dtype}: one float or fp8 e4m3 dtype"
    if q.shape[-1] > MAX_HEAD_DIM:
        return f"head dim {q.shape[-1]} > {MAX_HEAD_DIM}"
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        return "q and caches need a contiguous last dim"
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if s is not None and not isinstance(s, torch.Tensor):
            return f"{name} must be a tensor (read on the device)"
    return None


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _step(n0, m, l, acc, q, k_ptr, v_ptr, bt_row_ptr, end, q_pos, cols, d_ok, sk_blk, sk_tok, sv_blk, sv_tok,
          qk_scale, soft_cap, window, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, SOFT_CAP: tl.constexpr,
          WINDOW: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr):
    """Fold context tokens ``[n0, n0 + BLOCK_N) ∩ [.., end)`` into the online softmax ``(m, l, acc)``."""
    pos = n0 + tl.arange(0, BLOCK_N)
    ok = pos < end
    block = tl.load(bt_row_ptr + pos // PAGE, mask=ok, other=0).to(tl.int64)
    tok = (pos % PAGE).to(tl.int64)
    kv_ok = ok[:, None] & d_ok[None, :]
    k = tl.load(k_ptr + block[:, None] * sk_blk + tok[:, None] * sk_tok + cols[None, :], mask=kv_ok, other=0.0)
    s = tl.dot(q, tl.trans(k.to(tl.float32).to(DOT)), input_precision=PREC) * qk_scale  # [BLOCK_M, BLOCK_N]
    if SOFT_CAP:
        s = soft_cap * _tanh(s / soft_cap)
    visible = ok[None, :] & (pos[None, :] <= q_pos[:, None])
    if WINDOW:
        visible = visible & (q_pos[:, None] - pos[None, :] < window)
    s = tl.where(visible, s * 1.4426950408889634, float("-inf"))  # base-2 logits
    m_new = tl.maximum(m, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet (window, spare row)
    alpha = tl.exp2(m - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l = l * alpha + tl.sum(p, 1)
    v = tl.load(v_ptr + block[:, None] * sv_blk + tok[:, None] * sv_tok + cols[None, :], mask=kv_ok, other=0.0)
    acc = acc * alpha[:, None] + tl.dot(p.to(DOT), v.to(tl.float32).to(DOT), input_precision=PREC)
    return m_new, l, acc


@triton.jit
def _seqs_started(qsl_ptr, s0, num_seqs, tile, BLOCK_Q: tl.constexpr, SEQ_BLOCK: tl.constexpr):
    """How many of sequences ``s0 .. s0 + SEQ_BLOCK - 1`` have their first tile (``query_start_loc[b] // BLOCK_Q +
    b``) at or before ``tile``."""
    seqs = s0 + tl.arange(0, SEQ_BLOCK)
    ok = seqs < num_seqs
    firsts = tl.load(qsl_ptr + seqs, mask=ok, other=0) // BLOCK_Q + seqs
    return tl.sum(((firsts <= tile) & ok).to(tl.int32), 0)


# The sequence count and the split count follow the step: runtime arguments, never specialized (a new batch
# composition compiles nothing); the constexprs take one value per model and tile class.
@triton.jit(do_not_specialize=["sbt_b", "num_seqs", *splitk.SPLIT_ARGS])
def _split_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, lens_ptr, qsl_ptr, sinks_ptr, ks_ptr, vs_ptr, o_ptr, lse_ptr,
    sq_t, sq_h, sk_blk, sk_tok, sk_h, sv_blk, sv_tok, sv_h, sbt_b, so_t, so_h, so_s, slse_t, slse_h,
    num_seqs, splits, scale, soft_cap, window,
    G: tl.constexpr, GP2: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, D: tl.constexpr,
    BD: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr, SEQ_BLOCK: tl.constexpr,
    HAS_SINKS: tl.constexpr, SOFT_CAP: tl.constexpr, WINDOW: tl.constexpr, HAS_K_SCALE: tl.constexpr,
    HAS_V_SCALE: tl.constexpr, DIRECT: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr,
    USE_WHILE: tl.constexpr, STAGES: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # the sequence of this tile: the last one whose first tile is <= tile
    started = 0
    if USE_WHILE:  # the CPU interpreter (see _triton_common)
        s0 = 0
        while s0 < num_seqs:
            started += _seqs_started(qsl_ptr, s0, num_seqs, tile, BLOCK_Q, SEQ_BLOCK)
            s0 += SEQ_BLOCK
    else:
        for s0 in tl.range(0, num_seqs, SEQ_BLOCK):
            started += _seqs_started(qsl_ptr, s0, num_seqs, tile, BLOCK_Q, SEQ_BLOCK)
    seq = tl.maximum(started - 1, 0)
    q_first = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_first
    q_begin = (tile - (q_first // BLOCK_Q + seq)) * BLOCK_Q  # this tile's first query within the sequence
    if q_begin < q_len:
        context = tl.load(lens_ptr + seq)
        rows = tl.arange(0, BLOCK_M)
        qi = q_begin + rows // GP2
        head_in_group = rows % GP2
        row_ok = (qi < q_len) & (head_in_group < G)
        head = kv_head * G + head_in_group
        q_pos = context - q_len + qi
        token = (q_first + qi).to(tl.int64)
        cols = tl.arange(0, BD)
        d_ok = cols < D

        hi = context - q_len + tl.minimum(q_begin + BLOCK_Q, q_len)
        lo = 0
        if WINDOW:
            lo = tl.maximum(context - q_len + q_begin - window + 1, 0)
        per_split = tl.cdiv(tl.cdiv(hi - lo, splits), BLOCK_N) * BLOCK_N
        start = lo + split * per_split
        end = tl.minimum(start + per_split, hi)

        q_tile = q_ptr + token[:, None] * sq_t + head[:, None] * sq_h + cols[None, :]
        q = tl.load(q_tile, mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(DOT)
        qk_scale = scale
        if HAS_K_SCALE:
            qk_scale = scale * tl.load(ks_ptr).to(tl.float32)
        seq64 = seq.to(tl.int64)
        bt_row_ptr = bt_ptr + seq64 * sbt_b
        k_base = k_ptr + kv_head * sk_h
        v_base = v_ptr + kv_head * sv_h

        m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l = tl.zeros([BLOCK_M], dtype=tl.float32)
        if HAS_SINKS:  # split 0 starts from the sink: one more term in the denominator, nothing in acc
            sink = tl.load(sinks_ptr + head, mask=head_in_group < G, other=0.0).to(tl.float32) * 1.4426950408889634
            m = tl.where(split == 0, sink, m)
            l = tl.where(split == 0, 1.0, l)
        acc = tl.zeros([BLOCK_M, BD], dtype=tl.float32)
        if USE_WHILE:  # the CPU interpreter (see _triton_common)
            n0 = start
            while n0 < end:
                m, l, acc = _step(n0, m, l, acc, q, k_base, v_base, bt_row_ptr, end, q_pos, cols, d_ok, sk_blk,
                                  sk_tok, sv_blk, sv_tok, qk_scale, soft_cap, window, PAGE, BLOCK_N, SOFT_CAP,
                                  WINDOW, DOT, PREC)
                n0 += BLOCK_N
        else:
            for n0 in tl.range(start, end, BLOCK_N, num_stages=STAGES):
                m, l, acc = _step(n0, m, l, acc, q, k_base, v_base, bt_row_ptr, end, q_pos, cols, d_ok, sk_blk,
                                  sk_tok, sv_blk, sv_tok, qk_scale, soft_cap, window, PAGE, BLOCK_N, SOFT_CAP,
                                  WINDOW, DOT, PREC)

        # an empty split has l = 0 (no sink) and acc = 0: its output is zeros and its lse -inf
        out = acc / tl.where(l > 0, l, 1.0)[:, None]
        if HAS_V_SCALE:
            out = out * tl.load(vs_ptr).to(tl.float32)
        o_tile = o_ptr + token[:, None] * so_t + head[:, None] * so_h + split * so_s + cols[None, :]
        tl.store(o_tile, out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
        if not DIRECT:
            lse = tl.where(l > 0, m + tl.log2(tl.where(l > 0, l, 1.0)), float("-inf"))
            tl.store(lse_ptr + token * slse_t + head * slse_h + split, lse, mask=row_ok)


def paged_attention(q, k_cache, v_cache, block_table, seq_lens, query_start_loc, scale, *, sliding_window=None,
                    sinks=None, soft_cap=None, k_scale=None, v_scale=None, config: Config | None = None):
    check_paged_args(q, k_cache, v_cache, block_table, seq_lens, query_start_loc)
    cfg = config or DEFAULT
    tokens, heads, dim = q.shape
    batch = block_table.shape[0]
    _, page, kv_heads, _ = k_cache.shape
    out = torch.empty_like(q)
    if tokens == 0 or batch == 0:
        return out
    group = heads // kv_heads
    group_p2 = triton.next_power_of_2(group)
    block_m = cfg.block_m or (16 if tokens <= 2 * batch else 64)
    block_m = max(block_m, group_p2)
    block_q = block_m // group_p2
    block_n = cfg.block_n or (64 if dim <= 128 else 32)
    bd = max(16, triton.next_power_of_2(dim))
    num_warps = cfg.num_warps or (8 if block_m * bd > 64 * 128 else 4)
    tiles = tokens // block_q + batch
    splits = cfg.splits or num_splits(tiles * kv_heads, block_table.shape[1] * page, q.device)
    parts = splitk.split_buffers(out, splits)
    dummy = query_start_loc  # stands in for absent optional tensors (never read)
    _split_kernel[(tiles, kv_heads, splits)](
        q, k_cache, v_cache, block_table, seq_lens, query_start_loc,
        sinks if sinks is not None else dummy, k_scale if k_scale is not None else dummy,
        v_scale if v_scale is not None else dummy, parts.o_part, parts.lse,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_table.stride(0),
        parts.so_row, parts.so_head, parts.so_split, parts.slse_row, parts.slse_head,
        batch, splits, float(scale), float(soft_cap or 1.0), int(sliding_window or 0),
        G=group, GP2=group_p2, BLOCK_Q=block_q, BLOCK_M=block_m, D=dim, BD=bd,
        PAGE=page, BLOCK_N=block_n, SEQ_BLOCK=SEQ_BLOCK,
        HAS_SINKS=sinks is not None, SOFT_CAP=soft_cap is not None, WINDOW=sliding_window is not None,
        HAS_K_SCALE=k_scale is not None, HAS_V_SCALE=v_scale is not None, DIRECT=parts.direct,
        DOT=dot_dtype(q.dtype), PREC=dot_precision(q.dtype), USE_WHILE=use_while(), STAGES=cfg.num_stages,
        num_warps=num_warps,
    )
    splitk.combine_splits(parts, out, MAX_SPLITS)
    return out


_WARM: set[tuple] = set()


def warm_up(q, k_cache, v_cache, scale, *, sliding_window=None, sinks=None, soft_cap=None, k_scale=None,
            v_scale=None) -> None:
    """Compile every variant the host's steps can launch for calls like this one (q's dtype, heads and head dim, the
    caches' dtype and block shape, which options are present), once per such kind: one dummy one-sequence step of
    each tile class (a decode token, a three-token prefill) written directly and split in two, reading block 0 of
    the given caches into a scratch output (nothing else written)."""
    key = (q.dtype, *q.shape[1:], k_cache.dtype, *k_cache.shape[1:], q.device, sliding_window is not None,
           sinks is not None, soft_cap is not None, k_scale is not None, v_scale is not None)
    if key in _WARM:
        return
    page = k_cache.shape[1]
    for tokens in (1, 3):
        table = torch.zeros(1, triton.cdiv(tokens, page), dtype=torch.int32, device=q.device)
        lens = torch.tensor([tokens], dtype=torch.int32, device=q.device)
        starts = torch.tensor([0, tokens], dtype=torch.int32, device=q.device)
        for splits in (1, 2):
            paged_attention(q.new_zeros(tokens, *q.shape[1:]), k_cache, v_cache, table, lens, starts, scale,
                            sliding_window=sliding_window, sinks=sinks, soft_cap=soft_cap, k_scale=k_scale,
                            v_scale=v_scale, config=Config(splits=splits))
    _WARM.add(key)
