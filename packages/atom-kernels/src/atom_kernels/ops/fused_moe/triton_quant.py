"""Triton fused MoE over quantized experts (``fp8-block``, ``mxfp4``; see ``expert_formats``).

Same pipeline as ``triton.py`` (align, gate|up GEMM + SiLU-and-mul, down GEMM x routing weight, sum
over k) with the GEMMs computed *swapped*: each program's accumulator is ``[weight rows, token rows]``,
so the weight (the large, streamed operand) fills the MMA's 64-row side and a decode-sized run of
16 token rows its narrow side, as in ``fp8_block_mm`` / ``mxfp4_mm``.

* ``fp8-block``: the hidden states are quantized per token per 128 columns once (``quant_fp8``); each
  K step of 128 multiplies one weight block by one activation group and scales the partial product by
  both scales; the SiLU-and-mul rows are quantized the same way before the down GEMM.
* ``mxfp4``: weights decoded in registers as ``mxfp4_mm``'s small-M kernel does it in its ``"wgmma"``
  arrangement (``triton_small_m.logical_tile``: 16-byte runs of codes, a ``prmt`` decode, bf16 MMA from
  registers) and the activations gathered in the same permuted K order (``activation_k``); they stay in
  hidden's dtype.  ``C`` (scale groups per run) is the largest of 4, 2, 1 dividing K / 32 and BLOCK_K / 32.

Loop bounds are compile-time constants (H, I, tiles); row counts only size grids (CUDA-graph safe).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.dispatch import triton_interpreting
from atom_kernels.ops._triton_common import grouped_tile
from atom_kernels.ops.fused_moe.configs import GemmTile, MoeKernelConfig, shape_class
from atom_kernels.ops.fused_moe.triton import _moe_sum_kernel, expert_activation, load_bias
from atom_kernels.ops.moe_align.triton import moe_align_block_size
from atom_kernels.ops.mxfp4_mm.triton_small_m import (
    _SHIFT,
    activation_k,
    chunk_groups,
    from_mma_rows,
    from_mma_rows_t,
    logical_tile,
    mma_rows,
    run_scales,
    word_runs,
)

FP8_BLOCK, MXFP4 = 0, 1
FORMATS = {"fp8-block": FP8_BLOCK, "mxfp4": MXFP4}
SCALE_BLOCK = 128

# block_m = token rows per program (the MMA's narrow side); up/down: (weight rows, K step) per program.
QUANT_CONFIGS: dict[str, MoeKernelConfig] = {
    "decode": MoeKernelConfig(16, GemmTile(64, 128, 4, 4), GemmTile(64, 128, 4, 4), group_m=1),
    "small": MoeKernelConfig(16, GemmTile(64, 128, 4, 4), GemmTile(64, 128, 4, 4), group_m=1),
    "medium": MoeKernelConfig(32, GemmTile(64, 128, 4, 3), GemmTile(128, 128, 4, 3), group_m=8),
    "large": MoeKernelConfig(64, GemmTile(128, 128, 8, 3), GemmTile(128, 128, 8, 3), group_m=8),
}
# MXFP4 experts at up to 8 tokens per expert: 64-wide K steps, K split in two (gpt-oss-20b's experts on an H100,
# 2026-12-07, 1 / 4 / 16 / 64 tokens: 97 / 244 / 443 / 503 us against 162 / 415 / 760 / 851 with the 128-wide steps
# above; bench/results/2026-12-07T0400-h100).
MXFP4_CONFIGS: dict[str, MoeKernelConfig] = {
    name: MoeKernelConfig(16, GemmTile(64, 64, 4, 4, split_k=2), GemmTile(64, 64, 4, 4, split_k=2), group_m=1)
    for name in ("decode", "small")
}

# Decode-shape alternatives the bench times beside the default (the neighbourhood of the MXFP4 default: K split 1 /
# 4 / 8, 3 or 6 stages, and the former 128-wide K step).
QUANT_SWEEP: tuple[MoeKernelConfig, ...] = (
    MoeKernelConfig(16, GemmTile(64, 128, 4, 4), GemmTile(64, 128, 4, 4), group_m=1),
    MoeKernelConfig(16, GemmTile(64, 64, 4, 4), GemmTile(64, 64, 4, 4), group_m=1),
    MoeKernelConfig(16, GemmTile(64, 64, 4, 3, split_k=4), GemmTile(64, 64, 4, 3, split_k=4), group_m=1),
    MoeKernelConfig(16, GemmTile(64, 64, 4, 4, split_k=8), GemmTile(64, 64, 4, 4, split_k=8), group_m=1),
    MoeKernelConfig(16, GemmTile(64, 64, 4, 6, split_k=2), GemmTile(64, 64, 4, 6, split_k=2), group_m=1),
)


def unsupported_quant(hidden, w13, w2, quant, config) -> str | None:
    if quant.format not in FORMATS:
        return f"the Triton fused MoE has no {quant.format!r} expert-weight path"
    if hidden.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return f"hidden {hidden.dtype} not supported"
    if quant.w13_scale is None or quant.w2_scale is None:
        return "quantized experts need both scale tensors"
    if config is not None and (config.block_m < 16 or config.block_m & (config.block_m - 1)):
        return f"block_m {config.block_m} must be a power of two >= 16"
    if quant.format == "fp8-block":
        if tuple(quant.block_shape or ()) != (SCALE_BLOCK, SCALE_BLOCK):
            return f"fp8-block experts need {SCALE_BLOCK}x{SCALE_BLOCK} blocks, got {quant.block_shape}"
        if w13.dtype != torch.float8_e4m3fn or w2.dtype != torch.float8_e4m3fn:
            return "fp8-block experts must be float8_e4m3fn"
        if w2.shape[2] % SCALE_BLOCK:
            return f"fp8-block experts need an intermediate size divisible by {SCALE_BLOCK}"
    else:
        if w13.dtype != torch.uint8 or w2.dtype != torch.uint8:
            return "mxfp4 experts must be uint8 (packed e2m1)"
        if hidden.shape[1] % 32 or w2.shape[2] * 2 % 32:
            return "mxfp4 experts need hidden and intermediate sizes divisible by 32"
        if not triton_interpreting() and hidden.dtype != torch.bfloat16:
            return f"the GPU mxfp4 expert kernels multiply in bf16; hidden is {hidden.dtype}"
        if not (w13.is_contiguous() and w2.is_contiguous()):
            return "mxfp4 experts must be contiguous"
    return None


@triton.jit
def _load_weight_tile(w_ptr, s_ptr, expert, first_row, row_end, k0, scale_rows,
                      w_stride_e, w_stride_n, s_stride_e, s_stride_n,
                      K: tl.constexpr, FORMAT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      EXACT: tl.constexpr, SHIFT: tl.constexpr, C: tl.constexpr, MMA_ROWS: tl.constexpr):
    """The weight tile ``[BLOCK_N, BLOCK_K]`` of rows ``first_row ..`` (those at or past ``row_end`` read as zeros
    or as ``first_row``, never stored) at K offset ``k0`` (mxfp4: in the permuted K order of ``activation_k``;
    ``MMA_ROWS``: words and scales loaded in the warpgroup MMA operand's row order, ``triton_small_m.mma_rows``),
    and (fp8) its block scales ``[BLOCK_N]`` from block-scale rows ``scale_rows``."""
    rows = first_row + tl.arange(0, BLOCK_N)
    row_ok = rows < row_end
    if FORMAT == 0:
        ks = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(w_ptr + expert * w_stride_e + rows.to(tl.int64)[:, None] * w_stride_n + ks[None, :],
                    mask=row_ok[:, None] & (ks < K)[None, :], other=0.0)
        scale = tl.load(s_ptr + expert * s_stride_e + scale_rows * s_stride_n + k0 // 128,
                        mask=row_ok & (rows * 0 + k0 < K), other=0.0)  # (tensor comparisons: Triton 3.9's interpreter)
        return w, scale
    else:
        NB: tl.constexpr = BLOCK_K // (32 * C)
        blk_ok = (k0 // (32 * C) + tl.arange(0, NB)) < K // (32 * C)
        w_base = w_ptr + expert * w_stride_e + k0 // 8
        s_base = s_ptr + expert * s_stride_e + k0 // 32
        if MMA_ROWS:
            r = first_row + mma_rows(BLOCK_N)  # [8, 4, 2, 1, BLOCK_N / 64]
            r = tl.where(r < row_end, r, first_row).to(tl.int64)
            w_off = r[:, :, :, :, :, None] * w_stride_n + word_runs(NB, C)[None, None, None, :, None, :]
            words = tl.load(w_base + tl.max_contiguous(w_off, [1, 1, 1, 1, 1, C]),
                            mask=blk_ok[None, None, None, :, None, None], other=0)
            s_off = r[None, :, :, :, :, :] * s_stride_n + tl.trans(run_scales(NB, C))[:, None, None, None, :, None]
            e = tl.load(s_base + s_off, mask=blk_ok[None, None, None, None, :, None], other=0)
            words = from_mma_rows(words, BLOCK_N, NB, 4 * C)
            e = from_mma_rows_t(e, BLOCK_N, NB, 4)
        else:
            ok = row_ok[:, None, None] & blk_ok[None, :, None]
            words = tl.load(w_base + rows.to(tl.int64)[:, None, None] * w_stride_n + word_runs(NB, C)[None, :, :],
                            mask=ok, other=0)
            e = tl.load(s_base + rows.to(tl.int64)[:, None, None] * s_stride_n + run_scales(NB, C)[None, :, :],
                        mask=ok, other=0)
        return logical_tile(words, e, BLOCK_N, BLOCK_K, C, True, EXACT, SHIFT), tl.zeros([BLOCK_N], dtype=tl.float32)


@triton.jit
def _activation_tile(x_ptr, x_rows, row_ok, x_stride, k0, K: tl.constexpr, FORMAT: tl.constexpr,
                     BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr, EXACT: tl.constexpr, C: tl.constexpr):
    """The activation tile ``[BLOCK_K, BLOCK_M]`` (K-major columns of the given rows; mxfp4: the permuted K
    order of the weight tile)."""
    if FORMAT == 1:
        ks = k0 + activation_k(BLOCK_K, C, True)
    else:
        ks = k0 + tl.arange(0, BLOCK_K)
    x = tl.load(x_ptr + x_rows.to(tl.int64)[None, :] * x_stride + ks[:, None],
                mask=row_ok[None, :] & (ks < K)[:, None], other=0.0)
    if FORMAT == 1:
        x = x.to(tl.float32) if EXACT else x.to(tl.bfloat16)
    return x


@triton.jit
def _mma(w, x, acc, FORMAT: tl.constexpr, EXACT: tl.constexpr):
    if FORMAT == 1 and EXACT:
        return tl.dot(w, x, acc, input_precision="ieee")
    return tl.dot(w, x, acc)


@triton.jit(do_not_specialize=["num_pairs", "num_row_blocks"])
def _moe_up_quant_kernel(
    x_ptr, x_stride, xs_ptr, xs_stride, w_ptr, w_stride_e, w_stride_n, s_ptr, s_stride_e, s_stride_n,
    act_ptr, ws_ptr, sorted_ptr, block_experts_ptr, num_pairs, num_row_blocks, b_ptr, b_stride_e,
    TOP_K: tl.constexpr, H: tl.constexpr, I: tl.constexpr, FORMAT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EXACT: tl.constexpr, SHIFT: tl.constexpr, C: tl.constexpr, SPLIT_K: tl.constexpr, K_SPLIT: tl.constexpr,
    MMA_ROWS: tl.constexpr, HAS_BIAS: tl.constexpr = False, SWIGLU: tl.constexpr = False,
):
    block, tile = grouped_tile(tl.program_id(0), num_row_blocks, tl.cdiv(I, BLOCK_N), GROUP_M)
    split = tl.program_id(1)
    expert = tl.load(block_experts_ptr + block).to(tl.int64)
    if expert < 0:
        return
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_ptr + rows)
    row_ok = pairs < num_pairs
    tokens = pairs // TOP_K
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < I
    gate = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    UP_SCALE_ROW: tl.constexpr = I // 128  # fp8: the up projection's first block-scale row (I % 128 == 0)
    for step in range(0, K_SPLIT, BLOCK_K):
        k0 = split * K_SPLIT + step
        x = _activation_tile(x_ptr, tokens, row_ok, x_stride, k0, H, FORMAT, BLOCK_K, BLOCK_M, EXACT, C)
        wg, sg = _load_weight_tile(w_ptr, s_ptr, expert, tile * BLOCK_N, I, k0, cols // 128, w_stride_e, w_stride_n,
                                   s_stride_e, s_stride_n, H, FORMAT, BLOCK_N, BLOCK_K, EXACT, SHIFT, C, MMA_ROWS)
        wu, su = _load_weight_tile(w_ptr, s_ptr, expert, I + tile * BLOCK_N, 2 * I, k0, UP_SCALE_ROW + cols // 128,
                                   w_stride_e, w_stride_n, s_stride_e, s_stride_n, H, FORMAT, BLOCK_N, BLOCK_K,
                                   EXACT, SHIFT, C, MMA_ROWS)
        if FORMAT == 0:
            sx = tl.load(xs_ptr + tokens.to(tl.int64) * xs_stride + k0 // 128, mask=row_ok & (tokens * 0 + k0 < H),
                         other=0.0)
            gate += tl.dot(wg, x) * (sg[:, None] * sx[None, :])
            up += tl.dot(wu, x) * (su[:, None] * sx[None, :])
        else:
            gate = _mma(wg, x, gate, FORMAT, EXACT)
            up = _mma(wu, x, up, FORMAT, EXACT)
    if FORMAT == 1:
        gate = gate * (2.0 ** SHIFT)
        up = up * (2.0 ** SHIFT)
    mask = col_ok[:, None] & row_ok[None, :]
    if SPLIT_K > 1:  # fp32 partials [split, pair, gate | up]; _moe_up_finish_kernel sums them
        ws = ws_ptr + (split * num_pairs + pairs).to(tl.int64)[None, :] * (2 * I) + cols[:, None]
        tl.store(ws, gate, mask=mask)
        tl.store(ws + I, up, mask=mask)
        return
    if HAS_BIAS:
        gate += load_bias(b_ptr, expert, b_stride_e, cols, col_ok, HAS_BIAS)[:, None]
        up += load_bias(b_ptr, expert, b_stride_e, cols + I, col_ok, HAS_BIAS)[:, None]
    act = expert_activation(gate, up, SWIGLU)
    tl.store(act_ptr + pairs.to(tl.int64)[None, :] * I + cols[:, None], act.to(act_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["num_pairs", "num_row_blocks"])
def _moe_down_quant_kernel(
    a_ptr, a_stride, as_ptr, as_stride, w_ptr, w_stride_e, w_stride_n, s_ptr, s_stride_e, s_stride_n,
    out_ptr, weights_ptr, sorted_ptr, block_experts_ptr, num_pairs, num_row_blocks, b_ptr, b_stride_e,
    H: tl.constexpr, I: tl.constexpr, FORMAT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EXACT: tl.constexpr, SHIFT: tl.constexpr, C: tl.constexpr, SPLIT_K: tl.constexpr, K_SPLIT: tl.constexpr,
    MMA_ROWS: tl.constexpr, HAS_BIAS: tl.constexpr = False,
):
    block, tile = grouped_tile(tl.program_id(0), num_row_blocks, tl.cdiv(H, BLOCK_N), GROUP_M)
    split = tl.program_id(1)
    expert = tl.load(block_experts_ptr + block).to(tl.int64)
    if expert < 0:
        return
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_ptr + rows)
    row_ok = pairs < num_pairs
    cols = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < H
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for step in range(0, K_SPLIT, BLOCK_K):
        k0 = split * K_SPLIT + step
        a = _activation_tile(a_ptr, pairs, row_ok, a_stride, k0, I, FORMAT, BLOCK_K, BLOCK_M, EXACT, C)
        w, sw = _load_weight_tile(w_ptr, s_ptr, expert, tile * BLOCK_N, H, k0, cols // 128, w_stride_e, w_stride_n,
                                  s_stride_e, s_stride_n, I, FORMAT, BLOCK_N, BLOCK_K, EXACT, SHIFT, C, MMA_ROWS)
        if FORMAT == 0:
            sa = tl.load(as_ptr + pairs.to(tl.int64) * as_stride + k0 // 128, mask=row_ok & (pairs * 0 + k0 < I),
                         other=0.0)
            acc += tl.dot(w, a) * (sw[:, None] * sa[None, :])
        else:
            acc = _mma(w, a, acc, FORMAT, EXACT)
    if FORMAT == 1:
        acc = acc * (2.0 ** SHIFT)
    mask = col_ok[:, None] & row_ok[None, :]
    if SPLIT_K > 1:  # fp32 partials [split, pair, H]; _moe_split_sum_kernel adds bias, routing and the k pairs
        tl.store(out_ptr + (split * num_pairs + pairs).to(tl.int64)[None, :] * H + cols[:, None], acc, mask=mask)
        return
    if HAS_BIAS:
        acc += load_bias(b_ptr, expert, b_stride_e, cols, col_ok, HAS_BIAS)[:, None]
    routing = tl.load(weights_ptr + pairs, mask=row_ok, other=0.0).to(tl.float32)
    acc = acc * routing[None, :]
    out_ptrs = out_ptr + pairs.to(tl.int64)[None, :] * H + cols[:, None]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _local_expert(ids_ptr, map_ptr, pair, HAS_MAP: tl.constexpr):
    """The local expert index of ``pair`` (-1: held by another rank)."""
    expert = tl.load(ids_ptr + pair)
    if HAS_MAP:
        expert = tl.load(map_ptr + expert)
    return expert.to(tl.int64)


@triton.jit(do_not_specialize=["num_pairs"])
def _moe_up_finish_kernel(
    ws_ptr, act_ptr, ids_ptr, map_ptr, b_ptr, b_stride_e, num_pairs,
    I: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, HAS_MAP: tl.constexpr, HAS_BIAS: tl.constexpr,
    SWIGLU: tl.constexpr,
):
    """Split-K gate|up: each pair's partials summed in split order, bias, activation -> ``act[pair]``."""
    pair = tl.program_id(0).to(tl.int64)
    expert = _local_expert(ids_ptr, map_ptr, pair, HAS_MAP)
    if expert < 0:
        return
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    col_ok = cols < I
    gate = load_bias(b_ptr, expert, b_stride_e, cols, col_ok, HAS_BIAS)
    up = load_bias(b_ptr, expert, b_stride_e, cols + I, col_ok, HAS_BIAS)
    for split in tl.static_range(SPLIT_K):
        ws = ws_ptr + (split * num_pairs + pair) * (2 * I) + cols
        gate += tl.load(ws, mask=col_ok, other=0.0)
        up += tl.load(ws + I, mask=col_ok, other=0.0)
    act = expert_activation(gate, up, SWIGLU)
    tl.store(act_ptr + pair * I + cols, act.to(act_ptr.dtype.element_ty), mask=col_ok)


@triton.jit(do_not_specialize=["num_pairs"])
def _moe_split_sum_kernel(
    ws_ptr, weights_ptr, ids_ptr, map_ptr, b_ptr, b_stride_e, out_ptr, out_stride, num_pairs,
    TOP_K: tl.constexpr, H: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_H: tl.constexpr, HAS_MAP: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """Split-K down: ``out[t] = Σ_j w[t, j] (Σ_split partial + bias)`` over the token's pairs held here."""
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    col_ok = cols < H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        pair = token * TOP_K + j
        expert = _local_expert(ids_ptr, map_ptr, pair, HAS_MAP)
        take = col_ok & (cols * 0 + expert >= 0)
        y = load_bias(b_ptr, tl.maximum(expert, 0), b_stride_e, cols, take, HAS_BIAS)
        for split in tl.static_range(SPLIT_K):
            y += tl.load(ws_ptr + (split * num_pairs + pair) * H + cols, mask=take, other=0.0)
        acc += y * tl.load(weights_ptr + pair).to(tl.float32)
    tl.store(out_ptr + token * out_stride + cols, acc.to(out_ptr.dtype.element_ty), mask=col_ok)


def quant_config_for(num_pairs: int, num_experts: int, fmt: int = FP8_BLOCK) -> MoeKernelConfig:
    name = shape_class(num_pairs, num_experts)
    return MXFP4_CONFIGS.get(name, QUANT_CONFIGS[name]) if fmt == MXFP4 else QUANT_CONFIGS[name]


def loads_in_mma_rows(tile: GemmTile) -> bool:
    """MXFP4 weight loads in the warpgroup MMA operand's row order: one warpgroup over whole 64-row tiles."""
    return tile.block_n % 64 == 0 and tile.num_warps == 4


def k_split(k: int, tile: GemmTile, block_k: int) -> tuple[int, int]:
    """(splits, K per split): ``tile.split_k`` parts of whole K steps (fewer where K has fewer steps)."""
    steps = triton.cdiv(k, block_k)
    per_split = triton.cdiv(steps, max(1, min(tile.split_k, steps)))
    return triton.cdiv(steps, per_split), per_split * block_k


def fused_moe_quant(hidden, w13, w2, topk_weights, topk_ids, *, expert_map=None, quant=None,
                    config: MoeKernelConfig | None = None, w13_bias=None, w2_bias=None, activation="silu"):
    from atom_kernels import quant_fp8

    tokens, size = hidden.shape
    top_k = topk_ids.shape[1]
    fmt = FORMATS[quant.format]
    experts = w13.shape[0]
    inter = w2.shape[2] * (2 if fmt == MXFP4 else 1)
    num_pairs = tokens * top_k
    has_map = expert_map is not None
    out = (torch.zeros if has_map and top_k == 1 else torch.empty)(hidden.shape, dtype=hidden.dtype, device=hidden.device)
    if num_pairs == 0:
        return out
    cfg = config or quant_config_for(num_pairs, experts, fmt)
    exact = triton_interpreting()
    if hidden.stride(-1) != 1:
        hidden = hidden.contiguous()
    weights = topk_weights.reshape(-1).contiguous()
    sorted_ids, block_experts, _ = moe_align_block_size(topk_ids, experts, cfg.block_m, expert_map)
    num_row_blocks = block_experts.numel()
    up, down = cfg.up, cfg.down
    if fmt == FP8_BLOCK:
        x, xs = quant_fp8(hidden, SCALE_BLOCK)
        k_up = k_down = SCALE_BLOCK
        c_up = c_down = 1  # unused
        w13v, w2v = w13, w2
        s13, s2 = quant.w13_scale, quant.w2_scale
    else:
        x, xs = hidden, hidden  # xs unused
        k_up, k_down = up.block_k, down.block_k
        c_up, c_down = chunk_groups(size, k_up), chunk_groups(inter, k_down)
        w13v, w2v = w13.view(torch.int32), w2.view(torch.int32)  # 8 codes per word
        s13, s2 = quant.w13_scale.view(torch.uint8), quant.w2_scale.view(torch.uint8)
    # the SiLU-and-mul rows, one per pair (pairs of experts held elsewhere are never written or read)
    act = torch.empty((num_pairs, inter), dtype=hidden.dtype, device=hidden.device)
    b13 = w13_bias if w13_bias is not None else hidden  # (never read without HAS_BIAS)
    b2 = w2_bias if w2_bias is not None else hidden
    ids = topk_ids.reshape(-1).contiguous()
    emap = expert_map if has_map else ids
    splits_up, k_split_up = k_split(size, up, k_up)
    ws13 = torch.empty((splits_up, num_pairs, 2 * inter), dtype=torch.float32, device=hidden.device) if splits_up > 1 else act
    _moe_up_quant_kernel[(num_row_blocks * triton.cdiv(inter, up.block_n), splits_up)](
        x, x.stride(0), xs, xs.stride(0), w13v, w13v.stride(0), w13v.stride(1), s13, s13.stride(0), s13.stride(1),
        act, ws13, sorted_ids, block_experts, num_pairs, num_row_blocks, b13, b13.stride(0),
        TOP_K=top_k, H=size, I=inter, FORMAT=fmt, BLOCK_M=cfg.block_m, BLOCK_N=up.block_n, BLOCK_K=k_up,
        GROUP_M=cfg.group_m, EXACT=exact, SHIFT=_SHIFT, C=c_up, SPLIT_K=splits_up, K_SPLIT=k_split_up,
        MMA_ROWS=fmt == MXFP4 and loads_in_mma_rows(up), HAS_BIAS=w13_bias is not None,
        SWIGLU=activation == "swigluoai", num_warps=up.num_warps, num_stages=up.num_stages,
    )
    if splits_up > 1:
        block = min(1024, triton.next_power_of_2(inter))
        _moe_up_finish_kernel[(num_pairs, triton.cdiv(inter, block))](
            ws13, act, ids, emap, b13, b13.stride(0), num_pairs, I=inter, SPLIT_K=splits_up, BLOCK=block,
            HAS_MAP=has_map, HAS_BIAS=w13_bias is not None, SWIGLU=activation == "swigluoai", num_warps=4,
        )
    if fmt == FP8_BLOCK:
        a, a_s = quant_fp8(act, SCALE_BLOCK)
    else:
        a, a_s = act, act  # a_s unused
    splits_down, k_split_down = k_split(inter, down, k_down)
    if splits_down > 1:
        pair_out = torch.empty((splits_down, num_pairs, size), dtype=torch.float32, device=hidden.device)
    else:
        pair_out = out if top_k == 1 else torch.empty((num_pairs, size), dtype=hidden.dtype, device=hidden.device)
    _moe_down_quant_kernel[(num_row_blocks * triton.cdiv(size, down.block_n), splits_down)](
        a, a.stride(0), a_s, a_s.stride(0), w2v, w2v.stride(0), w2v.stride(1), s2, s2.stride(0), s2.stride(1),
        pair_out, weights, sorted_ids, block_experts, num_pairs, num_row_blocks, b2, b2.stride(0),
        H=size, I=inter, FORMAT=fmt, BLOCK_M=cfg.block_m, BLOCK_N=down.block_n, BLOCK_K=k_down,
        GROUP_M=cfg.group_m, EXACT=exact, SHIFT=_SHIFT, C=c_down, SPLIT_K=splits_down, K_SPLIT=k_split_down,
        MMA_ROWS=fmt == MXFP4 and loads_in_mma_rows(down), HAS_BIAS=w2_bias is not None, num_warps=down.num_warps,
        num_stages=down.num_stages,
    )
    block_h = min(1024, triton.next_power_of_2(size))  # the per-token sums below
    if splits_down > 1:
        _moe_split_sum_kernel[(tokens, triton.cdiv(size, block_h))](
            pair_out, weights, ids, emap, b2, b2.stride(0), out, out.stride(0), num_pairs,
            TOP_K=top_k, H=size, SPLIT_K=splits_down, BLOCK_H=block_h, HAS_MAP=has_map,
            HAS_BIAS=w2_bias is not None, num_warps=4,
        )
    elif top_k > 1:
        _moe_sum_kernel[(tokens, triton.cdiv(size, block_h))](
            pair_out, ids, emap, out, out.stride(0),
            TOP_K=top_k, H=size, BLOCK_H=block_h, HAS_MAP=has_map, num_warps=4,
        )
    return out
