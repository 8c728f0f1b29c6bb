"""AITER GDN decode (ROCm), through ``aiter.ops.triton.gated_delta_net.fused_recurrent_gated_delta_rule``.

Unverified here: nobody on the team has an AMD GPU.  AITER computes from gathered initial states and
returns final ones, so this wrapper gathers and scatters around it (the scatter filters padding slots
with a boolean mask: a host sync, not CUDA-graph capturable, unlike the Triton backend).
"""

from __future__ import annotations

import torch

from atom_kernels.gdn import K_MAJOR, default_scale, gating


def unsupported(q, k, v, a, b, A_log, dt_bias, ssm_state, slots, *, scale=None, state_layout=K_MAJOR,
                use_qk_l2norm=True, num_accepted_tokens=None, cu_seqlens=None) -> str | None:
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"aiter GDN takes bf16/fp16, not {q.dtype}"
    if state_layout != K_MAJOR:
        return "aiter keeps the GDN state k_major"
    if slots.dim() != 1 or cu_seqlens is not None:
        return "per-token state slots and ragged lengths (speculative decode) are not wired to aiter"
    return None


def fused_recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, ssm_state, slots, *, scale=None,
                                     state_layout=K_MAJOR, use_qk_l2norm=True, num_accepted_tokens=None,
                                     cu_seqlens=None):
    from aiter.ops.triton.gated_delta_net import fused_recurrent_gated_delta_rule as aiter_recurrent

    num_seqs = slots.shape[0]
    per_seq = q.shape[0] // num_seqs
    groups = v.shape[1] // q.shape[1]
    g, beta = gating(a, b, A_log, dt_bias)
    valid = slots >= 0
    h0 = ssm_state[slots.clamp(min=0)].float()
    cu = torch.arange(num_seqs + 1, device=q.device, dtype=torch.long) * per_seq
    qx, kx = (t.repeat_interleave(groups, dim=1).contiguous()[None] for t in (q, k))
    o, final = aiter_recurrent(
        qx, kx, v.contiguous()[None], g=g[None], beta=beta[None], scale=default_scale(q.shape[-1], scale),
        initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=use_qk_l2norm, cu_seqlens=cu,
    )
    ssm_state[slots[valid]] = final[valid].to(ssm_state.dtype)
    keep = valid.repeat_interleave(per_seq)[:, None, None]
    return torch.where(keep, o[0], 0).to(v.dtype)
