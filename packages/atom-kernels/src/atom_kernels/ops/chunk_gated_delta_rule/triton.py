"""Triton GDN prefill: four kernels over chunks of 64 tokens.

1. ``_prep``  (chunk, value head): gating, cumulative log-decay ``G`` within the chunk (stored in log2
   units), β, and the WY inverse ``A = (I + L)⁻¹`` of ``L = tril₋₁(β k̂ k̂ᵀ ⊙ exp(Gᵢ - Gⱼ))``: the ten
   16x16 blocks of L from raw k (the L2 norms are folded in as row/column scales), the four diagonal
   blocks inverted by forward substitution, the rest by block merges.
2. ``_wu``    (chunk, value head): ``w = A (β e^G k̂)``, ``u = A (β v)`` as 64-row matrix products.
3. ``_state`` (V block, sequence x value head): the sequential pass; per chunk it saves the incoming
   state h for the output kernel, ``v' = u - w h`` and ``h = e^{G_last} h + k̂ᵀ (e^{G_last - G} v')``.
   Reads each sequence's initial state from its slot and writes the final one back.
4. ``_out``   (chunk, value head, V block): ``o = scale (e^G (q̂ h) + (q̂ k̂ᵀ ⊙ Γ ⊙ causal) v')``.

q̂/k̂ never materialise: the dots take raw q/k (bf16 on the GPU) and the inverse norms scale rows or
columns of the fp32 results.  Chunks of packed sequences are located without a host sync (see
``_varlen``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.gdn import K_MAJOR, check_gdn_shapes, default_scale, state_strides
from atom_kernels.ops._triton_common import dot_dtype, dot_precision, gdn_gate, use_while
from atom_kernels.ops._varlen import chunk_map

BT = 64  # chunk
BC = 16  # sub-block of the WY inverse
MAX_HEAD_DIM = 256

# Launch configs by shape class; "few" = fewer than 256 (sequence, value head) pairs, where the
# sequential state pass has few programs and splits V finer.  Chosen by the bench sweep (bench/gdn.py).
CONFIGS = {
    "few": dict(prep_warps=4, wu_warps=4, state_BV=16, state_warps=4, state_stages=2, out_BV=64, out_warps=4),
    "many": dict(prep_warps=4, wu_warps=4, state_BV=32, state_warps=4, state_stages=2, out_BV=64, out_warps=4),
}


def shape_class(num_seqs: int, num_v_heads: int) -> str:
    return "few" if num_seqs * num_v_heads < 256 else "many"


def unsupported(q, k, v, a, b, A_log, dt_bias, ssm_state, cu_seqlens, slots, has_initial_state=None, *, scale=None,
                state_layout=K_MAJOR, use_qk_l2norm=True) -> str | None:
    if q.shape[-1] > MAX_HEAD_DIM or v.shape[-1] > MAX_HEAD_DIM:
        return f"head dims {q.shape[-1]}/{v.shape[-1]} > {MAX_HEAD_DIM}"
    if q.shape[-1] < 16 or v.shape[-1] < 16:
        return "head dims below 16 (tl.dot minimum)"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            return f"{name} needs a contiguous last dim"
    if v.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return f"dtype {v.dtype}"
    return None


# --------------------------------------------------------------------------------------- kernel 1
@triton.jit
def _prep_block(a_ptr, b_ptr, k_ptr, g_ptr, beta_ptr, start, length, hv, hk, A_log, dt_bias, carry,
                sa_t, sa_h, sb_t, sb_h, sk_t, sk_h, sg_h,
                j: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr,
                DOT: tl.constexpr, L2NORM: tl.constexpr):
    """Sub-block j (16 tokens) of a chunk: its cumulative log2-decay, β, raw k and k's inverse norms."""
    rows = j * BC + tl.arange(0, BC)
    ok = rows < length
    tok = start + rows
    a = tl.load(a_ptr + tok * sa_t + hv * sa_h, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + tok * sb_t + hv * sb_h, mask=ok, other=0.0).to(tl.float32)
    g, beta = gdn_gate(a, b, A_log, dt_bias)
    g = tl.where(ok, g, 0.0)
    beta = tl.where(ok, beta, 0.0)
    G = (tl.cumsum(g, 0) + carry) * 1.4426950408889634
    tl.store(g_ptr + hv * sg_h + tok, G, mask=ok)
    tl.store(beta_ptr + hv * sg_h + tok, beta, mask=ok)
    cols = tl.arange(0, BK)
    kb = tl.load(k_ptr + tok[:, None] * sk_t + hk * sk_h + cols[None, :], mask=ok[:, None] & (cols < K)[None, :], other=0.0)
    if L2NORM:
        kf = kb.to(tl.float32)
        r = tl.rsqrt(tl.sum(kf * kf, 1) + 1e-6)
    else:
        r = tl.full([BC], 1.0, tl.float32)
    return G, beta, kb.to(DOT), r, ok, carry + tl.sum(g, 0)


@triton.jit
def _l_block(ki, kj, Gi, Gj, bri, rj, oki, okj, DIAG: tl.constexpr, BC: tl.constexpr, PREC: tl.constexpr):
    """``β_i r_i r_j (k_i·k_j) exp(G_i - G_j)`` for a block row i >= column j (strictly lower on the diagonal)."""
    kk = tl.dot(ki, tl.trans(kj), input_precision=PREC)
    keep = oki[:, None] & okj[None, :]
    if DIAG:
        idx = tl.arange(0, BC)
        keep = keep & (idx[:, None] > idx[None, :])
    decay = tl.exp2(tl.where(keep, Gi[:, None] - Gj[None, :], float("-inf")))
    return kk * bri[:, None] * rj[None, :] * decay


@triton.jit
def _invert_unit_lower(L, BC: tl.constexpr):
    """``(I + L)⁻¹`` of a strictly lower-triangular BC x BC block, by forward substitution."""
    idx = tl.arange(0, BC)
    X = tl.where(idx[:, None] == idx[None, :], 1.0, 0.0)
    for i in range(1, BC):
        # rows >= i of X are still identity rows and L[i, j >= i] = 0, so row i becomes e_i - L[i, :] X
        sel = idx[:, None] == i
        l_row = tl.sum(tl.where(sel, L, 0.0), 0)
        X = X - tl.where(sel, tl.sum(l_row[:, None] * X, 0)[None, :], 0.0)
    return X


@triton.jit
def _prep_kernel(
    a_ptr, b_ptr, k_ptr, A_log_ptr, dt_bias_ptr, g_ptr, beta_ptr, Ainv_ptr, cu_ptr, chunk_seq_ptr, chunk_start_ptr,
    sa_t, sa_h, sb_t, sb_h, sk_t, sk_h, sg_h, sA_t, sA_h,
    GROUPS: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
    DOT: tl.constexpr, PREC: tl.constexpr, L2NORM: tl.constexpr,
):
    c = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // GROUPS
    seq = tl.load(chunk_seq_ptr + c)
    if seq < 0:
        return
    start = tl.load(chunk_start_ptr + c).to(tl.int64)
    length = tl.minimum(tl.load(cu_ptr + seq + 1).to(tl.int64) - start, BT)
    A_log = tl.load(A_log_ptr + hv).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + hv).to(tl.float32)
    carry = A_log * 0.0
    G0, be0, k0, r0, ok0, carry = _prep_block(a_ptr, b_ptr, k_ptr, g_ptr, beta_ptr, start, length, hv, hk, A_log, dt_bias,
                                              carry, sa_t, sa_h, sb_t, sb_h, sk_t, sk_h, sg_h, 0, K, BK, BC, DOT, L2NORM)
    G1, be1, k1, r1, ok1, carry = _prep_block(a_ptr, b_ptr, k_ptr, g_ptr, beta_ptr, start, length, hv, hk, A_log, dt_bias,
                                              carry, sa_t, sa_h, sb_t, sb_h, sk_t, sk_h, sg_h, 1, K, BK, BC, DOT, L2NORM)
    G2, be2, k2, r2, ok2, carry = _prep_block(a_ptr, b_ptr, k_ptr, g_ptr, beta_ptr, start, length, hv, hk, A_log, dt_bias,
                                              carry, sa_t, sa_h, sb_t, sb_h, sk_t, sk_h, sg_h, 2, K, BK, BC, DOT, L2NORM)
    G3, be3, k3, r3, ok3, carry = _prep_block(a_ptr, b_ptr, k_ptr, g_ptr, beta_ptr, start, length, hv, hk, A_log, dt_bias,
                                              carry, sa_t, sa_h, sb_t, sb_h, sk_t, sk_h, sg_h, 3, K, BK, BC, DOT, L2NORM)
    br0, br1, br2, br3 = be0 * r0, be1 * r1, be2 * r2, be3 * r3

    D0 = _invert_unit_lower(_l_block(k0, k0, G0, G0, br0, r0, ok0, ok0, True, BC, PREC), BC)
    D1 = _invert_unit_lower(_l_block(k1, k1, G1, G1, br1, r1, ok1, ok1, True, BC, PREC), BC)
    D2 = _invert_unit_lower(_l_block(k2, k2, G2, G2, br2, r2, ok2, ok2, True, BC, PREC), BC)
    D3 = _invert_unit_lower(_l_block(k3, k3, G3, G3, br3, r3, ok3, ok3, True, BC, PREC), BC)
    L10 = _l_block(k1, k0, G1, G0, br1, r0, ok1, ok0, False, BC, PREC)
    L20 = _l_block(k2, k0, G2, G0, br2, r0, ok2, ok0, False, BC, PREC)
    L21 = _l_block(k2, k1, G2, G1, br2, r1, ok2, ok1, False, BC, PREC)
    L30 = _l_block(k3, k0, G3, G0, br3, r0, ok3, ok0, False, BC, PREC)
    L31 = _l_block(k3, k1, G3, G1, br3, r1, ok3, ok1, False, BC, PREC)
    L32 = _l_block(k3, k2, G3, G2, br3, r2, ok3, ok2, False, BC, PREC)
    # block forward substitution: A_ij = -D_i sum_{j <= m < i} L_im A_mj  (fp32, IEEE)
    A10 = -tl.dot(D1, tl.dot(L10, D0, input_precision="ieee"), input_precision="ieee")
    A21 = -tl.dot(D2, tl.dot(L21, D1, input_precision="ieee"), input_precision="ieee")
    A32 = -tl.dot(D3, tl.dot(L32, D2, input_precision="ieee"), input_precision="ieee")
    A20 = -tl.dot(D2, tl.dot(L20, D0, input_precision="ieee") + tl.dot(L21, A10, input_precision="ieee"),
                  input_precision="ieee")
    A31 = -tl.dot(D3, tl.dot(L31, D1, input_precision="ieee") + tl.dot(L32, A21, input_precision="ieee"),
                  input_precision="ieee")
    A30 = -tl.dot(D3, tl.dot(L30, D0, input_precision="ieee") + tl.dot(L31, A10, input_precision="ieee")
                  + tl.dot(L32, A20, input_precision="ieee"), input_precision="ieee")

    idx = tl.arange(0, BC)
    base = Ainv_ptr + (start + idx)[:, None] * sA_t + hv * sA_h + idx[None, :]
    dtype = Ainv_ptr.dtype.element_ty
    row0, row1, row2, row3 = base, base + BC * sA_t, base + 2 * BC * sA_t, base + 3 * BC * sA_t
    tl.store(row0, D0.to(dtype), mask=ok0[:, None])
    tl.store(row1, A10.to(dtype), mask=ok1[:, None])
    tl.store(row1 + BC, D1.to(dtype), mask=ok1[:, None])
    tl.store(row2, A20.to(dtype), mask=ok2[:, None])
    tl.store(row2 + BC, A21.to(dtype), mask=ok2[:, None])
    tl.store(row2 + 2 * BC, D2.to(dtype), mask=ok2[:, None])
    tl.store(row3, A30.to(dtype), mask=ok3[:, None])
    tl.store(row3 + BC, A31.to(dtype), mask=ok3[:, None])
    tl.store(row3 + 2 * BC, A32.to(dtype), mask=ok3[:, None])
    tl.store(row3 + 3 * BC, D3.to(dtype), mask=ok3[:, None])


# --------------------------------------------------------------------------------------- kernel 2
@triton.jit
def _wu_kernel(
    k_ptr, v_ptr, g_ptr, beta_ptr, Ainv_ptr, w_ptr, u_ptr, cu_ptr, chunk_seq_ptr, chunk_start_ptr,
    sk_t, sk_h, sv_t, sv_h, sg_h, sA_t, sA_h, sw_t, sw_h, su_t, su_h,
    GROUPS: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    DOT: tl.constexpr, PREC: tl.constexpr, L2NORM: tl.constexpr,
):
    c = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // GROUPS
    seq = tl.load(chunk_seq_ptr + c)
    if seq < 0:
        return
    start = tl.load(chunk_start_ptr + c).to(tl.int64)
    length = tl.minimum(tl.load(cu_ptr + seq + 1).to(tl.int64) - start, BT)
    rows = tl.arange(0, BT)
    ok = rows < length
    tok = start + rows
    keep = ok[:, None] & ok[None, :] & (rows[None, :] <= rows[:, None])
    A = tl.load(Ainv_ptr + tok[:, None] * sA_t + hv * sA_h + rows[None, :], mask=keep, other=0.0).to(tl.float32)
    G = tl.load(g_ptr + hv * sg_h + tok, mask=ok, other=0.0)
    beta = tl.load(beta_ptr + hv * sg_h + tok, mask=ok, other=0.0)
    kc = tl.arange(0, BK)
    kb = tl.load(k_ptr + tok[:, None] * sk_t + hk * sk_h + kc[None, :], mask=ok[:, None] & (kc < K)[None, :], other=0.0)
    if L2NORM:
        kf = kb.to(tl.float32)
        coef = beta * tl.rsqrt(tl.sum(kf * kf, 1) + 1e-6) * tl.exp2(G)
    else:
        coef = beta * tl.exp2(G)
    w = tl.dot((A * coef[None, :]).to(DOT), kb.to(DOT), input_precision=PREC)
    tl.store(w_ptr + tok[:, None] * sw_t + hv * sw_h + kc[None, :], w.to(w_ptr.dtype.element_ty),
             mask=ok[:, None] & (kc < K)[None, :])
    vc = tl.arange(0, BV)
    vb = tl.load(v_ptr + tok[:, None] * sv_t + hv * sv_h + vc[None, :], mask=ok[:, None] & (vc < V)[None, :], other=0.0)
    u = tl.dot((A * beta[None, :]).to(DOT), vb.to(DOT), input_precision=PREC)
    tl.store(u_ptr + tok[:, None] * su_t + hv * su_h + vc[None, :], u.to(u_ptr.dtype.element_ty),
             mask=ok[:, None] & (vc < V)[None, :])


# --------------------------------------------------------------------------------------- kernel 3
@triton.jit
def _state_chunk(h, c, k_ptr, w_ptr, u_ptr, g_ptr, vn_ptr, hbuf_ptr, bos, eos, first_chunk, hv, hk, kc, vc, kmask, vmask,
                 sk_t, sk_h, sw_t, sw_h, su_t, su_h, sg_h, svn_t, svn_h, sh_c, sh_h, sh_k,
                 BT: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr, L2NORM: tl.constexpr):
    """One chunk of the sequential pass: save the incoming state, ``v' = u - w h``, advance h."""
    tl.store(hbuf_ptr + (first_chunk + c) * sh_c + hv * sh_h + kc[:, None] * sh_k + vc[None, :],
             h.to(hbuf_ptr.dtype.element_ty), mask=kmask[:, None] & vmask[None, :])
    start = bos + c * BT
    rows = tl.arange(0, BT)
    tok = start + rows
    ok = tok < eos
    wb = tl.load(w_ptr + tok[:, None] * sw_t + hv * sw_h + kc[None, :], mask=ok[:, None] & kmask[None, :], other=0.0)
    ub = tl.load(u_ptr + tok[:, None] * su_t + hv * su_h + vc[None, :], mask=ok[:, None] & vmask[None, :], other=0.0)
    kb = tl.load(k_ptr + tok[:, None] * sk_t + hk * sk_h + kc[None, :], mask=ok[:, None] & kmask[None, :], other=0.0)
    G = tl.load(g_ptr + hv * sg_h + tok, mask=ok, other=0.0)
    G_last = tl.load(g_ptr + hv * sg_h + tl.minimum(eos, start + BT) - 1)
    v_new = ub.to(tl.float32) - tl.dot(wb.to(DOT), h.to(DOT), input_precision=PREC)
    tl.store(vn_ptr + tok[:, None] * svn_t + hv * svn_h + vc[None, :], v_new.to(vn_ptr.dtype.element_ty),
             mask=ok[:, None] & vmask[None, :])
    coef = tl.where(ok, tl.exp2(G_last - G), 0.0)
    if L2NORM:
        kf = kb.to(tl.float32)
        coef = coef * tl.rsqrt(tl.sum(kf * kf, 1) + 1e-6)
    return h * tl.exp2(G_last) + tl.dot(tl.trans(kb.to(DOT)), (v_new * coef[:, None]).to(DOT), input_precision=PREC)


@triton.jit
def _state_kernel(
    k_ptr, w_ptr, u_ptr, g_ptr, vn_ptr, hbuf_ptr, state_ptr, cu_ptr, slots_ptr, init_ptr, offsets_ptr,
    sk_t, sk_h, sw_t, sw_h, su_t, su_h, sg_h, svn_t, svn_h, sh_c, sh_h, sh_k,
    ss_slot, ss_h, ss_k, ss_v,
    HV: tl.constexpr, GROUPS: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    BT: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr, L2NORM: tl.constexpr, HAS_INIT: tl.constexpr,
    USE_WHILE: tl.constexpr, STAGES: tl.constexpr,
):
    n = tl.program_id(1) // HV
    hv = tl.program_id(1) % HV
    hk = hv // GROUPS
    kc = tl.arange(0, BK)
    vc = tl.program_id(0) * BV + tl.arange(0, BV)
    kmask = kc < K
    vmask = vc < V
    bos = tl.load(cu_ptr + n).to(tl.int64)
    eos = tl.load(cu_ptr + n + 1).to(tl.int64)
    first_chunk = tl.load(offsets_ptr + n).to(tl.int64)
    slot = tl.load(slots_ptr + n).to(tl.int64)
    tile = state_ptr + slot * ss_slot + hv * ss_h + kc[:, None] * ss_k + vc[None, :] * ss_v
    tile_mask = kmask[:, None] & vmask[None, :]
    if HAS_INIT:
        read = (slot >= 0) & (tl.load(init_ptr + n) != 0)
        h = tl.load(tile, mask=tile_mask & read, other=0.0).to(tl.float32)
    else:
        h = tl.zeros([BK, BV], dtype=tl.float32)
    num_chunks = tl.cdiv(eos - bos, BT).to(tl.int32)
    if USE_WHILE:  # the CPU interpreter (see _triton_common)
        c = 0
        while c < num_chunks:
            h = _state_chunk(h, c, k_ptr, w_ptr, u_ptr, g_ptr, vn_ptr, hbuf_ptr, bos, eos, first_chunk, hv, hk, kc, vc,
                             kmask, vmask, sk_t, sk_h, sw_t, sw_h, su_t, su_h, sg_h, svn_t, svn_h, sh_c, sh_h, sh_k,
                             BT, DOT, PREC, L2NORM)
            c += 1
    else:
        for c in tl.range(0, num_chunks, num_stages=STAGES):
            h = _state_chunk(h, c, k_ptr, w_ptr, u_ptr, g_ptr, vn_ptr, hbuf_ptr, bos, eos, first_chunk, hv, hk, kc, vc,
                             kmask, vmask, sk_t, sk_h, sw_t, sw_h, su_t, su_h, sg_h, svn_t, svn_h, sh_c, sh_h, sh_k,
                             BT, DOT, PREC, L2NORM)
    tl.store(tile, h.to(state_ptr.dtype.element_ty), mask=tile_mask & (slot >= 0))


# --------------------------------------------------------------------------------------- kernel 4
@triton.jit
def _out_kernel(
    q_ptr, k_ptr, g_ptr, vn_ptr, hbuf_ptr, o_ptr, cu_ptr, chunk_seq_ptr, chunk_start_ptr,
    sq_t, sq_h, sk_t, sk_h, sg_h, svn_t, svn_h, sh_c, sh_h, sh_k, so_t, so_h, scale,
    GROUPS: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    DOT: tl.constexpr, PREC: tl.constexpr, L2NORM: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    hk = hv // GROUPS
    seq = tl.load(chunk_seq_ptr + c)
    if seq < 0:
        return
    start = tl.load(chunk_start_ptr + c).to(tl.int64)
    length = tl.minimum(tl.load(cu_ptr + seq + 1).to(tl.int64) - start, BT)
    rows = tl.arange(0, BT)
    ok = rows < length
    tok = start + rows
    kc = tl.arange(0, BK)
    vc = tl.program_id(2) * BV + tl.arange(0, BV)
    kmask = kc < K
    vmask = vc < V
    qb = tl.load(q_ptr + tok[:, None] * sq_t + hk * sq_h + kc[None, :], mask=ok[:, None] & kmask[None, :], other=0.0)
    kb = tl.load(k_ptr + tok[:, None] * sk_t + hk * sk_h + kc[None, :], mask=ok[:, None] & kmask[None, :], other=0.0)
    G = tl.load(g_ptr + hv * sg_h + tok, mask=ok, other=0.0)
    if L2NORM:
        qf = qb.to(tl.float32)
        kf = kb.to(tl.float32)
        rq = tl.rsqrt(tl.sum(qf * qf, 1) + 1e-6) * scale
        rk = tl.rsqrt(tl.sum(kf * kf, 1) + 1e-6)
    else:
        rq = tl.full([BT], 1.0, tl.float32) * scale
        rk = tl.full([BT], 1.0, tl.float32)
    causal = ok[:, None] & ok[None, :] & (rows[None, :] <= rows[:, None])
    decay = tl.exp2(tl.where(causal, G[:, None] - G[None, :], float("-inf")))
    qk = tl.dot(qb.to(DOT), tl.trans(kb.to(DOT)), input_precision=PREC) * (rq[:, None] * rk[None, :]) * decay
    hb = tl.load(hbuf_ptr + c * sh_c + hv * sh_h + kc[:, None] * sh_k + vc[None, :],
                 mask=kmask[:, None] & vmask[None, :], other=0.0)
    vn = tl.load(vn_ptr + tok[:, None] * svn_t + hv * svn_h + vc[None, :], mask=ok[:, None] & vmask[None, :], other=0.0)
    o = tl.dot(qb.to(DOT), hb.to(DOT), input_precision=PREC) * (rq * tl.exp2(G))[:, None]
    o += tl.dot(qk.to(DOT), vn.to(DOT), input_precision=PREC)
    tl.store(o_ptr + tok[:, None] * so_t + hv * so_h + vc[None, :], o.to(o_ptr.dtype.element_ty),
             mask=ok[:, None] & vmask[None, :])


# --------------------------------------------------------------------------------------- host
def chunk_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, ssm_state, cu_seqlens, slots, has_initial_state=None, *,
                           scale=None, state_layout=K_MAJOR, use_qk_l2norm=True, config=None):
    check_gdn_shapes("chunk_gated_delta_rule", q, k, v, a, b, A_log, dt_bias, ssm_state, state_layout)
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    N = slots.shape[0]
    if cu_seqlens.shape != (N + 1,):
        raise ValueError(f"chunk_gated_delta_rule: cu_seqlens must be [N+1] = [{N + 1}], got {tuple(cu_seqlens.shape)}")
    out = torch.zeros(T, HV, V, dtype=v.dtype, device=v.device)
    if T == 0 or N == 0:
        return out
    cfg = config or CONFIGS[shape_class(N, HV)]
    scale = default_scale(K, scale)
    dev = v.device
    work = v.dtype if v.dtype != torch.float32 else torch.float32  # dtype of the intermediates
    chunk_seq, chunk_start, chunk_offsets = chunk_map(cu_seqlens, T, BT)
    NT = chunk_seq.numel()
    G = torch.empty(HV, T, dtype=torch.float32, device=dev)
    beta = torch.empty(HV, T, dtype=torch.float32, device=dev)
    Ainv = torch.empty(T, HV, BT, dtype=work, device=dev)
    w = torch.empty(T, HV, K, dtype=work, device=dev)
    u = torch.empty(T, HV, V, dtype=work, device=dev)
    v_new = torch.empty(T, HV, V, dtype=work, device=dev)
    hbuf = torch.empty(NT, HV, K, V, dtype=work, device=dev)
    DOT, PREC = dot_dtype(work), dot_precision(work)
    BK, BVF = triton.next_power_of_2(K), triton.next_power_of_2(V)
    groups = HV // H
    l2 = bool(use_qk_l2norm)

    _prep_kernel[(NT, HV)](
        a, b, k, A_log, dt_bias, G, beta, Ainv, cu_seqlens, chunk_seq, chunk_start,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), k.stride(0), k.stride(1), G.stride(0),
        Ainv.stride(0), Ainv.stride(1),
        GROUPS=groups, K=K, BK=BK, BT=BT, BC=BC, DOT=DOT, PREC=PREC, L2NORM=l2, num_warps=cfg["prep_warps"],
    )
    _wu_kernel[(NT, HV)](
        k, v, G, beta, Ainv, w, u, cu_seqlens, chunk_seq, chunk_start,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), G.stride(0), Ainv.stride(0), Ainv.stride(1),
        w.stride(0), w.stride(1), u.stride(0), u.stride(1),
        GROUPS=groups, K=K, V=V, BK=BK, BV=BVF, BT=BT, DOT=DOT, PREC=PREC, L2NORM=l2, num_warps=cfg["wu_warps"],
    )
    ss_slot, ss_h, ss_k, ss_v = state_strides(ssm_state, state_layout)
    bv = min(cfg["state_BV"], BVF)
    init = has_initial_state if has_initial_state is not None else slots
    _state_kernel[(triton.cdiv(V, bv), N * HV)](
        k, w, u, G, v_new, hbuf, ssm_state, cu_seqlens, slots, init, chunk_offsets,
        k.stride(0), k.stride(1), w.stride(0), w.stride(1), u.stride(0), u.stride(1), G.stride(0),
        v_new.stride(0), v_new.stride(1), hbuf.stride(0), hbuf.stride(1), hbuf.stride(2),
        ss_slot, ss_h, ss_k, ss_v,
        HV=HV, GROUPS=groups, K=K, V=V, BK=BK, BV=bv, BT=BT, DOT=DOT, PREC=PREC, L2NORM=l2,
        HAS_INIT=has_initial_state is not None, USE_WHILE=use_while(), STAGES=cfg["state_stages"],
        num_warps=cfg["state_warps"],
    )
    bvo = min(cfg["out_BV"], BVF)
    _out_kernel[(NT, HV, triton.cdiv(V, bvo))](
        q, k, G, v_new, hbuf, out, cu_seqlens, chunk_seq, chunk_start,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), G.stride(0), v_new.stride(0), v_new.stride(1),
        hbuf.stride(0), hbuf.stride(1), hbuf.stride(2), out.stride(0), out.stride(1), scale,
        GROUPS=groups, K=K, V=V, BK=BK, BV=bvo, BT=BT, DOT=DOT, PREC=PREC, L2NORM=l2, num_warps=cfg["out_warps"],
    )
    return out

