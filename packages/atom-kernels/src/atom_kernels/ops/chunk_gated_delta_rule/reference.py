"""Plain-torch GDN prefill: the token-by-token recurrence over each packed sequence (the specification)."""

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


def chunk_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, ssm_state, cu_seqlens, slots, has_initial_state=None, *,
                           scale=None, state_layout=K_MAJOR, use_qk_l2norm=True):
    check_gdn_shapes("chunk_gated_delta_rule", q, k, v, a, b, A_log, dt_bias, ssm_state, state_layout)
    HV, K, V = v.shape[1], q.shape[2], v.shape[2]
    g, beta = gating(a, b, A_log, dt_bias)
    qf, kf = prepare_qk(q, k, HV, default_scale(K, scale), use_qk_l2norm)
    vf = v.float()
    out = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
    cu = cu_seqlens.tolist()
    slot_list = slots.tolist()
    init = has_initial_state.tolist() if has_initial_state is not None else [False] * len(slot_list)
    for n, slot in enumerate(slot_list):
        if slot >= 0 and init[n]:
            S = read_state(ssm_state, slot, state_layout)
        else:
            S = torch.zeros(HV, K, V, dtype=torch.float32, device=v.device)
        for t in range(cu[n], cu[n + 1]):
            S, o = recurrent_step(S, qf[t], kf[t], vf[t], g[t], beta[t])
            out[t] = o.to(out.dtype)
        if slot >= 0:
            write_state(ssm_state, slot, S, state_layout)
    return out
