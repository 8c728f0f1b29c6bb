"""AITER GDN prefill (ROCm), through ``aiter.ops.triton.gated_delta_net.chunk_gated_delta_rule``.

Unverified here: nobody on the team has an AMD GPU.  AITER's function takes precomputed g/β and
returns the final states instead of updating a pool, so this wrapper gathers the initial states, runs
it and scatters the final states back; the scatter filters padding slots with a boolean mask (a host
sync: not CUDA-graph capturable, unlike the Triton backend).
"""

from __future__ import annotations

import torch

from atom_kernels.gdn import K_MAJOR, default_scale, gating


def unsupported(q, k, v, a, b, A_log, dt_bias, ssm_state, cu_seqlens, slots, has_initial_state=None, *, scale=None,
                state_layout=K_MAJOR, use_qk_l2norm=True) -> str | None:
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"aiter GDN takes bf16/fp16, not {q.dtype}"
    if state_layout != K_MAJOR:
        return "aiter keeps the GDN state k_major"
    return None


def chunk_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, ssm_state, cu_seqlens, slots, has_initial_state=None, *,
                           scale=None, state_layout=K_MAJOR, use_qk_l2norm=True):
    from aiter.ops.triton.gated_delta_net import chunk_gated_delta_rule as aiter_chunk

    groups = v.shape[1] // q.shape[1]
    g, beta = gating(a, b, A_log, dt_bias)
    valid = slots >= 0
    read = torch.zeros_like(valid) if has_initial_state is None else valid & has_initial_state.bool()
    h0 = torch.where(read[:, None, None, None], ssm_state[slots.clamp(min=0)].float(), 0.0)
    qx, kx = (t.repeat_interleave(groups, dim=1).contiguous()[None] for t in (q, k))
    o, final = aiter_chunk(
        qx, kx, v.contiguous()[None], g[None], beta[None], scale=default_scale(q.shape[-1], scale),
        initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm, cu_seqlens=cu_seqlens.long(),
    )
    ssm_state[slots[valid]] = final[valid].to(ssm_state.dtype)
    return o[0].to(v.dtype)
