"""Triton fused MoE: align, gate|up GEMM with SiLU-and-mul, down GEMM with the routing weight,
sum over the k choices.

1. :func:`moe_align_block_size` sorts the token-expert pairs by (local) expert into runs padded to
   ``block_m`` rows; every row block belongs to one expert (-1 past the end: those programs exit).
2. ``_moe_up_kernel``: per (row block, column tile of I), rows gather their token's hidden state, two
   fp32 accumulators take the gate and the up rows of ``w13[e]`` (plus ``w13_bias[e]``); the epilogue
   writes ``silu(gate) * up`` (or gpt-oss' clamped SwiGLU) in hidden's dtype at the row's position.
3. ``_moe_down_kernel``: per (row block, column tile of H), ``act @ w2[e]ᵀ`` (plus ``w2_bias[e]``) times
   the pair's routing weight, written at the pair's index.
4. ``_moe_sum_kernel``: each token sums its k pair rows in fp32 (pairs of experts held elsewhere are
   skipped).  With k = 1 the down GEMM writes the output directly.

Every size that bounds a loop is a compile-time constant (H, I, the tiles); the row count only sizes
grids, so the kernels are CUDA-graph capturable and never read anything back to the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.dispatch import triton_interpreting
from atom_kernels.ops._pdl import pdl_keywords, start_dependent
from atom_kernels.ops._triton_common import dot_acc, grouped_tile
from atom_kernels.ops.fused_moe.configs import MoeKernelConfig, config_for, fit_shared_memory
from atom_kernels.ops.fused_moe.reference import SWIGLU_ALPHA, SWIGLU_LIMIT, check_args
from atom_kernels.ops.moe_align.triton import moe_align_block_size

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_ALPHA, _LIMIT = tl.constexpr(SWIGLU_ALPHA), tl.constexpr(SWIGLU_LIMIT)


def unsupported(hidden, w13, w2, topk_weights, topk_ids, *, expert_map=None, quant=None, config=None,
                w13_bias=None, w2_bias=None, activation="silu", swiglu_limit=None) -> str | None:
    if quant is not None and swiglu_limit is not None:
        return "the quantized Triton fused MoE has no swiglu_limit clamp"
    for name, bias in (("w13_bias", w13_bias), ("w2_bias", w2_bias)):
        if bias is not None and bias.stride(-1) != 1:
            return f"{name} must have contiguous rows"
    if quant is not None:  # quantized experts: triton_quant's kernels
        from atom_kernels.ops.fused_moe.triton_quant import unsupported_quant

        return unsupported_quant(hidden, w13, w2, quant, config)
    if hidden.dtype not in DTYPES or w13.dtype != hidden.dtype or w2.dtype != hidden.dtype:
        return f"hidden {hidden.dtype}, w13 {w13.dtype}, w2 {w2.dtype}: expects one of {DTYPES} for all three"
    if w13.dim() != 3 or w2.dim() != 3 or w13.stride(-1) != 1 or w2.stride(-1) != 1:
        return "expert weights must be 3-D with contiguous rows"
    if config is not None and (config.block_m < 16 or config.block_m & (config.block_m - 1)):
        return f"block_m {config.block_m} must be a power of two >= 16"
    if config is not None and max(config.up.split_k, config.down.split_k) > 1:
        return "split_k is a quantized-expert tile option"
    return None


@triton.jit
def expert_activation(gate, up, SWIGLU: tl.constexpr):
    """fp32 gate and up -> ``silu(gate) * up``, or with SWIGLU gpt-oss' ``g·σ(αg)·(u + 1)`` (g ≤ limit, |u| ≤ limit)."""
    if SWIGLU:
        gate = tl.minimum(gate, _LIMIT)
        up = tl.minimum(tl.maximum(up, -_LIMIT), _LIMIT)
        return gate * tl.sigmoid(_ALPHA * gate) * (up + 1.0)
    return gate * tl.sigmoid(gate) * up


@triton.jit
def load_bias(b_ptr, expert, b_stride_e, cols, col_ok, HAS_BIAS: tl.constexpr):
    """``bias[expert, cols]`` as fp32 (zeros without a bias)."""
    if HAS_BIAS:
        return tl.load(b_ptr + expert.to(tl.int64) * b_stride_e + cols, mask=col_ok, other=0.0).to(tl.float32)
    return tl.zeros(cols.shape, dtype=tl.float32)


@triton.jit(do_not_specialize=["num_pairs", "num_row_blocks"])
def _moe_up_kernel(
    x_ptr, x_stride, w_ptr, w_stride_e, w_stride_n, act_ptr, sorted_ptr, block_experts_ptr,
    num_pairs, num_row_blocks, b_ptr, b_stride_e, limit,
    TOP_K: tl.constexpr, H: tl.constexpr, I: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr, HAS_BIAS: tl.constexpr = False, SWIGLU: tl.constexpr = False,
    CLAMP: tl.constexpr = False, PDL: tl.constexpr = False,
):
    start_dependent(PDL)  # programmatic dependent launch (ops/_pdl.py)
    block, tile = grouped_tile(tl.program_id(0), num_row_blocks, tl.cdiv(I, BLOCK_N), GROUP_M)
    expert = tl.load(block_experts_ptr + block)
    if expert < 0:
        return
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_ptr + rows)
    row_ok = pairs < num_pairs
    tokens = (pairs // TOP_K).to(tl.int64)
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < I
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + tokens[:, None] * x_stride + ks[None, :]
    w_base = w_ptr + expert.to(tl.int64) * w_stride_e + ks[:, None]
    gate_ptrs = w_base + cols[None, :] * w_stride_n
    up_ptrs = w_base + (cols + I)[None, :] * w_stride_n
    gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        if H % BLOCK_K == 0:  # no mask along K: loads stay vectorised
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            wg = tl.load(gate_ptrs, mask=col_ok[None, :], other=0.0)
            wu = tl.load(up_ptrs, mask=col_ok[None, :], other=0.0)
        else:
            k_ok = ks < H - k0
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            wg = tl.load(gate_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            wu = tl.load(up_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if UPCAST:
            a, wg, wu = a.to(tl.float32), wg.to(tl.float32), wu.to(tl.float32)
        gate = dot_acc(a, wg, gate, IEEE)
        up = dot_acc(a, wu, up, IEEE)
        a_ptrs += BLOCK_K
        gate_ptrs += BLOCK_K
        up_ptrs += BLOCK_K
    if HAS_BIAS:
        gate += load_bias(b_ptr, expert, b_stride_e, cols, col_ok, HAS_BIAS)[None, :]
        up += load_bias(b_ptr, expert, b_stride_e, cols + I, col_ok, HAS_BIAS)[None, :]
    if CLAMP:  # swiglu_limit (DeepSeek-V4): gate <= limit, |up| <= limit before silu(gate) * up
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
    act = expert_activation(gate, up, SWIGLU)
    out_ptrs = act_ptr + rows.to(tl.int64)[:, None] * I + cols[None, :]
    tl.store(out_ptrs, act.to(act_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit(do_not_specialize=["num_pairs", "num_row_blocks"])
def _moe_down_kernel(
    act_ptr, w_ptr, w_stride_e, w_stride_n, out_ptr, weights_ptr, sorted_ptr, block_experts_ptr,
    num_pairs, num_row_blocks, b_ptr, b_stride_e,
    H: tl.constexpr, I: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr, HAS_BIAS: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    start_dependent(PDL)  # programmatic dependent launch (ops/_pdl.py)
    block, tile = grouped_tile(tl.program_id(0), num_row_blocks, tl.cdiv(H, BLOCK_N), GROUP_M)
    expert = tl.load(block_experts_ptr + block)
    if expert < 0:
        return
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_ptr + rows)
    row_ok = pairs < num_pairs
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < H
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = act_ptr + rows.to(tl.int64)[:, None] * I + ks[None, :]
    w_ptrs = w_ptr + expert.to(tl.int64) * w_stride_e + cols[None, :] * w_stride_n + ks[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        if I % BLOCK_K == 0:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=col_ok[None, :], other=0.0)
        else:
            k_ok = ks < I - k0
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if UPCAST:
            a, w = a.to(tl.float32), w.to(tl.float32)
        acc = dot_acc(a, w, acc, IEEE)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_BIAS:
        acc += load_bias(b_ptr, expert, b_stride_e, cols, col_ok, HAS_BIAS)[None, :]
    routing = tl.load(weights_ptr + pairs, mask=row_ok, other=0.0).to(tl.float32)
    acc = acc * routing[:, None]
    out_ptrs = out_ptr + pairs.to(tl.int64)[:, None] * H + cols[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _moe_sum_kernel(
    pair_out_ptr, ids_ptr, map_ptr, out_ptr, out_stride,
    TOP_K: tl.constexpr, H: tl.constexpr, BLOCK_H: tl.constexpr, HAS_MAP: tl.constexpr,
    PDL: tl.constexpr = False,
):
    start_dependent(PDL)  # programmatic dependent launch (ops/_pdl.py)
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    col_ok = cols < H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        take = col_ok
        if HAS_MAP:
            expert = tl.load(ids_ptr + token * TOP_K + j)
            take = take & (tl.load(map_ptr + expert) >= 0)
        acc += tl.load(pair_out_ptr + (token * TOP_K + j) * H + cols, mask=take, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * out_stride + cols, acc.to(out_ptr.dtype.element_ty), mask=col_ok)


def _launch_grid(num_row_blocks: int, cols: int, block_n: int) -> tuple[int]:
    return (num_row_blocks * triton.cdiv(cols, block_n),)


def fused_moe(hidden, w13, w2, topk_weights, topk_ids, *, expert_map=None, quant=None,
              config: MoeKernelConfig | None = None, w13_bias=None, w2_bias=None, activation="silu",
              swiglu_limit=None):
    check_args(hidden, w13, w2, topk_weights, topk_ids, expert_map, quant, w13_bias, w2_bias, activation, swiglu_limit)
    if quant is not None:
        from atom_kernels.ops.fused_moe.triton_quant import fused_moe_quant

        return fused_moe_quant(hidden, w13, w2, topk_weights, topk_ids, expert_map=expert_map, quant=quant, config=config,
                               w13_bias=w13_bias, w2_bias=w2_bias, activation=activation)
    tokens, size = hidden.shape
    top_k = topk_ids.shape[1]
    experts, two_inter, _ = w13.shape
    inter = two_inter // 2
    num_pairs = tokens * top_k
    has_map = expert_map is not None
    out = (torch.zeros if has_map and top_k == 1 else torch.empty)(hidden.shape, dtype=hidden.dtype, device=hidden.device)
    if num_pairs == 0:
        return out
    cfg = fit_shared_memory(config or config_for(num_pairs, experts), hidden.element_size())
    if hidden.stride(-1) != 1:
        hidden = hidden.contiguous()
    weights = topk_weights.reshape(-1)
    if not weights.is_contiguous():
        weights = weights.contiguous()
    sorted_ids, block_experts, _ = moe_align_block_size(topk_ids, experts, cfg.block_m, expert_map)
    num_row_blocks = block_experts.numel()
    act = torch.empty((sorted_ids.numel(), inter), dtype=hidden.dtype, device=hidden.device)
    ieee = hidden.dtype == torch.float32
    upcast = triton_interpreting()  # the CPU interpreter's bf16/fp16 dot is not exact; the GPU's is
    pdl_launch = pdl_keywords(hidden.device)
    up, down = cfg.up, cfg.down
    b13 = w13_bias if w13_bias is not None else w13  # (never read without HAS_BIAS)
    b2 = w2_bias if w2_bias is not None else w2
    _moe_up_kernel[_launch_grid(num_row_blocks, inter, up.block_n)](
        hidden, hidden.stride(0), w13, w13.stride(0), w13.stride(1), act, sorted_ids, block_experts,
        num_pairs, num_row_blocks, b13, b13.stride(0), float(swiglu_limit or 0.0),
        TOP_K=top_k, H=size, I=inter, BLOCK_M=cfg.block_m, BLOCK_N=up.block_n, BLOCK_K=up.block_k,
        GROUP_M=cfg.group_m, IEEE=ieee, UPCAST=upcast, HAS_BIAS=w13_bias is not None,
        SWIGLU=activation == "swigluoai", CLAMP=swiglu_limit is not None,
        **pdl_launch, num_warps=up.num_warps, num_stages=up.num_stages,
    )
    pair_out = out if top_k == 1 else torch.empty((num_pairs, size), dtype=hidden.dtype, device=hidden.device)
    _moe_down_kernel[_launch_grid(num_row_blocks, size, down.block_n)](
        act, w2, w2.stride(0), w2.stride(1), pair_out, weights, sorted_ids, block_experts,
        num_pairs, num_row_blocks, b2, b2.stride(0),
        H=size, I=inter, BLOCK_M=cfg.block_m, BLOCK_N=down.block_n, BLOCK_K=down.block_k,
        GROUP_M=cfg.group_m, IEEE=ieee, UPCAST=upcast, HAS_BIAS=w2_bias is not None,
        **pdl_launch, num_warps=down.num_warps, num_stages=down.num_stages,
    )
    if top_k > 1:
        block_h = min(1024, triton.next_power_of_2(size))
        ids = topk_ids if topk_ids.is_contiguous() else topk_ids.contiguous()
        _moe_sum_kernel[(tokens, triton.cdiv(size, block_h))](
            pair_out, ids, expert_map if has_map else ids, out, out.stride(0),
            TOP_K=top_k, H=size, BLOCK_H=block_h, HAS_MAP=has_map, **pdl_launch, num_warps=4,
        )
    return out
