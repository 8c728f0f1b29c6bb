"""Plain-torch GDN decode: the token-by-token recurrence (the specification)."""

from __future__ import annotations

import torch

from atom_kernels.gdn import (
    K_MAJOR,
    check_gdn_shapes,
    default_scale,
    gating,
    prepare_qk,
    read_state,
    recurrent_step,
    write_state,
)
from atom_kernels.ops._varlen import decode_rows


def fused_recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, ssm_state, slots, *, scale=None,
                                     state_layout=K_MAJOR, use_qk_l2norm=True, num_accepted_tokens=None,
                                     cu_seqlens=None):
    check_gdn_shapes("fused_recurrent_gated_delta_rule", q, k, v, a, b, A_log, dt_bias, ssm_state, state_layout)
    T, HV = v.shape[0], v.shape[1]
    N = slots.shape[0]
    rows = decode_rows("fused_recurrent_gated_delta_rule", T, N, cu_seqlens)
    longest = max((end - first for first, end in rows), default=0)
    if slots.dim() == 2 and slots.shape[1] < longest:
        raise ValueError(f"fused_recurrent_gated_delta_rule: slots [N, S] need S >= {longest} (the longest "
                         f"sequence), got {tuple(slots.shape)}")
    g, beta = gating(a, b, A_log, dt_bias)
    qf, kf = prepare_qk(q, k, HV, default_scale(q.shape[-1], scale), use_qk_l2norm)
    vf = v.float()
    out = torch.zeros(T, HV, v.shape[2], dtype=v.dtype, device=v.device)
    slot_rows = slots.view(N, -1).tolist()
    accepted = num_accepted_tokens.tolist() if num_accepted_tokens is not None else [1] * N
    for n in range(N):
        row = slot_rows[n]
        read_slot = row[accepted[n] - 1] if slots.dim() == 2 else row[0]
        first, end = rows[n]
        if read_slot < 0 or first == end:
            continue
        S = read_state(ssm_state, read_slot, state_layout)
        for t, tok in enumerate(range(first, end)):
            S, o = recurrent_step(S, qf[tok], kf[tok], vf[tok], g[tok], beta[tok])
            out[tok] = o.to(out.dtype)
            if slots.dim() == 2 and row[t] >= 0:
                write_state(ssm_state, row[t], S, state_layout)
        if slots.dim() == 1:
            write_state(ssm_state, read_slot, S, state_layout)
    return out
