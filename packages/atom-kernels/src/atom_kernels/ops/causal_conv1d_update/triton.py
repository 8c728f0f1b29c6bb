"""Triton decode conv1d: program (sequence, BD channels) computes its Tq outputs from the slot's state and
the new inputs (every tap index is a compile-time constant), then shifts the state in place; a second kernel
does the same for a speculative step's rolling state (window at the accepted offset, ragged lengths)."""

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
def _tap(x_ptr, state_ptr, seq_row0, slot, cols, col_ok, sx_t, ss_slot, ss_d, ss_w, idx: tl.constexpr, W: tl.constexpr):
    """Input ``idx`` relative to the first new token: the state's column ``W - 1 + idx`` when negative."""
    if idx < 0:
        v = tl.load(state_ptr + slot * ss_slot + cols * ss_d + (W - 1 + idx) * ss_w, mask=col_ok, other=0.0)
    else:
        v = tl.load(x_ptr + (seq_row0 + idx) * sx_t + cols, mask=col_ok, other=0.0)
    return v.to(tl.float32)


@triton.jit
def _conv_update_kernel(
    x_ptr, w_ptr, bias_ptr, state_ptr, out_ptr, slots_ptr,
    sx_t, so_t, sw_d, sw_w, ss_slot, ss_d, ss_w, D,
    W: tl.constexpr, TQ: tl.constexpr, BD: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
):
    seq = tl.program_id(0)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    col_ok = cols < D
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    row0 = seq.to(tl.int64) * TQ
    if slot < 0:
        for t in tl.static_range(TQ):
            tl.store(out_ptr + (row0 + t) * so_t + cols, tl.zeros([BD], tl.float32).to(out_ptr.dtype.element_ty), mask=col_ok)
        return
    for t in tl.static_range(TQ):
        acc = tl.zeros([BD], dtype=tl.float32)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        for w in tl.static_range(W):
            weight = tl.load(w_ptr + cols * sw_d + w * sw_w, mask=col_ok, other=0.0).to(tl.float32)
            acc += weight * _tap(x_ptr, state_ptr, row0, slot, cols, col_ok, sx_t, ss_slot, ss_d, ss_w, t + w - (W - 1), W)
        if SILU:
            acc = acc * tl.sigmoid(acc)
        tl.store(out_ptr + (row0 + t) * so_t + cols, acc.to(out_ptr.dtype.element_ty), mask=col_ok)
    # new state column j = input TQ + j - (W - 1).  Column j is overwritten after every read of it (a
    # read of old column c happens at step c - TQ < c), and each channel's loads and stores are issued by
    # the same thread in program order, so shifting in place needs no barrier.
    for j in tl.static_range(W - 1):
        value = _tap(x_ptr, state_ptr, row0, slot, cols, col_ok, sx_t, ss_slot, ss_d, ss_w, TQ + j - (W - 1), W)
        tl.store(state_ptr + slot * ss_slot + cols * ss_d + j * ss_w, value.to(state_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def _rolling_tap(x_ptr, state_ptr, row0, length, slot, offset, cols, col_ok, sx_t, ss_slot, ss_d, ss_w,
                 idx: tl.constexpr, W: tl.constexpr):
    """Input ``idx`` relative to the first new token: the state's column ``offset + W - 1 + idx`` when negative."""
    if idx < 0:
        v = tl.load(state_ptr + slot * ss_slot + cols * ss_d + (offset + W - 1 + idx) * ss_w, mask=col_ok, other=0.0)
    else:
        v = tl.load(x_ptr + (row0 + idx) * sx_t + cols, mask=col_ok & (idx < length), other=0.0)
    return v.to(tl.float32)


@triton.jit
def _conv_update_rolling_kernel(
    x_ptr, w_ptr, bias_ptr, state_ptr, out_ptr, slots_ptr, accepted_ptr, cu_ptr,
    sx_t, so_t, sw_d, sw_w, ss_slot, ss_d, ss_w, D,
    W: tl.constexpr, TQ: tl.constexpr, BD: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr,
    VARLEN: tl.constexpr,
):
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
                     mask=col_ok & (t < length))
        return
    if length == 0:
        return
    offset = tl.load(accepted_ptr + seq).to(tl.int64) - 1
    for t in tl.static_range(TQ):
        acc = tl.zeros([BD], dtype=tl.float32)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        for w in tl.static_range(W):
            weight = tl.load(w_ptr + cols * sw_d + w * sw_w, mask=col_ok, other=0.0).to(tl.float32)
            acc += weight * _rolling_tap(x_ptr, state_ptr, row0, length, slot, offset, cols, col_ok, sx_t, ss_slot,
                                         ss_d, ss_w, t + w - (W - 1), W)
        if SILU:
            acc = acc * tl.sigmoid(acc)
        tl.store(out_ptr + (row0 + t) * so_t + cols, acc.to(out_ptr.dtype.element_ty), mask=col_ok & (t < length))
    # new column j = input j - (W - 2): old column offset + 1 + j (> j, not yet overwritten: columns are written
    # in increasing order by the thread that reads them) for j < W - 2, then the new tokens
    for j in tl.static_range(W - 2 + TQ):
        value = _rolling_tap(x_ptr, state_ptr, row0, length, slot, offset, cols, col_ok, sx_t, ss_slot, ss_d, ss_w,
                             j - (W - 2), W)
        tl.store(state_ptr + slot * ss_slot + cols * ss_d + j * ss_w, value.to(state_ptr.dtype.element_ty),
                 mask=col_ok & (j < W - 2 + length))


def causal_conv1d_update(x, weight, bias, conv_state, slots, activation="silu", *, num_accepted_tokens=None,
                         cu_seqlens=None, config=None):
    rolling = num_accepted_tokens is not None
    check_conv_args("causal_conv1d_update", x, weight, bias, conv_state, activation, rolling=rolling)
    num_seqs = slots.shape[0]
    if cu_seqlens is None and (num_seqs == 0 or x.shape[0] % num_seqs):
        raise ValueError(f"causal_conv1d_update: {x.shape[0]} tokens do not split evenly over {num_seqs} sequences")
    cfg = config or CONFIGS["default"]
    D, W = x.shape[1], weight.shape[1]
    out = torch.zeros_like(x) if cu_seqlens is not None else torch.empty_like(x)
    if num_seqs == 0:
        return out
    common = (x.stride(0), out.stride(0), weight.stride(0), weight.stride(1),
              conv_state.stride(0), conv_state.stride(1), conv_state.stride(2), D)
    grid = (num_seqs, triton.cdiv(D, cfg["BD"]))
    if rolling:
        # the static bound of new tokens per sequence: what the buffer holds (uniform: exactly T / N)
        tq = conv_state.shape[2] - (W - 2) if cu_seqlens is not None else x.shape[0] // num_seqs
        if W - 2 + tq > conv_state.shape[2]:
            raise ValueError(f"causal_conv1d_update: a rolling conv state of {conv_state.shape[2]} columns holds at "
                             f"most {conv_state.shape[2] - (W - 2)} new tokens per sequence, not {tq}")
        _conv_update_rolling_kernel[grid](
            x, weight, bias if bias is not None else weight, conv_state, out, slots, num_accepted_tokens,
            cu_seqlens if cu_seqlens is not None else slots, *common,
            W=W, TQ=tq, BD=cfg["BD"], HAS_BIAS=bias is not None, SILU=activation == "silu",
            VARLEN=cu_seqlens is not None, num_warps=cfg["num_warps"],
        )
        return out
    _conv_update_kernel[grid](
        x, weight, bias if bias is not None else weight, conv_state, out, slots, *common,
        W=W, TQ=x.shape[0] // num_seqs, BD=cfg["BD"], HAS_BIAS=bias is not None,
        SILU=activation == "silu", num_warps=cfg["num_warps"],
    )
    return out
