"""Triton causal conv1d over packed sequences: two kernels.

1. outputs: program (chunk of BT tokens of one sequence, BD channels) sums the W shifted input tiles,
   taking inputs before a sequence's first token from its initial conv state;
2. states: program (sequence, BD channels) writes the last ``W - 1`` inputs into the slot.

The split keeps every read of an initial state (kernel 1) before the write of the final one (kernel 2).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.ops._varlen import PER_SEQUENCE_POINTERS, chunk_map
from atom_kernels.ops.causal_conv1d.reference import check_conv_args

MAX_WIDTH = 8
CONFIGS = {"default": dict(BT=32, BD=128, num_warps=4)}


def unsupported(x, weight, bias, conv_state, cu_seqlens, slots, has_initial_state=None, activation="silu") -> str | None:
    if weight.shape[1] > MAX_WIDTH:
        return f"conv width {weight.shape[1]} > {MAX_WIDTH}"
    if x.stride(-1) != 1:
        return "x needs a contiguous last dim"
    return None


@triton.jit(do_not_specialize_on_alignment=PER_SEQUENCE_POINTERS)
def _conv_out_kernel(
    x_ptr, w_ptr, bias_ptr, state_ptr, out_ptr, cu_ptr, slots_ptr, init_ptr, chunk_seq_ptr, chunk_start_ptr,
    sx_t, so_t, sw_d, sw_w, ss_slot, ss_d, ss_w, D,
    W: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_INIT: tl.constexpr, SILU: tl.constexpr,
):
    seq = tl.load(chunk_seq_ptr + tl.program_id(0))
    if seq < 0:
        return
    start = tl.load(chunk_start_ptr + tl.program_id(0)).to(tl.int64)
    bos = tl.load(cu_ptr + seq).to(tl.int64)
    eos = tl.load(cu_ptr + seq + 1).to(tl.int64)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    if HAS_INIT:  # the sequence continues from its slot's state
        use_state = (slot >= 0) & (tl.load(init_ptr + seq) != 0)
    rows = tl.arange(0, BT)
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    row_ok = start + rows < eos
    col_ok = cols < D
    pos = start - bos + rows  # position within the sequence
    acc = tl.zeros([BT, BD], dtype=tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    for w in tl.static_range(W):
        p = pos - (W - 1 - w)
        from_x = p >= 0
        xv = tl.load(x_ptr + (bos + p)[:, None] * sx_t + cols[None, :],
                     mask=(row_ok & from_x)[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
        if HAS_INIT:  # inputs before the first token come from the state
            xv += tl.load(state_ptr + slot * ss_slot + cols[None, :] * ss_d + (W - 1 + p)[:, None] * ss_w,
                          mask=(row_ok & (p < 0) & use_state)[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
        weight = tl.load(w_ptr + cols * sw_d + w * sw_w, mask=col_ok, other=0.0).to(tl.float32)
        acc += xv * weight[None, :]
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(out_ptr + (start + rows)[:, None] * so_t + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit(do_not_specialize_on_alignment=PER_SEQUENCE_POINTERS)
def _conv_state_kernel(
    x_ptr, state_ptr, cu_ptr, slots_ptr, init_ptr,
    sx_t, ss_slot, ss_d, ss_w, D,
    W: tl.constexpr, BD: tl.constexpr, HAS_INIT: tl.constexpr,
):
    seq = tl.program_id(0)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    if slot < 0:
        return
    if HAS_INIT:
        use_state = tl.load(init_ptr + seq) != 0
    bos = tl.load(cu_ptr + seq).to(tl.int64)
    length = tl.load(cu_ptr + seq + 1).to(tl.int64) - bos
    cols = tl.program_id(1) * BD + tl.arange(0, BD)
    col_ok = cols < D
    # Column j takes input position p = length - (W - 1) + j: from x, or (p < 0) from old column j + length
    # > j.  In increasing j every old column is read before it is overwritten, and each channel's loads
    # and stores come from the same thread in program order: no barrier needed.
    for j in tl.static_range(W - 1):
        p = length - (W - 1) + j
        xv = tl.load(x_ptr + (bos + p) * sx_t + cols, mask=col_ok & (p >= 0), other=0.0).to(tl.float32)
        if HAS_INIT:
            xv += tl.load(state_ptr + slot * ss_slot + cols * ss_d + (W - 1 + p) * ss_w, mask=col_ok & (p < 0) & use_state,
                          other=0.0).to(tl.float32)
        tl.store(state_ptr + slot * ss_slot + cols * ss_d + j * ss_w, xv.to(state_ptr.dtype.element_ty), mask=col_ok)


def causal_conv1d(x, weight, bias, conv_state, cu_seqlens, slots, has_initial_state=None, activation="silu", config=None):
    check_conv_args("causal_conv1d", x, weight, bias, conv_state, activation)
    cfg = config or CONFIGS["default"]
    T, D = x.shape
    width = weight.shape[1]
    num_seqs = slots.shape[0]
    out = torch.zeros_like(x)
    if T == 0 or num_seqs == 0:
        return out
    chunk_seq, chunk_start, _ = chunk_map(cu_seqlens, T, cfg["BT"])
    init = has_initial_state if has_initial_state is not None else slots
    common = dict(W=width, BD=cfg["BD"], HAS_INIT=has_initial_state is not None)
    _conv_out_kernel[(chunk_seq.numel(), triton.cdiv(D, cfg["BD"]))](
        x, weight, bias if bias is not None else weight, conv_state, out, cu_seqlens, slots, init, chunk_seq, chunk_start,
        x.stride(0), out.stride(0), weight.stride(0), weight.stride(1),
        conv_state.stride(0), conv_state.stride(1), conv_state.stride(2), D,
        BT=cfg["BT"], HAS_BIAS=bias is not None, SILU=activation == "silu", num_warps=cfg["num_warps"], **common,
    )
    _conv_state_kernel[(num_seqs, triton.cdiv(D, cfg["BD"]))](
        x, conv_state, cu_seqlens, slots, init,
        x.stride(0), conv_state.stride(0), conv_state.stride(1), conv_state.stride(2), D,
        num_warps=cfg["num_warps"], **common,
    )
    return out
