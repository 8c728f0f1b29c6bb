"""Triton GDN prefill: three kernels over chunks of 64 tokens.

1. ``_intra`` (chunk, value head): everything inside one chunk.  Gating, the cumulative log-decay ``G``
   within the chunk (stored in log2 units), β; the ten 16x16 blocks of
   ``L = tril₋₁(β k̂ k̂ᵀ ⊙ exp(Gᵢ - Gⱼ))`` from raw k, accumulated over slices of the key dim (the L2
   norms are folded in as row/column scales); the WY inverse ``A = (I + L)⁻¹`` as four 16x16 diagonal
   inverses (forward substitution, or the product form ``(I - L)(I + L²)(I + L⁴)(I + L⁸)``) merged by
   block products; then, still in registers, ``w = A (β e^G k̂)`` and ``u = A (β v)``.  A never goes to
   memory.  (``config["intra"]``: ``"fused"``; ``"solve"`` stores A and runs the separate ``_wu_kernel``;
   ``"split"`` is the first version, see :mod:`._split`.)
2. ``_state`` (sequence x value head x V block, one grid axis): the sequential pass; per chunk it saves the incoming
   state h for the output kernel, ``v' = u - w h`` and ``h = e^{G_last} h + k̂ᵀ (e^{G_last - G} v')``.
   Reads each sequence's initial state from its slot and writes the final one back.
3. ``_out``   (chunk, value head, V block): ``o = scale (e^G (q̂ h) + (q̂ k̂ᵀ ⊙ Γ ⊙ causal) v')``.  The
   spare programs of its grid (see ``_varlen``) zero the tokens past ``cu_seqlens[-1]``, so the output
   needs no fill.

q̂/k̂ never materialise: the dots take raw q/k (bf16 on the GPU) and the inverse norms scale rows or
columns of the fp32 results.  Chunks of packed sequences are located without a host sync (see
``_varlen``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.dispatch import triton_interpreting
from atom_kernels.gdn import K_MAJOR, check_gdn_shapes, default_scale, state_strides
from atom_kernels.ops._triton_common import chunk_span, dot_dtype, dot_precision, use_while
from atom_kernels.ops._varlen import chunk_map
from atom_kernels.ops.chunk_gated_delta_rule._split import _gate_block, _prep_kernel, _wu_kernel

BT = 64  # chunk
BC = 16  # sub-block of the WY inverse
MAX_HEAD_DIM = 256
INTRA_MODES = ("fused", "solve", "split")
INVERSES = ("subst", "double")

# Launch configs by shape class; "few" = fewer than 256 (sequence, value head) pairs, where the
# sequential state pass has few programs and splits V finer.  Chosen by the bench sweep (bench/gdn.py).
#   intra       "fused" | "solve" | "split" (see the module docstring)
#   intra_warps warps of the intra kernel: its 16x16 work fits one warp; more warps mostly replicate it
#   intra_BK    key/value columns per slice in the intra kernel.  Compiled for sm_90 (Triton 3.6): 32 keeps one
#               warp within 255 registers (64 spills ~0.6-0.9 KB per thread)
#   inverse     "subst" (forward substitution) | "double" (product form by tl.dot) for the 16x16 diagonal blocks
#   inv_prec    tl.dot precision of the block merges when the inputs are bf16/fp16 (fp32: always ieee);
#               see _inverse_precisions
#   prep_warps / wu_warps: the "split" kernels (wu_warps also runs _wu_kernel for "solve")
# intra from the H200 run of 2026-11-30 (``ATOM_GDN_BENCH_PARTS=prefill ATOM_GDN_BENCH_FOCUS=1 python -m
# atom_kernels.bench gdn --quick``, eager): 1x8192 split 878 / fused 866 / solve 751 us; 8x4096 split 2737 /
# fused 1917 / solve 2109 us (fla 0.6.0: 1636 / 2735 us).  "solve" wins where few (sequence, head) pairs leave
# SMs idle (its separate w/u kernel adds parallelism), "fused" where there are many (A never goes to memory).
_COMMON = dict(intra="fused", intra_warps=1, intra_BK=32, inverse="subst", inv_prec="tf32", prep_warps=1, wu_warps=4,
               state_warps=4, state_stages=2, out_BV=64, out_warps=4)
# state/out knobs: the H200 sweep of 2026-11-30 (one knob at a time; those kernels are unchanged since) measured
# state_BV 64 over 32 at 8x4096 (-157 us), state_stages 3 (-45 us) and out_BV 128 (-47 us) at 1x8192
CONFIGS = {
    "few": dict(_COMMON, intra="solve", state_BV=16, state_stages=3, out_BV=128),
    "many": dict(_COMMON, state_BV=64),
}


def shape_class(num_seqs: int, num_v_heads: int) -> str:
    return "few" if num_seqs * num_v_heads < 256 else "many"


def resolve_config(num_seqs: int, num_v_heads: int, config: dict | None = None) -> dict:
    """The shape class's config with ``config``'s entries on top (a partial dict changes only those knobs)."""
    cfg = {**CONFIGS[shape_class(num_seqs, num_v_heads)], **(config or {})}
    if cfg["intra"] not in INTRA_MODES:
        raise ValueError(f"chunk_gated_delta_rule: config intra={cfg['intra']!r}; known: {', '.join(INTRA_MODES)}")
    if cfg["inverse"] not in INVERSES:
        raise ValueError(f"chunk_gated_delta_rule: config inverse={cfg['inverse']!r}; known: {', '.join(INVERSES)}")
    return cfg


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
    # one grid axis (axis 1 stops at 65535: 2048 sequences x 32 value heads would pass it); V blocks vary
    # fastest, as before, so the programs of one (sequence, head) run side by side and share its w/k reads
    V_BLOCKS: tl.constexpr = (V + BV - 1) // BV
    pid = tl.program_id(0)
    n = pid // (V_BLOCKS * HV)
    hv = (pid // V_BLOCKS) % HV
    hk = hv // GROUPS
    kc = tl.arange(0, BK)
    vc = (pid % V_BLOCKS) * BV + tl.arange(0, BV)
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


# --------------------------------------------------------------------------------------- kernel 3
@triton.jit
def _out_kernel(
    q_ptr, k_ptr, g_ptr, vn_ptr, hbuf_ptr, o_ptr, cu_ptr, chunk_seq_ptr, chunk_start_ptr, offsets_ptr,
    num_seqs, num_tokens,
    sq_t, sq_h, sk_t, sk_h, sg_h, svn_t, svn_h, sh_c, sh_h, sh_k, so_t, so_h, scale,
    GROUPS: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr,
    DOT: tl.constexpr, PREC: tl.constexpr, L2NORM: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    hv = tl.program_id(1)
    hk = hv // GROUPS
    rows = tl.arange(0, BT)
    vc = tl.program_id(2) * BV + tl.arange(0, BV)
    vmask = vc < V
    seq, start, length = chunk_span(c, chunk_seq_ptr, chunk_start_ptr, cu_ptr, BT)
    if seq < 0:
        # A spare program (past the last chunk) zeroes one 64-token tile of the tokens past cu_seqlens[-1];
        # the grid's ceil(T / 64) + N programs leave at least ceil((T - cu_seqlens[-1]) / 64) spares.
        spare = c - tl.load(offsets_ptr + num_seqs).to(tl.int64)
        tok = tl.load(cu_ptr + num_seqs).to(tl.int64) + spare * BT + rows
        tl.store(o_ptr + tok[:, None] * so_t + hv * so_h + vc[None, :], tl.zeros([BT, BV], o_ptr.dtype.element_ty),
                 mask=(tok < num_tokens)[:, None] & vmask[None, :])
        return
    ok = rows < length
    tok = start + rows
    kc = tl.arange(0, BK)
    kmask = kc < K
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
        beta = torch.empty(HV, T, dtype=torch.float32, device=v.device)
        Ainv = torch.empty(T, HV, BT, dtype=work, device=v.device)
    if mode == "split":
        _prep_kernel[(NT, HV)](
            a, b, k, A_log, dt_bias, G, beta, Ainv, cu_seqlens, chunk_seq, chunk_start,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1), k.stride(0), k.stride(1), G.stride(0),
            Ainv.stride(0), Ainv.stride(1),
            GROUPS=groups, K=K, BK=BK, BT=BT, BC=BC, DOT=DOT, PREC=PREC, L2NORM=l2, num_warps=cfg["prep_warps"],
        )
    else:
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


def chunk_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, ssm_state, cu_seqlens, slots, has_initial_state=None, *,
                           scale=None, state_layout=K_MAJOR, use_qk_l2norm=True, config=None):
    check_gdn_shapes("chunk_gated_delta_rule", q, k, v, a, b, A_log, dt_bias, ssm_state, state_layout)
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    N = slots.shape[0]
    if cu_seqlens.shape != (N + 1,):
        raise ValueError(f"chunk_gated_delta_rule: cu_seqlens must be [N+1] = [{N + 1}], got {tuple(cu_seqlens.shape)}")
    cfg = resolve_config(N, HV, config)
    if T == 0 or N == 0:
        return torch.zeros(T, HV, V, dtype=v.dtype, device=v.device)
    # every element is written: the tokens of the sequences by _out_kernel's chunks, those past
    # cu_seqlens[-1] (zeros) by its spare programs (cu_seqlens[0] is 0 by contract)
    out = torch.empty(T, HV, V, dtype=v.dtype, device=v.device)
    scale = default_scale(K, scale)
    dev = v.device
    work = v.dtype if v.dtype != torch.float32 else torch.float32  # dtype of the intermediates
    chunk_seq, chunk_start, chunk_offsets = chunk_map(cu_seqlens, T, BT)
    NT = chunk_seq.numel()
    G = torch.empty(HV, T, dtype=torch.float32, device=dev)
    w = torch.empty(T, HV, K, dtype=work, device=dev)
    u = torch.empty(T, HV, V, dtype=work, device=dev)
    v_new = torch.empty(T, HV, V, dtype=work, device=dev)
    hbuf = torch.empty(NT, HV, K, V, dtype=work, device=dev)
    DOT, PREC = dot_dtype(work), dot_precision(work)
    BK, BVF = triton.next_power_of_2(K), triton.next_power_of_2(V)
    groups = HV // H
    l2 = bool(use_qk_l2norm)

    _intra(q, k, v, a, b, A_log, dt_bias, cu_seqlens, chunk_seq, chunk_start, G, w, u, cfg, work, DOT, PREC, l2)
    ss_slot, ss_h, ss_k, ss_v = state_strides(ssm_state, state_layout)
    bv = min(cfg["state_BV"], BVF)
    init = has_initial_state if has_initial_state is not None else slots
    _state_kernel[(triton.cdiv(V, bv) * N * HV,)](
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
        q, k, G, v_new, hbuf, out, cu_seqlens, chunk_seq, chunk_start, chunk_offsets, N, T,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), G.stride(0), v_new.stride(0), v_new.stride(1),
        hbuf.stride(0), hbuf.stride(1), hbuf.stride(2), out.stride(0), out.stride(1), scale,
        GROUPS=groups, K=K, V=V, BK=BK, BV=bvo, BT=BT, DOT=DOT, PREC=PREC, L2NORM=l2, num_warps=cfg["out_warps"],
    )
    return out
