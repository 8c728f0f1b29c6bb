"""The first version of the GDN prefill's intra-chunk work, kept selectable (``config["intra"] = "split"``)
so the bench compares it with the fused kernel of :mod:`.triton` in one run.

``_prep_kernel`` (chunk, value head): gating, cumulative log2-decay ``G``, β and the WY inverse
``A = (I + L)⁻¹`` from the ten 16x16 blocks of L computed over the whole key dim at once, the diagonal
blocks inverted by forward substitution, stored to ``Ainv``; ``_wu_kernel`` (chunk, value head) reads it
back for ``w = A (β e^G k̂)``, ``u = A (β v)``.  On an H200 (2026-11-30) these took 1009 + 458 µs at
8x4096 tokens (H=16, HV=32, K=V=128), 2.8x and 1.3x flash-linear-attention's equivalents.
"""

from __future__ import annotations

import triton
import triton.language as tl

from atom_kernels.ops._triton_common import chunk_span, gdn_gate


@triton.jit
def _gate_block(a_ptr, b_ptr, g_ptr, start, length, hv, A_log, dt_bias, carry, sa_t, sa_h, sb_t, sb_h, sg_h,
                j: tl.constexpr, BC: tl.constexpr):
    """Sub-block j (16 tokens) of a chunk: β and the cumulative log2-decay G (stored for the later kernels),
    the tokens and which of them are in the sequence."""
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
    return G, beta, tok, ok, carry + tl.sum(g, 0)


@triton.jit
def _prep_block(a_ptr, b_ptr, k_ptr, g_ptr, beta_ptr, start, length, hv, hk, A_log, dt_bias, carry,
                sa_t, sa_h, sb_t, sb_h, sk_t, sk_h, sg_h,
                j: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr,
                DOT: tl.constexpr, L2NORM: tl.constexpr):
    """Sub-block j (16 tokens) of a chunk: its cumulative log2-decay, β, raw k and k's inverse norms."""
    G, beta, tok, ok, carry = _gate_block(a_ptr, b_ptr, g_ptr, start, length, hv, A_log, dt_bias, carry,
                                          sa_t, sa_h, sb_t, sb_h, sg_h, j, BC)
    tl.store(beta_ptr + hv * sg_h + tok, beta, mask=ok)
    cols = tl.arange(0, BK)
    kb = tl.load(k_ptr + tok[:, None] * sk_t + hk * sk_h + cols[None, :], mask=ok[:, None] & (cols < K)[None, :], other=0.0)
    if L2NORM:
        kf = kb.to(tl.float32)
        r = tl.rsqrt(tl.sum(kf * kf, 1) + 1e-6)
    else:
        r = tl.full([BC], 1.0, tl.float32)
    return G, beta, kb.to(DOT), r, ok, carry


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
    seq, start, length = chunk_span(c, chunk_seq_ptr, chunk_start_ptr, cu_ptr, BT)
    if seq < 0:
        return
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
    seq, start, length = chunk_span(c, chunk_seq_ptr, chunk_start_ptr, cu_ptr, BT)
    if seq < 0:
        return
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
