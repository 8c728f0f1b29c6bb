"""Triton MXFP4 weight-only GEMM for decode batches (M <= 16): a GEMV-shaped kernel that streams the 4-bit weight
once and decodes it in registers. This is the register-load kernel; on sm_90 the ring kernel (``gluon_small_m``, same
math with asynchronous copies) serves the calls ``planner.ring_applies`` admits.

Work split: each program owns ``BLOCK_N`` output columns and ``K_SPLIT`` of K (split-K, so that a few programs per SM
stream the weight even at M = 1); the tokens are padded to one 16-row tile. Two MMA arrangements (``mma``):

* ``"sync"``: the tokens are the A operand and the decoded weight the B operand (``tl.dot(x, w.T)``, ``mma.sync``); the
  bf16 operand layout (``kWidth = 8``) gives each thread 8 consecutive K of one column: one word of codes.
* ``"wgmma"``: the weight is the A operand (``tl.dot(w, x.T)``, 64 rows per warpgroup MMA, from registers) and the
  tokens the B operand from shared memory; each thread holds K pairs ``2t, 2t+1`` of every 8.

The decoded values never take a shared-memory round trip, and in ``"wgmma"`` the raw words and scale bytes do not
either: they are loaded in the operand's row order (``mma_rows``), so the only shared memory in the loop is the
activation tile (checked on the sm_90 SASS by ``tests/test_sm90_compile.py``).

K order: the kernel computes ``x_perm @ w_perm.T`` with the same permutation of K inside every block of ``32 * C``
elements on both sides (``C`` = 4, 2 or 1 scale groups, ``decode.chunk_groups``), so the result is ``x @ w.T``. Memory
word ``C * t + j`` of a block lands where the MMA layout wants the codes of thread ``t`` for logical group ``j``: each
thread loads ``C`` contiguous words (one 16-byte load for C = 4) sharing one e8m0 scale, and the activations are gathered
in the permuted order (``activation_k``). The decode is ``decode.decode_words``.

Split-K partials (fp32) are summed in split order, so results do not depend on scheduling: by the last program of each
column block to finish (``REDUCE = 1``: an int32 arrival counter per column block, reset by that program for the next
call) or by ``gemm_common.reduce_splits`` (``REDUCE = 0``: a second kernel). Both are CUDA-graph safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.dispatch import triton_interpreting
from atom_kernels.ops._triton_common import dot_acc
from atom_kernels.ops.gemm_common import reduce_splits
from atom_kernels.ops.mxfp4_mm.decode import _SHIFT, chunk_groups, decode_words  # noqa: F401  (chunk_groups: fused_moe)
from atom_kernels.ops.mxfp4_mm.planner import SMALL_M_MAX, _ring_capability, plan, ring_applies

_BLOCK_M = 16


@triton.jit
def word_runs(NB: tl.constexpr, C: tl.constexpr):
    """Word offsets ``[NB, 4C]`` of one K step's memory runs (row start 0): block ``b`` holds words ``4C b ..``."""
    return (tl.arange(0, NB) * (4 * C))[:, None] + tl.arange(0, 4 * C)[None, :]


@triton.jit
def run_scales(NB: tl.constexpr, C: tl.constexpr):
    """Scale offsets ``[NB, 4]`` (row start 0) of thread ``t``'s run in each block: group ``C b + C t // 4``."""
    return (tl.arange(0, NB) * C)[:, None] + (C * tl.arange(0, 4) // 4)[None, :]


@triton.jit
def logical_tile(words, e, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, C: tl.constexpr, WGMMA: tl.constexpr,
                 EXACT: tl.constexpr, SHIFT: tl.constexpr):
    """Memory runs ``words [BLOCK_N, NB, 4C]`` int32 and their scales ``e [BLOCK_N, NB, 4]`` -> the decoded
    weight tile ``[BLOCK_N, BLOCK_K]`` (values ``* 2**-SHIFT``) in the logical K order of ``activation_k``."""
    NB: tl.constexpr = BLOCK_K // (32 * C)
    W: tl.constexpr = BLOCK_K // 8
    words = tl.reshape(tl.permute(tl.reshape(words, (BLOCK_N, NB, 4, C)), (0, 1, 3, 2)), (BLOCK_N, W))  # [.., j, t]
    e = tl.reshape(tl.broadcast_to(e[:, :, None, :], (BLOCK_N, NB, C, 4)), (BLOCK_N, W))
    v = decode_words(words, e, SHIFT, EXACT)  # [BLOCK_N, W, 8]: code order within each word
    if WGMMA:  # code 2 p + l of word (j, t) -> logical 32 j + 8 p + 2 t + l
        v = tl.permute(tl.reshape(v, (BLOCK_N, NB, C, 4, 4, 2)), (0, 1, 2, 4, 3, 5))
    return tl.reshape(v, (BLOCK_N, BLOCK_K))


@triton.jit
def activation_k(BLOCK_K: tl.constexpr, C: tl.constexpr, WGMMA: tl.constexpr):
    """The natural K offset (from the step start) of each logical K position: logical
    ``32C blk + 32 j + 8 t + i`` ("sync") or ``32C blk + 32 j + 8 p + 2 t + l`` ("wgmma", i = 2 p + l) holds
    code ``i`` of memory word ``C t + j`` of block ``blk``, natural ``32C blk + 8 (C t + j) + i``."""
    kl = tl.arange(0, BLOCK_K)
    base = (kl // (32 * C)) * (32 * C) + 8 * ((kl // 32) % C)
    if WGMMA:
        kn = base + 8 * C * ((kl // 2) % 4) + 2 * ((kl // 8) % 4) + kl % 2
        return tl.max_contiguous(tl.multiple_of(kn, 2), 2)
    kn = base + 8 * C * ((kl // 8) % 4) + kl % 8
    return tl.max_contiguous(tl.multiple_of(kn, 8), 8)


@triton.jit
def mma_rows(BLOCK_N: tl.constexpr):
    """Tile row indices shaped ``[8, 4, 2, 1, BLOCK_N / 64]``, row = l + 16 w + 8 r + 64 a: the order in which
    the warpgroup MMA's register operand (4 warps) holds the rows -- lane // 4, warp, register, (a slot for
    the K blocks), repetition.

    Why: Triton's coalescing pass lays a load out by the address pattern alone (threads over the contiguous
    dimension first, then over the others in order), and a load is never re-laid out afterwards.  Loaded as
    ``[BLOCK_N, NB, 4C]`` the words came with rows 8..15 on another warp than the operand wants, and Triton
    moved every word through shared memory (4 barriers per K step; the scale bytes too).  Shaped like this,
    the words (``[8, 4, 2, NB, BLOCK_N / 64, 4C]``, 16-byte runs contiguous) and the scales
    (``[4, 8, 4, 2, NB, BLOCK_N / 64]``, no contiguous dimension) get the operand's own layout."""
    l = tl.arange(0, 8)[:, None, None, None, None]
    w = tl.arange(0, 4)[None, :, None, None, None] * 16
    r = tl.arange(0, 2)[None, None, :, None, None] * 8
    a = tl.arange(0, BLOCK_N // 64)[None, None, None, None, :] * 64
    return l + w + r + a


@triton.jit
def from_mma_rows(words, BLOCK_N: tl.constexpr, NB: tl.constexpr, X: tl.constexpr):
    """Words loaded as ``[8, 4, 2, NB, BLOCK_N / 64, X]`` (rows as ``mma_rows``) -> ``[BLOCK_N, NB, X]``."""
    return tl.reshape(tl.permute(words, (4, 1, 2, 0, 3, 5)), (BLOCK_N, NB, X))


@triton.jit
def from_mma_rows_t(scales, BLOCK_N: tl.constexpr, NB: tl.constexpr, X: tl.constexpr):
    """Scales loaded as ``[X, 8, 4, 2, NB, BLOCK_N / 64]`` -> ``[BLOCK_N, NB, X]``."""
    return tl.reshape(tl.permute(scales, (5, 2, 3, 1, 4, 0)), (BLOCK_N, NB, X))


@triton.jit
def _mxfp4_small_m_kernel(
    w_ptr, s_ptr, x_ptr, out_ptr, ws_ptr, lock_ptr, bias_ptr,
    N, M, stride_xm, stride_om,
    K: tl.constexpr, K_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr, C: tl.constexpr, HAS_BIAS: tl.constexpr,
    REDUCE: tl.constexpr, WGMMA: tl.constexpr, MMA_ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr, EXACT: tl.constexpr, SHIFT: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
):
    NB: tl.constexpr = BLOCK_K // (32 * C)  # blocks of 32*C elements per K step
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mask_n = offs_n < N
    mask_m = offs_m < M
    blk = tl.arange(0, NB)
    if MMA_ROWS:  # loads shaped as the MMA operand holds the rows (mma_rows): no layout conversion after them
        rows = pid_n * BLOCK_N + mma_rows(BLOCK_N)  # [8, 4, 2, 1, BLOCK_N / 64]
        if not EVEN_N:
            rows = tl.where(rows < N, rows, 0)  # padding columns read column 0 (in bounds), never stored
        w_off = rows.to(tl.int64)[:, :, :, :, :, None] * (K // 8) + word_runs(NB, C)[None, None, None, :, None, :]
        w_off = tl.max_contiguous(w_off, [1, 1, 1, 1, 1, C])  # one thread's run: C words (not the 4C of a block)
        s_off = rows.to(tl.int64)[None, :, :, :, :, :] * (K // 32) + tl.trans(run_scales(NB, C))[:, None, None, None, :, None]
    else:
        rows = tl.where(mask_n, offs_n, 0) if not EVEN_N else offs_n
        w_off = rows.to(tl.int64)[:, None, None] * (K // 8) + word_runs(NB, C)[None, :, :]
        s_off = rows.to(tl.int64)[:, None, None] * (K // 32) + run_scales(NB, C)[None, :, :]
    kn = activation_k(BLOCK_K, C, WGMMA)
    x_off = offs_m.to(tl.int64)[:, None] * stride_xm + kn[None, :]
    if WGMMA:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)

    for step in range(0, K_SPLIT, BLOCK_K):
        k0 = pid_k * K_SPLIT + step
        if EVEN_K:
            words = tl.load(w_ptr + (w_off + k0 // 8))
            e = tl.load(s_ptr + (s_off + k0 // 32))
            x = tl.load(x_ptr + (x_off + k0), mask=mask_m[:, None], other=0.0)
        else:  # blocks past K read nothing (code 0, activation 0)
            blk_ok = (k0 // (32 * C) + blk) < K // (32 * C)
            if MMA_ROWS:
                w_ok = blk_ok[None, None, None, :, None, None]
                s_ok = blk_ok[None, None, None, None, :, None]
            else:
                w_ok = blk_ok[None, :, None]
                s_ok = blk_ok[None, :, None]
            words = tl.load(w_ptr + (w_off + k0 // 8), mask=w_ok, other=0)
            e = tl.load(s_ptr + (s_off + k0 // 32), mask=s_ok, other=0)
            x = tl.load(x_ptr + (x_off + k0), mask=mask_m[:, None] & ((k0 + kn) < K)[None, :], other=0.0)
        if MMA_ROWS:
            words = from_mma_rows(words, BLOCK_N, NB, 4 * C)
            e = from_mma_rows_t(e, BLOCK_N, NB, 4)
        w_tile = logical_tile(words, e, BLOCK_N, BLOCK_K, C, WGMMA, EXACT, SHIFT)
        x = x.to(tl.float32) if EXACT else x.to(tl.bfloat16)
        if WGMMA:
            acc = dot_acc(w_tile, tl.trans(x), acc, EXACT)
        else:
            acc = dot_acc(x, tl.trans(w_tile), acc, EXACT)
    if WGMMA:
        acc = tl.trans(acc)
    acc = acc * (2.0 ** SHIFT)

    out_offs = offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        ws_offs = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(ws_ptr + pid_k.to(tl.int64) * M * N + ws_offs, acc, mask=mask)
        if REDUCE == 1:
            tl.debug_barrier()  # every thread's partial is written before the arrival is published
            arrived = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:  # the last program of this column block sums all partials in order
                total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for split in range(SPLIT_K):
                    total += tl.load(ws_ptr + split * M * N + ws_offs, mask=mask, other=0.0, cache_modifier=".cg")
                if HAS_BIAS:
                    total += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
                tl.store(out_ptr + out_offs, total.to(out_ptr.dtype.element_ty), mask=mask)
                tl.atomic_xchg(lock_ptr + pid_n, 0, sem="relaxed", scope="gpu")  # ready for the next call


_LOCKS: dict[tuple, torch.Tensor] = {}
_OUTGROWN_LOCKS: list[torch.Tensor] = []  # buffers replaced by larger ones: a captured CUDA graph may still use them


def _locks(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 arrival counters (one per column block) for the in-kernel split-K reduction; every call
    leaves them zero again.  One buffer per device and stream, so kernels on different streams never share
    a counter.  (Made during a CUDA-graph capture, the buffer comes from the graph's pool and its zeroing is
    part of the graph; the cache keeps it alive.)  A buffer that a larger call outgrows is kept alive too: a graph
    captured with it replays its address, which must not go back to the allocator for other tensors."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device.type, device.index, stream)
    buf = _LOCKS.get(key)
    if buf is None or buf.numel() < n:
        if buf is not None:
            _OUTGROWN_LOCKS.append(buf)
        buf = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        _LOCKS[key] = buf
    return buf


def mxfp4_mm_small_m(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None,
                     config: dict | None = None, out: torch.Tensor | None = None,
                     workspace: torch.Tensor | None = None, layout: str = "rows",
                     static_weights: bool = False) -> torch.Tensor:
    """``x [M <= 16, K] @ dequant(w, w_scale).T (+ bias)``; ``out`` and ``workspace`` (fp32, at least
    ``split * M * N``) may be given (the tests pass poisoned ones).  ``static_weights``: no recent kernel on the
    stream writes ``w`` / ``w_scale`` (``gluon_small_m``: the ring kernel then starts copying them before it waits
    for the previous kernel).  Weights in the ``"lanes"`` layout are read by
    the ring kernel only (``ring_serves``; ``triton.mxfp4_mm`` sends other calls to the warpgroup-MMA kernel)."""
    m, k = x.shape
    n = w.shape[0]
    if m > SMALL_M_MAX:
        raise ValueError(f"the small-M MXFP4 kernel takes at most {SMALL_M_MAX} tokens, got {m}")
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    if x.stride(1) != 1:  # both kernels read a row's K as consecutive elements
        x = x.contiguous()
    p = plan(m, n, k, x.device, config, layout)
    split = p["split"]
    reduce_in_kernel = p["reduce"] == "in_kernel"
    locks = _locks(x.device, p["tiles"]) if split > 1 and reduce_in_kernel else None
    if split > 1 and workspace is None:
        workspace = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    if ring_applies(p, k, x.stride(0), x.data_ptr(), _ring_capability(x.device)):
        from atom_kernels.ops.mxfp4_mm.gluon_small_m import launch_ring  # Gluon: sm_90 only, imported on use

        launch_ring(x, w, w_scale, out, workspace, locks, bias, p, _SHIFT, lanes=layout == "lanes",
                    static_weights=static_weights)
    elif layout != "rows":
        raise ValueError(f"the register-load small-M kernel reads the 'rows' layout, not {layout!r}")
    else:
        _mxfp4_small_m_kernel[(p["tiles"], split)](
            w.view(torch.int32), w_scale.view(torch.uint8), x, out, workspace if split > 1 else out,
            locks if locks is not None else out, bias if bias is not None else out,
            n, m, x.stride(0), out.stride(0),
            K=k, K_SPLIT=p["k_split"], SPLIT_K=split, C=p["c"], HAS_BIAS=bias is not None,
            REDUCE=1 if reduce_in_kernel else 0, WGMMA=p["mma"] == "wgmma", MMA_ROWS=p["mma_rows"], BLOCK_N=p["block_n"],
            BLOCK_M=_BLOCK_M,
            BLOCK_K=p["block_k"],
            EXACT=triton_interpreting(), SHIFT=_SHIFT, EVEN_N=n % p["block_n"] == 0, EVEN_K=p["k_split"] * split == k,
            num_warps=p["num_warps"], num_stages=p["num_stages"],
        )
    if split > 1 and not reduce_in_kernel:
        reduce_splits(workspace[:split].view(split, m, n), out, bias)
    return out
