"""Plain-torch decode conv1d against per-slot conv states: the specification."""

from __future__ import annotations

import torch

from atom_kernels.ops._varlen import decode_rows
from atom_kernels.ops.causal_conv1d.reference import check_conv_args, conv_window


def causal_conv1d_update(x, weight, bias, conv_state, slots, activation="silu", *, num_accepted_tokens=None,
                         cu_seqlens=None):
    rolling = num_accepted_tokens is not None
    check_conv_args("causal_conv1d_update", x, weight, bias, conv_state, activation, rolling=rolling)
    rows = decode_rows("causal_conv1d_update", x.shape[0], slots.shape[0], cu_seqlens)
    width = weight.shape[1]
    if rolling and max((end - first for first, end in rows), default=0) > conv_state.shape[2] - (width - 2):
        raise ValueError(f"causal_conv1d_update: a rolling conv state of {conv_state.shape[2]} columns holds at most "
                         f"{conv_state.shape[2] - (width - 2)} new tokens per sequence")
    accepted = num_accepted_tokens.tolist() if rolling else [1] * len(rows)
    out = torch.zeros_like(x)
    for n, slot in enumerate(slots.tolist()):
        first, end = rows[n]
        if slot < 0 or first == end:
            continue
        offset = accepted[n] - 1  # the window starts after the inputs of the rejected draft tokens
        history = conv_state[slot, :, offset : offset + width - 1].float().t()
        window = torch.cat([history, x[first:end].float()])
        out[first:end] = conv_window(window, weight, bias, activation).to(x.dtype)
        if rolling:  # keep the window but its oldest input: the next step starts at its own accepted offset
            conv_state[slot, :, : window.shape[0] - 1] = window[1:].t().to(conv_state.dtype)
        else:
            conv_state[slot] = window[window.shape[0] - (width - 1) :].t().to(conv_state.dtype)
    return out
