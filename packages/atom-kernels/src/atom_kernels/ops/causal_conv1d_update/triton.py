"""Triton decode conv1d: program (sequence, BD channels) computes its Tq outputs from the slot's state and
the new inputs (every tap index is a compile-time constant), then shifts the state in place, or, for a speculative
step's rolling state, starts the window at the accepted offset and keeps it (ragged lengths from cu_seqlens)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.ops.causal_conv1d.reference import check_conv_args

MAX_WIDTH = 8
MAX_ROLLING_TOKENS = 16  # new tokens per sequence of a speculative step (unrolled)
CONFIGS = {"default": dict(BD=256, num_warps=2)}


def unsupported(x, weight, bias, conv_state, slots, activation="silu", *, num_accepted_tokens=None,
                cu_seqlens=None) -> str | None:
    if weight.shape[1] > MAX_WIDTH:
        return f"conv width {weight.shape[1]} > {MAX_WIDTH}"
    if x.stride(-1) != 1:
        return "x needs a contiguous last dim"
    if cu_seqlens is not None and num_accepted_tokens is None:
        return "ragged decode (cu_seqlens) is wired for the speculative rolling state only"
    if num_accepted_tokens is not None and conv_state.shape[2] - (weight.shape[1] - 2) > MAX_ROLLING_TOKENS:
        return f"a rolling conv state for more than {MAX_ROLLING_TOKENS} tokens per sequence"
    return None


@triton.jit
def _cols_if(cols, D, cond):
    """``cols < D`` where the scalar ``cond`` holds, else no column (a tensor comparison: Triton 3.9's interpreter
    refuses a mask that ands a scalar comparison into a tensor one)."""
    return cols < tl.where(cond, D, 0)


@triton.jit
def _tap(x_ptr, state_ptr, row0, length, slot, offset, cols, col_ok, sx_t, ss_slot, ss_d, ss_w, D,
         idx: tl.constexpr, W: tl.constexpr):
    """Input ``idx`` relative to the first new token: the state's column ``offset + W - 1 + idx`` when negative."""
    if idx < 0:
        v = tl.load(state_ptr + slot * ss_slot + cols * ss_d + (offset + W - 1 + idx) * ss_w, mask=col_ok, other=0.0)
    else:
        v = tl.load(x_ptr + (row0 + idx) * sx_t + cols, mask=_cols_if(cols, D, idx < length), other=0.0)
    return v.to(tl.float32)


@triton.jit
def _conv_update_kernel(
    x_ptr, w_ptr, bias_ptr, state_ptr, out_ptr, slots_ptr, accepted_ptr, cu_ptr,
    sx_t, so_t, sw_d, sw_w, ss_slot, ss_d, ss_w, D,
    W: tl.constexpr, TQ: tl.constexpr, BD: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
    ROLLING: tl.constexpr, VARLEN: tl.constexpr,
):
    """TQ: the new tokens per sequence (VARLEN: the most; each sequence's own count from ``cu_ptr``)."""
    seq = tl.program_id(0)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    col_ok = cols < D
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    if VARLEN:
        row0 = tl.load(cu_ptr + seq).to(tl.int64)
        length = tl.load(cu_ptr + seq + 1).to(tl.int64) - row0
    else:
        row0 = seq.to(tl.int64) * TQ
        length = TQ
    if slot < 0:
        for t in tl.static_range(TQ):
            tl.store(out_ptr + (row0 + t) * so_t + cols, tl.zeros([BD], tl.float32).to(out_ptr.dtype.element_ty),
                     mask=_cols_if(cols, D, t < length))
        return
    if length == 0:
        return
    offset = 0
    if ROLLING:  # the window starts after the inputs of the previous step's rejected draft tokens
        offset = tl.load(accepted_ptr + seq).to(tl.int64) - 1
    for t in tl.static_range(TQ):
        acc = tl.zeros([BD], dtype=tl.float32)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        for w in tl.static_range(W):
            weight = tl.load(w_ptr + cols * sw_d + w * sw_w, mask=col_ok, other=0.0).to(tl.float32)
            acc += weight * _tap(x_ptr, state_ptr, row0, length, slot, offset, cols, col_ok, sx_t, ss_slot, ss_d, ss_w,
                                 D, t + w - (W - 1), W)
        if SILU:
            acc = acc * tl.sigmoid(acc)
        tl.store(out_ptr + (row0 + t) * so_t + cols, acc.to(out_ptr.dtype.element_ty), mask=_cols_if(cols, D, t < length))
    # Shifting in place needs no barrier: each channel's loads and stores are issued by the same thread in program
    # order, and every column is read before it is overwritten.
    if ROLLING:
        # new column j = input j - (W - 2): old column offset + 1 + j (> j) for j < W - 2, then the new tokens
        for j in tl.static_range(W - 2 + TQ):
            value = _tap(x_ptr, state_ptr, row0, length, slot, offset, cols, col_ok, sx_t, ss_slot, ss_d, ss_w, D,
                         j - (W - 2), W)
            tl.store(state_ptr + slot * ss_slot + cols * ss_d + j * ss_w, value.to(state_ptr.dtype.element_ty),
                     mask=_cols_if(cols, D, j < W - 2 + length))
    else:
        # new column j = input TQ + j - (W - 1): old column TQ + j > j, read at step j, before it is written
        for j in tl.static_range(W - 1):
            value = _tap(x_ptr, state_ptr, row0, length, slot, offset, cols, col_ok, sx_t, ss_slot, ss_d, ss_w, D,
                         TQ + j - (W - 1), W)
            tl.store(state_ptr + slot * ss_slot + cols * ss_d + j * ss_w, value.to(state_ptr.dtype.element_ty),
                     mask=col_ok)


def causal_conv1d_update(x, weight, bias, conv_state, slots, activation="silu", *, num_accepted_tokens=None,
                         cu_seqlens=None, config=None):
    rolling = num_accepted_tokens is not None
    check_conv_args("causal_conv1d_update", x, weight, bias, conv_state, activation, rolling=rolling)
    if why := unsupported(x, weight, bias, conv_state, slots, activation, num_accepted_tokens=num_accepted_tokens,
                          cu_seqlens=cu_seqlens):
        raise ValueError(f"causal_conv1d_update (triton): {why}")
    num_seqs = slots.shape[0]
    if cu_seqlens is None and (num_seqs == 0 or x.shape[0] % num_seqs):
        raise ValueError(f"causal_conv1d_update: {x.shape[0]} tokens do not split evenly over {num_seqs} sequences")
    cfg = config or CONFIGS["default"]
    D, W = x.shape[1], weight.shape[1]
    out = torch.zeros_like(x) if cu_seqlens is not None else torch.empty_like(x)
    if num_seqs == 0:
        return out
    rolling_tokens = conv_state.shape[2] - (W - 2)  # what a rolling buffer holds per sequence
    tq = rolling_tokens if cu_seqlens is not None else x.shape[0] // num_seqs
    if rolling and tq > rolling_tokens:
        raise ValueError(f"causal_conv1d_update: a rolling conv state of {conv_state.shape[2]} columns holds at most "
                         f"{rolling_tokens} new tokens per sequence, not {tq}")
    _conv_update_kernel[(num_seqs, triton.cdiv(D, cfg["BD"]))](
        x, weight, bias if bias is not None else weight, conv_state, out, slots,
        num_accepted_tokens if rolling else slots, cu_seqlens if cu_seqlens is not None else slots,
        x.stride(0), out.stride(0), weight.stride(0), weight.stride(1),
        conv_state.stride(0), conv_state.stride(1), conv_state.stride(2), D,
        W=W, TQ=tq, BD=cfg["BD"], HAS_BIAS=bias is not None, SILU=activation == "silu", ROLLING=rolling,
        VARLEN=cu_seqlens is not None, num_warps=cfg["num_warps"],
    )
    return out
