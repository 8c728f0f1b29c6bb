"""Plain-torch causal conv1d over packed sequences: the specification."""

from __future__ import annotations

import torch
import torch.nn.functional as F

ACTIVATIONS = {"silu": F.silu, None: lambda x: x}


def check_conv_args(op: str, x, weight, bias, conv_state, activation, *, rolling: bool = False) -> None:
    """Shape checks; ``rolling``: the conv state is a speculative-decode buffer of at least ``W - 1`` columns."""
    if x.dim() != 2 or weight.dim() != 2 or weight.shape[0] != x.shape[1]:
        raise ValueError(f"{op}: x must be [T, D] and weight [D, W], got {tuple(x.shape)} and {tuple(weight.shape)}")
    if bias is not None and tuple(bias.shape) != (x.shape[1],):
        raise ValueError(f"{op}: bias must be [D]={x.shape[1]}, got {tuple(bias.shape)}")
    expected = (x.shape[1], weight.shape[1] - 1)
    shape_ok = conv_state.dim() == 3 and conv_state.shape[1] == expected[0] and (
        conv_state.shape[2] >= expected[1] if rolling else conv_state.shape[2] == expected[1])
    if not shape_ok:
        columns = f">= {expected[1]}" if rolling else str(expected[1])
        raise ValueError(f"{op}: conv_state must be [slots, {expected[0]}, {columns}], got {tuple(conv_state.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be 'silu' or None, got {activation!r}")


def conv_window(window: torch.Tensor, weight: torch.Tensor, bias, activation) -> torch.Tensor:
    """``window [W - 1 + L, D]`` fp32 -> outputs ``[L, D]`` of a causal depthwise conv of width W."""
    width = weight.shape[1]
    length = window.shape[0] - (width - 1)
    out = sum(window[w : w + length] * weight[:, w].float() for w in range(width))
    if bias is not None:
        out = out + bias.float()
    return ACTIVATIONS[activation](out)


def causal_conv1d(x, weight, bias, conv_state, cu_seqlens, slots, has_initial_state=None, activation="silu"):
    check_conv_args("causal_conv1d", x, weight, bias, conv_state, activation)
    width = weight.shape[1]
    out = torch.zeros_like(x)
    cu = cu_seqlens.tolist()
    slot_list = slots.tolist()
    init = has_initial_state.tolist() if has_initial_state is not None else [False] * len(slot_list)
    for n, slot in enumerate(slot_list):
        bos, eos = cu[n], cu[n + 1]
        if slot >= 0 and init[n]:
            history = conv_state[slot].float().t()  # [W-1, D]
        else:
            history = x.new_zeros(width - 1, x.shape[1], dtype=torch.float32)
        window = torch.cat([history, x[bos:eos].float()])
        out[bos:eos] = conv_window(window, weight, bias, activation).to(x.dtype)
        if slot >= 0:
            conv_state[slot] = window[window.shape[0] - (width - 1) :].t().to(conv_state.dtype)
    return out
