"""Triton GDN decode.

Program ``(n * HV + h, j)`` owns value columns ``[j*BV, (j+1)*BV)`` of sequence n's state of value head h:
it loads that ``K x BV`` tile once (16-byte vector loads along the contiguous axis of the pool's layout),
runs the Tq tokens on it in registers and stores it back.  Decode is memory bound: the state is the
bytes, and splitting V across programs keeps enough of them in flight when N is small.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.gdn import K_MAJOR, V_MAJOR, check_gdn_shapes, default_scale, state_strides
from atom_kernels.ops._triton_common import gdn_gate

MAX_HEAD_DIM = 256

# Launch configs by shape class (value-head programs before the V split); chosen by the bench sweep
# (bench/gdn.py) on an H200.
CONFIGS = {
    "few": dict(BV=8, num_warps=1),  # < 1024 (sequence, head) pairs: latency bound, many small programs
    "many": dict(BV=32, num_warps=4),  # bandwidth bound
}


def shape_class(num_seqs: int, num_v_heads: int) -> str:
    return "few" if num_seqs * num_v_heads < 1024 else "many"


def unsupported(q, k, v, a, b, A_log, dt_bias, ssm_state, slots, *, scale=None, state_layout=K_MAJOR,
                use_qk_l2norm=True, num_accepted_tokens=None, cu_seqlens=None) -> str | None:
    if q.shape[-1] > MAX_HEAD_DIM or v.shape[-1] > MAX_HEAD_DIM:
        return f"head dims {q.shape[-1]}/{v.shape[-1]} > {MAX_HEAD_DIM}"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            return f"{name} needs a contiguous last dim"
    if ssm_state.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"state dtype {ssm_state.dtype}"
    return None


@triton.jit
def _decode_kernel(
    q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, A_log_ptr, dt_bias_ptr, state_ptr, slots_ptr, accepted_ptr, cu_ptr, o_ptr,
    sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, sa_t, sa_h, sb_t, sb_h, so_t, so_h,
    ss_slot, ss_h, ss_k, ss_v, sl_n, sl_t,
    scale,
    HV: tl.constexpr, GROUPS: tl.constexpr, K: tl.constexpr, V: tl.constexpr, TQ: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr,
    V_MAJOR_STATE: tl.constexpr, PER_TOKEN_SLOTS: tl.constexpr, HAS_ACCEPTED: tl.constexpr,
    L2NORM: tl.constexpr, VARLEN: tl.constexpr,
):
    pid = tl.program_id(0)
    n = pid // HV
    hv = pid % HV
    hk = hv // GROUPS
    cols_k = tl.arange(0, BK)
    cols_v = tl.program_id(1) * BV + tl.arange(0, BV)
    mask_k = cols_k < K
    mask_v = cols_v < V
    n64 = n.to(tl.int64)

    read_idx = 0
    if HAS_ACCEPTED:
        read_idx = tl.load(accepted_ptr + n) - 1
    read_slot = tl.load(slots_ptr + n64 * sl_n + read_idx * sl_t).to(tl.int64)
    if VARLEN:
        tok0 = tl.load(cu_ptr + n64).to(tl.int64)
        length = tl.load(cu_ptr + n64 + 1).to(tl.int64) - tok0
    else:
        tok0 = n64 * TQ
        length = TQ
    # token loops are `while` loops: a runtime trip count (VARLEN) that Triton's interpreter also runs
    if read_slot < 0:  # padding: zero outputs, state untouched
        t = 0
        while t < length:
            tl.store(o_ptr + (tok0 + t) * so_t + hv * so_h + cols_v, tl.zeros([BV], tl.float32).to(o_ptr.dtype.element_ty),
                     mask=mask_v)
            t += 1
        return

    # the state tile, laid out with the pool's contiguous axis last
    if V_MAJOR_STATE:
        tile = cols_v[:, None] * ss_v + cols_k[None, :] * ss_k
        tile_mask = mask_v[:, None] & mask_k[None, :]
    else:
        tile = cols_k[:, None] * ss_k + cols_v[None, :] * ss_v
        tile_mask = mask_k[:, None] & mask_v[None, :]
    # whether a per-token write slot is not skipped, as a tensor comparison (Triton 3.9's interpreter refuses a mask
    # that ands a scalar comparison into a tensor one)
    tile_cols = cols_v[:, None] + 0 * cols_k[None, :] if V_MAJOR_STATE else 0 * cols_k[:, None] + cols_v[None, :]
    S = tl.load(state_ptr + read_slot * ss_slot + hv * ss_h + tile, mask=tile_mask, other=0.0).to(tl.float32)

    A_log = tl.load(A_log_ptr + hv).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + hv).to(tl.float32)
    t = 0
    while t < length:
        tok = tok0 + t
        q = tl.load(q_ptr + tok * sq_t + hk * sq_h + cols_k, mask=mask_k, other=0.0).to(tl.float32)
        kk = tl.load(k_ptr + tok * sk_t + hk * sk_h + cols_k, mask=mask_k, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + tok * sv_t + hv * sv_h + cols_v, mask=mask_v, other=0.0).to(tl.float32)
        a = tl.load(a_ptr + tok * sa_t + hv * sa_h).to(tl.float32)
        b = tl.load(b_ptr + tok * sb_t + hv * sb_h).to(tl.float32)
        g, beta = gdn_gate(a, b, A_log, dt_bias)
        if L2NORM:
            q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6)
            kk = kk * tl.rsqrt(tl.sum(kk * kk, 0) + 1e-6)
        q = q * scale
        S = S * tl.exp(g)
        if V_MAJOR_STATE:
            v_new = beta * (v - tl.sum(S * kk[None, :], 1))
            S = S + v_new[:, None] * kk[None, :]
            o = tl.sum(S * q[None, :], 1)
        else:
            v_new = beta * (v - tl.sum(S * kk[:, None], 0))
            S = S + kk[:, None] * v_new[None, :]
            o = tl.sum(S * q[:, None], 0)
        tl.store(o_ptr + tok * so_t + hv * so_h + cols_v, o.to(o_ptr.dtype.element_ty), mask=mask_v)
        if PER_TOKEN_SLOTS:
            write_slot = tl.load(slots_ptr + n64 * sl_n + t * sl_t).to(tl.int64)
            tl.store(state_ptr + write_slot * ss_slot + hv * ss_h + tile, S.to(state_ptr.dtype.element_ty),
                     mask=tile_mask & (tile_cols < tl.where(write_slot >= 0, V, 0)))
        t += 1
    if not PER_TOKEN_SLOTS:  # (a sequence without tokens writes back the state it read)
        tl.store(state_ptr + read_slot * ss_slot + hv * ss_h + tile, S.to(state_ptr.dtype.element_ty), mask=tile_mask)


def launch(q, k, v, a, b, A_log, dt_bias, ssm_state, slots, out, *, scale, state_layout, use_qk_l2norm,
           num_accepted_tokens, config, cu_seqlens=None):
    N = slots.shape[0]
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    ss_slot, ss_h, ss_k, ss_v = state_strides(ssm_state, state_layout)
    per_token = slots.dim() == 2
    sl_n, sl_t = (slots.stride(0), slots.stride(1)) if per_token else (slots.stride(0), 0)
    bv = min(config["BV"], triton.next_power_of_2(V))
    grid = (N * HV, triton.cdiv(V, bv))
    _decode_kernel[grid](
        q, k, v, a, b, A_log, dt_bias, ssm_state, slots,
        num_accepted_tokens if num_accepted_tokens is not None else slots,
        cu_seqlens if cu_seqlens is not None else slots, out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
        ss_slot, ss_h, ss_k, ss_v, sl_n, sl_t,
        scale,
        HV=HV, GROUPS=HV // H, K=K, V=V, TQ=T // N if cu_seqlens is None else 0, BK=triton.next_power_of_2(K), BV=bv,
        V_MAJOR_STATE=state_layout == V_MAJOR, PER_TOKEN_SLOTS=per_token,
        HAS_ACCEPTED=num_accepted_tokens is not None and per_token, L2NORM=use_qk_l2norm,
        VARLEN=cu_seqlens is not None,
        num_warps=config["num_warps"],
    )
    return out


def fused_recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, ssm_state, slots, *, scale=None,
                                     state_layout=K_MAJOR, use_qk_l2norm=True, num_accepted_tokens=None,
                                     cu_seqlens=None, config=None):
    check_gdn_shapes("fused_recurrent_gated_delta_rule", q, k, v, a, b, A_log, dt_bias, ssm_state, state_layout)
    N, T = slots.shape[0], q.shape[0]
    if cu_seqlens is None:
        if N == 0 or T % N:
            raise ValueError(f"fused_recurrent_gated_delta_rule: {T} tokens do not split evenly over {N} sequences")
        if slots.dim() == 2 and slots.shape[1] != T // N:
            raise ValueError(f"fused_recurrent_gated_delta_rule: slots [N, Tq] must have Tq={T // N}, got {tuple(slots.shape)}")
    elif cu_seqlens.shape != (N + 1,):
        raise ValueError(f"fused_recurrent_gated_delta_rule: cu_seqlens must be [{N + 1}], got {tuple(cu_seqlens.shape)}")
    # ragged (cu_seqlens): rows past the last sequence are zero, as in the reference
    out = (torch.zeros if cu_seqlens is not None else torch.empty)(T, v.shape[1], v.shape[2], dtype=v.dtype,
                                                                    device=v.device)
    if N == 0:
        return out
    config = config or CONFIGS[shape_class(N, v.shape[1])]
    return launch(q, k, v, a, b, A_log, dt_bias, ssm_state, slots, out, scale=default_scale(q.shape[-1], scale),
                  state_layout=state_layout, use_qk_l2norm=use_qk_l2norm, num_accepted_tokens=num_accepted_tokens,
                  config=config, cu_seqlens=cu_seqlens)
