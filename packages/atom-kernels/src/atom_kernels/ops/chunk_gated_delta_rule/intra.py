"""GDN prefill, stage 1 (``_intra``, one program per chunk and value head): everything inside one chunk.

Gating, the cumulative log-decay ``G`` within the chunk (stored in log2 units), β; the ten 16x16 blocks of
``L = tril₋₁(β k̂ k̂ᵀ ⊙ exp(Gᵢ - Gⱼ))`` from raw k, accumulated over slices of the key dim (the L2 norms folded in
as row/column scales); the WY inverse ``A = (I + L)⁻¹`` as four 16x16 diagonal inverses (forward substitution, or the
product form ``(I - L)(I + L²)(I + L⁴)(I + L⁸)``) merged by block products; then ``w = A (β e^G k̂)`` and
``u = A (β v)``. ``config["intra"]``: ``"fused"`` keeps A in registers and computes w/u in the same kernel (fastest
where there are many (sequence, head) pairs); ``"solve"`` stores A and runs ``_wu_kernel`` for more parallelism
(fastest where there are few).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.dispatch import triton_interpreting
from atom_kernels.ops._triton_common import chunk_span, gdn_gate

BT = 64  # chunk
BC = 16  # sub-block of the WY inverse


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
def _tile(ptr, tok, ok, head_off, s_t, cols, N: tl.constexpr):
    """Rows ``tok`` (those ``ok``), columns ``cols`` (< N) of a [T, heads, N] tensor; zeros elsewhere."""
    return tl.load(ptr + tok[:, None] * s_t + head_off + cols[None, :], mask=ok[:, None] & (cols < N)[None, :],
                   other=0.0)


@triton.jit
def _store_tile(ptr, tok, ok, head_off, s_t, cols, N: tl.constexpr, x):
    tl.store(ptr + tok[:, None] * s_t + head_off + cols[None, :], x.to(ptr.dtype.element_ty),
             mask=ok[:, None] & (cols < N)[None, :])


@triton.jit
def _decayed(S, Gi, Gj, bri, rj, oki, okj, DIAG: tl.constexpr, BC: tl.constexpr):
    """Block (i, j) of L from raw ``S = k_i k_jᵀ``: ``β_i r_i r_j S exp2(G_i - G_j)``, strictly lower on the diagonal."""
    keep = oki[:, None] & okj[None, :]
    if DIAG:
        idx = tl.arange(0, BC)
        keep = keep & (idx[:, None] > idx[None, :])
    return S * bri[:, None] * rj[None, :] * tl.exp2(tl.where(keep, Gi[:, None] - Gj[None, :], float("-inf")))


@triton.jit
def _decayed_t(S, G, br, r, ok, BC: tl.constexpr):
    """The transpose of diagonal block ``_decayed(S, G, G, br, r, ok, ok, True)``, built from the same symmetric S."""
    idx = tl.arange(0, BC)
    keep = ok[:, None] & ok[None, :] & (idx[None, :] > idx[:, None])
    return S * r[:, None] * br[None, :] * tl.exp2(tl.where(keep, G[None, :] - G[:, None], float("-inf")))


@triton.jit
def _invert4_subst(L0, L1, L2, L3, T0, T1, T2, T3, BC: tl.constexpr):
    """``(I + L)⁻¹`` of four strictly lower-triangular BC x BC blocks by forward substitution, the four in one
    unrolled loop so their dependency chains interleave.

    ``X = (I + L)⁻¹ - I`` starts as ``-L`` (already exact in rows 0 and 1); row i then gains
    ``-Σ_j L[i, j] X[j, :]`` over the finished rows j < i (``L[i, j >= i] = 0``).  ``T = Lᵀ``: row i of L
    is read as column i of T, which lays it along dim 0 as the product needs it, with no layout change.
    """
    idx = tl.arange(0, BC)
    X0, X1, X2, X3 = -L0, -L1, -L2, -L3
    for i in tl.static_range(2, BC):
        col = idx[None, :] == i
        row = idx[:, None] == i
        a0 = tl.sum(tl.where(col, T0, 0.0), 1)
        a1 = tl.sum(tl.where(col, T1, 0.0), 1)
        a2 = tl.sum(tl.where(col, T2, 0.0), 1)
        a3 = tl.sum(tl.where(col, T3, 0.0), 1)
        X0 = X0 - tl.where(row, tl.sum(a0[:, None] * X0, 0)[None, :], 0.0)
        X1 = X1 - tl.where(row, tl.sum(a1[:, None] * X1, 0)[None, :], 0.0)
        X2 = X2 - tl.where(row, tl.sum(a2[:, None] * X2, 0)[None, :], 0.0)
        X3 = X3 - tl.where(row, tl.sum(a3[:, None] * X3, 0)[None, :], 0.0)
    eye = tl.where(idx[:, None] == idx[None, :], 1.0, 0.0)
    return X0 + eye, X1 + eye, X2 + eye, X3 + eye


@triton.jit
def _invert_double(L, BC: tl.constexpr, PREC: tl.constexpr):
    """``(I + L)⁻¹ = (I - L)(I + L²)(I + L⁴)(I + L⁸)`` of a strictly lower-triangular 16x16 block (``L¹⁶ = 0``):
    six dots and no reductions."""
    tl.static_assert(BC == 16)
    idx = tl.arange(0, BC)
    L2 = tl.dot(L, L, input_precision=PREC)
    L4 = tl.dot(L2, L2, input_precision=PREC)
    L8 = tl.dot(L4, L4, input_precision=PREC)
    P = tl.where(idx[:, None] == idx[None, :], 1.0, 0.0) - L
    P = tl.dot(P, L2, P, input_precision=PREC)
    P = tl.dot(P, L4, P, input_precision=PREC)
    return tl.dot(P, L8, P, input_precision=PREC)


@triton.jit
def _merge(D0, D1, D2, D3, L10, L20, L21, L30, L31, L32, PREC: tl.constexpr):
    """Off-diagonal blocks of the inverse by block forward substitution: ``A_ij = -D_i Σ_{j <= m < i} L_im A_mj``."""
    A10 = -tl.dot(D1, tl.dot(L10, D0, input_precision=PREC), input_precision=PREC)
    A21 = -tl.dot(D2, tl.dot(L21, D1, input_precision=PREC), input_precision=PREC)
    A32 = -tl.dot(D3, tl.dot(L32, D2, input_precision=PREC), input_precision=PREC)
    A20 = -tl.dot(D2, tl.dot(L21, A10, tl.dot(L20, D0, input_precision=PREC), input_precision=PREC),
                  input_precision=PREC)
    A31 = -tl.dot(D3, tl.dot(L32, A21, tl.dot(L31, D1, input_precision=PREC), input_precision=PREC),
                  input_precision=PREC)
    A30 = -tl.dot(D3, tl.dot(L32, A20, tl.dot(L31, A10, tl.dot(L30, D0, input_precision=PREC), input_precision=PREC),
                             input_precision=PREC), input_precision=PREC)
    return A10, A20, A21, A30, A31, A32


@triton.jit
def _lower_apply(x_ptr, y_ptr, t0, t1, t2, t3, ok0, ok1, ok2, ok3, x_off, sx_t, y_off, sy_t,
                 B00, B10, B11, B20, B21, B22, B30, B31, B32, B33,
                 N: tl.constexpr, BN: tl.constexpr, PREC: tl.constexpr, DOT: tl.constexpr):
    """``y = B x`` for the chunk's 64 rows: B block lower-triangular (16x16 blocks, DOT dtype), x and y
    [T, heads, N] tensors, over N in slices of BN columns."""
    for ns in range(0, N, BN):
        # row block by row block, each stored before the next, so one accumulator is live at a time
        cols = ns + tl.arange(0, BN)
        x0 = _tile(x_ptr, t0, ok0, x_off, sx_t, cols, N).to(DOT)
        _store_tile(y_ptr, t0, ok0, y_off, sy_t, cols, N, tl.dot(B00, x0, input_precision=PREC))
        x1 = _tile(x_ptr, t1, ok1, x_off, sx_t, cols, N).to(DOT)
        y = tl.dot(B10, x0, input_precision=PREC)
        _store_tile(y_ptr, t1, ok1, y_off, sy_t, cols, N, tl.dot(B11, x1, y, input_precision=PREC))
        x2 = _tile(x_ptr, t2, ok2, x_off, sx_t, cols, N).to(DOT)
        y = tl.dot(B21, x1, tl.dot(B20, x0, input_precision=PREC), input_precision=PREC)
        _store_tile(y_ptr, t2, ok2, y_off, sy_t, cols, N, tl.dot(B22, x2, y, input_precision=PREC))
        x3 = _tile(x_ptr, t3, ok3, x_off, sx_t, cols, N).to(DOT)
        y = tl.dot(B31, x1, tl.dot(B30, x0, input_precision=PREC), input_precision=PREC)
        y = tl.dot(B32, x2, y, input_precision=PREC)
        _store_tile(y_ptr, t3, ok3, y_off, sy_t, cols, N, tl.dot(B33, x3, y, input_precision=PREC))


@triton.jit
def _intra_kernel(
    a_ptr, b_ptr, k_ptr, v_ptr, A_log_ptr, dt_bias_ptr, g_ptr, beta_ptr, Ainv_ptr, w_ptr, u_ptr,
    cu_ptr, chunk_seq_ptr, chunk_start_ptr,
    sa_t, sa_h, sb_t, sb_h, sk_t, sk_h, sv_t, sv_h, sg_h, sA_t, sA_h, sw_t, sw_h, su_t, su_h,
    GROUPS: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    BT: tl.constexpr, BC: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr, INV_PREC: tl.constexpr,
    DOUBLE_PREC: tl.constexpr, L2NORM: tl.constexpr, SUBST: tl.constexpr, FUSE_WU: tl.constexpr,
):
    tl.static_assert(BT == 4 * BC)
    c = tl.program_id(0)
    hv = tl.program_id(1)
    hk = hv // GROUPS
    seq, start, length = chunk_span(c, chunk_seq_ptr, chunk_start_ptr, cu_ptr, BT)
    if seq < 0:
        return
    A_log = tl.load(A_log_ptr + hv).to(tl.float32)
    dt_bias = tl.load(dt_bias_ptr + hv).to(tl.float32)
    carry = A_log * 0.0
    G0, be0, t0, ok0, carry = _gate_block(a_ptr, b_ptr, g_ptr, start, length, hv, A_log, dt_bias, carry,
                                          sa_t, sa_h, sb_t, sb_h, sg_h, 0, BC)
    G1, be1, t1, ok1, carry = _gate_block(a_ptr, b_ptr, g_ptr, start, length, hv, A_log, dt_bias, carry,
                                          sa_t, sa_h, sb_t, sb_h, sg_h, 1, BC)
    G2, be2, t2, ok2, carry = _gate_block(a_ptr, b_ptr, g_ptr, start, length, hv, A_log, dt_bias, carry,
                                          sa_t, sa_h, sb_t, sb_h, sg_h, 2, BC)
    G3, be3, t3, ok3, carry = _gate_block(a_ptr, b_ptr, g_ptr, start, length, hv, A_log, dt_bias, carry,
                                          sa_t, sa_h, sb_t, sb_h, sg_h, 3, BC)

    # raw k_i k_jᵀ (the ten blocks i >= j) and the keys' squared norms, over the key dim in slices of BK
    S00 = tl.zeros([BC, BC], dtype=tl.float32)
    S10 = tl.zeros([BC, BC], dtype=tl.float32)
    S11 = tl.zeros([BC, BC], dtype=tl.float32)
    S20 = tl.zeros([BC, BC], dtype=tl.float32)
    S21 = tl.zeros([BC, BC], dtype=tl.float32)
    S22 = tl.zeros([BC, BC], dtype=tl.float32)
    S30 = tl.zeros([BC, BC], dtype=tl.float32)
    S31 = tl.zeros([BC, BC], dtype=tl.float32)
    S32 = tl.zeros([BC, BC], dtype=tl.float32)
    S33 = tl.zeros([BC, BC], dtype=tl.float32)
    n0 = tl.zeros([BC], dtype=tl.float32)
    n1 = tl.zeros([BC], dtype=tl.float32)
    n2 = tl.zeros([BC], dtype=tl.float32)
    n3 = tl.zeros([BC], dtype=tl.float32)
    k_off = hk * sk_h
    for ks in range(0, K, BK):
        cols = ks + tl.arange(0, BK)
        k0 = _tile(k_ptr, t0, ok0, k_off, sk_t, cols, K)
        k1 = _tile(k_ptr, t1, ok1, k_off, sk_t, cols, K)
        k2 = _tile(k_ptr, t2, ok2, k_off, sk_t, cols, K)
        k3 = _tile(k_ptr, t3, ok3, k_off, sk_t, cols, K)
        if L2NORM:
            n0 += tl.sum(k0.to(tl.float32) * k0.to(tl.float32), 1)
            n1 += tl.sum(k1.to(tl.float32) * k1.to(tl.float32), 1)
            n2 += tl.sum(k2.to(tl.float32) * k2.to(tl.float32), 1)
            n3 += tl.sum(k3.to(tl.float32) * k3.to(tl.float32), 1)
        k0, k1, k2, k3 = k0.to(DOT), k1.to(DOT), k2.to(DOT), k3.to(DOT)
        S00 = tl.dot(k0, tl.trans(k0), S00, input_precision=PREC)
        S10 = tl.dot(k1, tl.trans(k0), S10, input_precision=PREC)
        S11 = tl.dot(k1, tl.trans(k1), S11, input_precision=PREC)
        S20 = tl.dot(k2, tl.trans(k0), S20, input_precision=PREC)
        S21 = tl.dot(k2, tl.trans(k1), S21, input_precision=PREC)
        S22 = tl.dot(k2, tl.trans(k2), S22, input_precision=PREC)
        S30 = tl.dot(k3, tl.trans(k0), S30, input_precision=PREC)
        S31 = tl.dot(k3, tl.trans(k1), S31, input_precision=PREC)
        S32 = tl.dot(k3, tl.trans(k2), S32, input_precision=PREC)
        S33 = tl.dot(k3, tl.trans(k3), S33, input_precision=PREC)
    if L2NORM:
        r0, r1, r2, r3 = tl.rsqrt(n0 + 1e-6), tl.rsqrt(n1 + 1e-6), tl.rsqrt(n2 + 1e-6), tl.rsqrt(n3 + 1e-6)
    else:
        r0 = tl.full([BC], 1.0, tl.float32)
        r1, r2, r3 = r0, r0, r0
    br0, br1, br2, br3 = be0 * r0, be1 * r1, be2 * r2, be3 * r3

    L00 = _decayed(S00, G0, G0, br0, r0, ok0, ok0, True, BC)
    L11 = _decayed(S11, G1, G1, br1, r1, ok1, ok1, True, BC)
    L22 = _decayed(S22, G2, G2, br2, r2, ok2, ok2, True, BC)
    L33 = _decayed(S33, G3, G3, br3, r3, ok3, ok3, True, BC)
    if SUBST:
        D0, D1, D2, D3 = _invert4_subst(L00, L11, L22, L33, _decayed_t(S00, G0, br0, r0, ok0, BC),
                                        _decayed_t(S11, G1, br1, r1, ok1, BC), _decayed_t(S22, G2, br2, r2, ok2, BC),
                                        _decayed_t(S33, G3, br3, r3, ok3, BC), BC)
    else:
        D0 = _invert_double(L00, BC, DOUBLE_PREC)
        D1 = _invert_double(L11, BC, DOUBLE_PREC)
        D2 = _invert_double(L22, BC, DOUBLE_PREC)
        D3 = _invert_double(L33, BC, DOUBLE_PREC)
    A10, A20, A21, A30, A31, A32 = _merge(
        D0, D1, D2, D3,
        _decayed(S10, G1, G0, br1, r0, ok1, ok0, False, BC), _decayed(S20, G2, G0, br2, r0, ok2, ok0, False, BC),
        _decayed(S21, G2, G1, br2, r1, ok2, ok1, False, BC), _decayed(S30, G3, G0, br3, r0, ok3, ok0, False, BC),
        _decayed(S31, G3, G1, br3, r1, ok3, ok1, False, BC), _decayed(S32, G3, G2, br3, r2, ok3, ok2, False, BC),
        INV_PREC)

    if FUSE_WU:
        # u = A (β v): β scales A's columns;  w = A (β e^G k̂): so do β r e^G (rows of masked tokens are zero)
        _lower_apply(v_ptr, u_ptr, t0, t1, t2, t3, ok0, ok1, ok2, ok3, hv * sv_h, sv_t, hv * su_h, su_t,
                     (D0 * be0[None, :]).to(DOT), (A10 * be0[None, :]).to(DOT), (D1 * be1[None, :]).to(DOT),
                     (A20 * be0[None, :]).to(DOT), (A21 * be1[None, :]).to(DOT), (D2 * be2[None, :]).to(DOT),
                     (A30 * be0[None, :]).to(DOT), (A31 * be1[None, :]).to(DOT), (A32 * be2[None, :]).to(DOT),
                     (D3 * be3[None, :]).to(DOT), V, BV, PREC, DOT)
        c0, c1, c2, c3 = br0 * tl.exp2(G0), br1 * tl.exp2(G1), br2 * tl.exp2(G2), br3 * tl.exp2(G3)
        _lower_apply(k_ptr, w_ptr, t0, t1, t2, t3, ok0, ok1, ok2, ok3, k_off, sk_t, hv * sw_h, sw_t,
                     (D0 * c0[None, :]).to(DOT), (A10 * c0[None, :]).to(DOT), (D1 * c1[None, :]).to(DOT),
                     (A20 * c0[None, :]).to(DOT), (A21 * c1[None, :]).to(DOT), (D2 * c2[None, :]).to(DOT),
                     (A30 * c0[None, :]).to(DOT), (A31 * c1[None, :]).to(DOT), (A32 * c2[None, :]).to(DOT),
                     (D3 * c3[None, :]).to(DOT), K, BK, PREC, DOT)
    else:
        # the layout _wu_kernel reads: A row-major per token [T, HV, 64] (lower triangle), β [HV, T]
        idx = tl.arange(0, BC)
        tl.store(beta_ptr + hv * sg_h + t0, be0, mask=ok0)
        tl.store(beta_ptr + hv * sg_h + t1, be1, mask=ok1)
        tl.store(beta_ptr + hv * sg_h + t2, be2, mask=ok2)
        tl.store(beta_ptr + hv * sg_h + t3, be3, mask=ok3)
        a_off = hv * sA_h
        _store_tile(Ainv_ptr, t0, ok0, a_off, sA_t, idx, BT, D0)
        _store_tile(Ainv_ptr, t1, ok1, a_off, sA_t, idx, BT, A10)
        _store_tile(Ainv_ptr, t1, ok1, a_off, sA_t, BC + idx, BT, D1)
        _store_tile(Ainv_ptr, t2, ok2, a_off, sA_t, idx, BT, A20)
        _store_tile(Ainv_ptr, t2, ok2, a_off, sA_t, BC + idx, BT, A21)
        _store_tile(Ainv_ptr, t2, ok2, a_off, sA_t, 2 * BC + idx, BT, D2)
        _store_tile(Ainv_ptr, t3, ok3, a_off, sA_t, idx, BT, A30)
        _store_tile(Ainv_ptr, t3, ok3, a_off, sA_t, BC + idx, BT, A31)
        _store_tile(Ainv_ptr, t3, ok3, a_off, sA_t, 2 * BC + idx, BT, A32)
        _store_tile(Ainv_ptr, t3, ok3, a_off, sA_t, 3 * BC + idx, BT, D3)


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


def _inverse_precisions(work: torch.dtype, cfg: dict) -> tuple[str, str]:
    """``tl.dot`` precisions of (the block merges, the product-form diagonal inverses).

    fp32 inputs keep both in IEEE fp32 (the fp32 tests compare at 2e-5).  bf16/fp16 inputs take the
    configured merge precision (tf32, as flash-linear-attention: w/u go to memory in bf16 anyway; emulated
    on correlated keys the error of w stays <= 1.5e-3, below bf16's own rounding of A).  The product form
    never runs in plain tf32: its powers of L cancel, and emulation on strongly correlated keys (as SiLU'd
    keys are) gave errors up to 0.45 in w; tf32x3 (three tf32 products, ~fp32) keeps it near 1e-4.
    """
    if work == torch.float32 or triton_interpreting():
        return "ieee", "ieee"
    merge = cfg["inv_prec"]
    return merge, ("tf32x3" if merge == "tf32" else merge)


def _intra(q, k, v, a, b, A_log, dt_bias, cu_seqlens, chunk_seq, chunk_start, G, w, u, cfg, work, DOT, PREC, l2):
    """Kernel 1 in the configured mode: fills G [HV, T], w [T, HV, K], u [T, HV, V]."""
    T, HV = v.shape[0], v.shape[1]
    K, V = k.shape[2], v.shape[2]
    NT = chunk_seq.numel()
    groups = HV // k.shape[1]
    BK, BVF = triton.next_power_of_2(K), triton.next_power_of_2(V)
    mode = cfg["intra"]
    if mode == "fused":
        beta, Ainv = G, w  # unused: the kernel keeps β and A in registers
    else:
        beta = torch.empty(G.shape, dtype=torch.float32, device=v.device)  # G's padded rows (sg_h)
        Ainv = torch.empty(T, HV, BT, dtype=work, device=v.device)
    merge_prec, double_prec = _inverse_precisions(work, cfg)
    _intra_kernel[(NT, HV)](
        a, b, k, v, A_log, dt_bias, G, beta, Ainv, w, u, cu_seqlens, chunk_seq, chunk_start,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        G.stride(0), Ainv.stride(0), Ainv.stride(1), w.stride(0), w.stride(1), u.stride(0), u.stride(1),
        GROUPS=groups, K=K, V=V, BK=min(cfg["intra_BK"], BK), BV=min(cfg["intra_BK"], BVF), BT=BT, BC=BC, DOT=DOT,
        PREC=PREC, INV_PREC=merge_prec, DOUBLE_PREC=double_prec, L2NORM=l2, SUBST=cfg["inverse"] == "subst",
        FUSE_WU=mode == "fused", num_warps=cfg["intra_warps"],
    )
    if mode != "fused":
        _wu_kernel[(NT, HV)](
            k, v, G, beta, Ainv, w, u, cu_seqlens, chunk_seq, chunk_start,
            k.stride(0), k.stride(1), v.stride(0), v.stride(1), G.stride(0), Ainv.stride(0), Ainv.stride(1),
            w.stride(0), w.stride(1), u.stride(0), u.stride(1),
            GROUPS=groups, K=K, V=V, BK=BK, BV=BVF, BT=BT, DOT=DOT, PREC=PREC, L2NORM=l2, num_warps=cfg["wu_warps"],
        )
