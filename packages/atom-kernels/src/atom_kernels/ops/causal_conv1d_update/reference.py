"""Plain-torch decode conv1d against per-slot conv states: the specification."""

from __future__ import annotations

import torch

from atom_kernels.ops.causal_conv1d.reference import check_conv_args, conv_window


def causal_conv1d_update(x, weight, bias, conv_state, slots, activation="silu"):
    check_conv_args("causal_conv1d_update", x, weight, bias, conv_state, activation)
    num_seqs = slots.shape[0]
    if num_seqs == 0 or x.shape[0] % num_seqs:
        raise ValueError(f"causal_conv1d_update: {x.shape[0]} tokens do not split evenly over {num_seqs} sequences")
    per_seq = x.shape[0] // num_seqs
    width = weight.shape[1]
    out = torch.zeros_like(x)
    for n, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        rows = slice(n * per_seq, (n + 1) * per_seq)
        window = torch.cat([conv_state[slot].float().t(), x[rows].float()])
        out[rows] = conv_window(window, weight, bias, activation).to(x.dtype)
        conv_state[slot] = window[window.shape[0] - (width - 1) :].t().to(conv_state.dtype)
    return out
