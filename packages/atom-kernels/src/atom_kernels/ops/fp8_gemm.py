"""The Triton FP8 GEMM behind ``fp8_scaled_mm`` (per-row x per-column scales, applied once in the
epilogue) and ``fp8_block_mm`` (a scale per K block of 128, applied to each block's partial product).

One kernel computes ``C[P, Q] = A[P, K] . B[Q, K]^T`` with both operands K-major (what FP8 tensor
cores want).  A call with few tokens *swaps* the operands (``P`` runs over the weight's output
features, ``Q`` over the tokens), so the large dimension fills the 64-row MMA tile and a token count
of 1-16 only pads ``Q`` to 16; the output strides undo the swap.  Decode-sized calls also split K over
programs (fp32 partial sums reduced by a second kernel) so the GPU gets enough programs to stream
the weight at full bandwidth.

Loop bounds are compile-time constants (one specialization per weight shape): Triton 3.6's CPU
interpreter cannot iterate over a runtime integer with numpy >= 2.4.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.ops._triton_common import grouped_tile
from atom_kernels.ops.gemm_common import pick_split_k, reduce_splits

# Kernel configurations by the number of tokens (rows of the activation).  ``split_k`` "auto" picks
# the smallest split that gives every SM about two programs.  The bench sweeps alternatives.
CONFIGS: dict[str, dict] = {
    "decode": dict(swap=True, block_p=64, block_q=16, block_k=256, split_k="auto", group=1, num_warps=4, num_stages=4),
    "small": dict(swap=True, block_p=128, block_q=64, block_k=128, split_k="auto", group=1, num_warps=4, num_stages=4),
    "medium": dict(swap=False, block_p=128, block_q=128, block_k=128, split_k=1, group=8, num_warps=8, num_stages=3),
    "large": dict(swap=False, block_p=128, block_q=256, block_k=128, split_k=1, group=8, num_warps=8, num_stages=3),
}


# Block-scaled mode keeps two fp32 tiles live (the running sum and each K block's product awaiting its scales),
# so its large tile is halved: 128x256 with 8 warps spills 240 bytes per thread on sm_90 (Triton 3.6; 4.0 ms at
# M = 4096 on an H200), 128x128 none.
BLOCKWISE_CONFIGS: dict[str, dict] = {**CONFIGS, "large": dict(CONFIGS["large"], block_q=128)}
# Large-M block-scaled alternatives the bench times (each merged over BLOCKWISE_CONFIGS["large"]).
BLOCKWISE_LARGE_SWEEP: list[dict] = [
    dict(num_stages=4),
    dict(block_p=64, num_warps=4),
    dict(block_p=64, num_warps=4, num_stages=4),
    dict(group=16),
]


# Decode-shape alternatives the bench times (each merged over CONFIGS["decode"]).
SWEEP: list[dict] = [
    dict(block_p=bp, block_k=bk, split_k=sk)
    for bp, bk in ((64, 256), (128, 128), (64, 128))
    for sk in (1, 2, "auto")
]


def shape_class(m: int) -> str:
    if m <= 16:
        return "decode"
    if m <= 64:
        return "small"
    if m <= 1024:
        return "medium"
    return "large"


@triton.jit
def _fp8_gemm_kernel(
    a_ptr, b_ptr, c_ptr, ws_ptr, as_ptr, bs_ptr, bias_ptr,
    P, Q,
    stride_ap, stride_bq, stride_cp, stride_cq,
    stride_as_p, stride_as_k, stride_bs_q, stride_bs_k,
    K: tl.constexpr, K_SPLIT: tl.constexpr,
    BLOCKWISE: tl.constexpr, A_SCALE_DIV: tl.constexpr, B_SCALE_DIV: tl.constexpr,
    HAS_BIAS: tl.constexpr, BIAS_ON_P: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    tile_p, tile_q = grouped_tile(pid, tl.cdiv(P, BLOCK_P), tl.cdiv(Q, BLOCK_Q), GROUP)

    offs_p = tile_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_q = tile_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_k = tl.arange(0, BLOCK_K)
    mask_p = offs_p < P
    mask_q = offs_q < Q
    a_rows = a_ptr + offs_p.to(tl.int64)[:, None] * stride_ap
    b_cols = b_ptr + offs_q.to(tl.int64)[None, :] * stride_bq
    acc = tl.zeros((BLOCK_P, BLOCK_Q), dtype=tl.float32)
    k_start = pid_k * K_SPLIT
    for step in range(0, K_SPLIT, BLOCK_K):
        k = k_start + step + offs_k
        mask_k = k < K
        a = tl.load(a_rows + k[None, :], mask=mask_p[:, None] & mask_k[None, :], other=0.0)
        b = tl.load(b_cols + k[:, None], mask=mask_k[:, None] & mask_q[None, :], other=0.0)
        if BLOCKWISE:
            kb = (k_start + step) // BLOCK_K
            sa = tl.load(as_ptr + (offs_p // A_SCALE_DIV) * stride_as_p + kb * stride_as_k, mask=mask_p, other=0.0)
            sb = tl.load(bs_ptr + (offs_q // B_SCALE_DIV) * stride_bs_q + kb * stride_bs_k, mask=mask_q, other=0.0)
            acc += tl.dot(a, b) * (sa[:, None] * sb[None, :])
        else:
            acc = tl.dot(a, b, acc)
    if not BLOCKWISE:
        sa = tl.load(as_ptr + offs_p * stride_as_p, mask=mask_p, other=0.0)
        sb = tl.load(bs_ptr + offs_q * stride_bs_q, mask=mask_q, other=0.0)
        acc = acc * sa[:, None] * sb[None, :]
    c_offs = offs_p.to(tl.int64)[:, None] * stride_cp + offs_q.to(tl.int64)[None, :] * stride_cq
    mask = mask_p[:, None] & mask_q[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            if BIAS_ON_P:
                acc += tl.load(bias_ptr + offs_p, mask=mask_p, other=0.0).to(tl.float32)[:, None]
            else:
                acc += tl.load(bias_ptr + offs_q, mask=mask_q, other=0.0).to(tl.float32)[None, :]
        tl.store(c_ptr + c_offs, acc.to(c_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(ws_ptr + pid_k.to(tl.int64) * P * Q + c_offs, acc, mask=mask)


def fp8_gemm(a, b, a_scale, b_scale, bias, out_dtype, *, blockwise: bool, block_n: int = 1, config: dict | None = None):
    """``out [M, N] = dequant(a [M, K]) . dequant(b [N, K])^T (+ bias)``.

    Row/column mode: ``a_scale [M, 1]``, ``b_scale [N, 1]``.  Block mode: ``a_scale [M, K/128]`` (one per
    token per 128 columns), ``b_scale [ceil(N/block_n), K/128]``.
    """
    m, k = a.shape
    n = b.shape[0]
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    cfg = dict((BLOCKWISE_CONFIGS if blockwise else CONFIGS)[shape_class(m)], **(config or {}))
    block_k = 128 if blockwise else cfg["block_k"]
    a_scale = a_scale.reshape(m, -1)
    b_scale = b_scale.reshape(b_scale.shape[0], -1)
    # operand "A" of the kernel runs over P, operand "B" over Q
    if cfg["swap"]:
        pa, pb, sa, sb, p, q = b, a, b_scale, a_scale, n, m
        a_div, b_div = block_n, 1
        stride_cp, stride_cq = out.stride(1), out.stride(0)
    else:
        pa, pb, sa, sb, p, q = a, b, a_scale, b_scale, m, n
        a_div, b_div = 1, block_n
        stride_cp, stride_cq = out.stride(0), out.stride(1)
    tiles = triton.cdiv(p, cfg["block_p"]) * triton.cdiv(q, cfg["block_q"])
    k_iters = triton.cdiv(k, block_k)
    split = cfg["split_k"]
    if split == "auto":
        split = pick_split_k(tiles, k_iters, a.device)
    split = max(1, min(int(split), k_iters))
    k_split = triton.cdiv(k_iters, split) * block_k
    split = triton.cdiv(k, k_split)
    ws = torch.empty((split, m, n), dtype=torch.float32, device=a.device) if split > 1 else out
    _fp8_gemm_kernel[(tiles, split)](
        pa, pb, out, ws, sa, sb, bias if bias is not None else out,
        p, q,
        pa.stride(0), pb.stride(0), stride_cp, stride_cq,
        sa.stride(0), sa.stride(1), sb.stride(0), sb.stride(1),
        K=k, K_SPLIT=k_split,
        BLOCKWISE=blockwise, A_SCALE_DIV=a_div, B_SCALE_DIV=b_div,
        HAS_BIAS=bias is not None, BIAS_ON_P=cfg["swap"], SPLIT_K=split,
        BLOCK_P=cfg["block_p"], BLOCK_Q=cfg["block_q"], BLOCK_K=block_k, GROUP=cfg["group"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if split > 1:
        reduce_splits(ws, out, bias)
    return out
