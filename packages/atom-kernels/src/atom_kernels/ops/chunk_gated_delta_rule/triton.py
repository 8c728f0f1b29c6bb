"""Triton GDN prefill: three kernels over chunks of 64 tokens.

1. ``_intra`` (chunk, value head): everything inside one chunk.  Gating, the cumulative log-decay ``G``
   within the chunk (stored in log2 units), β; the ten 16x16 blocks of
   ``L = tril₋₁(β k̂ k̂ᵀ ⊙ exp(Gᵢ - Gⱼ))`` from raw k, accumulated over slices of the key dim (the L2
   norms are folded in as row/column scales); the WY inverse ``A = (I + L)⁻¹`` as four 16x16 diagonal
   inverses (forward substitution, or the product form ``(I - L)(I + L²)(I + L⁴)(I + L⁸)``) merged by
   block products; then, still in registers, ``w = A (β e^G k̂)`` and ``u = A (β v)``.  A never goes to
   memory (``config["intra"]``; :mod:`.intra`).
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

from atom_kernels.gdn import K_MAJOR, check_gdn_shapes, default_scale, state_strides
from atom_kernels.ops._triton_common import chunk_span, dot_dtype, dot_precision, use_while
from atom_kernels.ops._varlen import PER_SEQUENCE_POINTERS, chunk_map, padded_tokens
from atom_kernels.ops.chunk_gated_delta_rule.intra import BT, _intra

MAX_HEAD_DIM = 256
INTRA_MODES = ("fused", "solve")
INVERSES = ("subst", "double")

# Launch configs by shape class; "few" = fewer than 256 (sequence, value head) pairs, where the
# sequential state pass has few programs and splits V finer.  Chosen by the bench sweep (bench/gdn.py).
#   intra       "fused" | "solve" (see intra.py)
#   intra_warps warps of the intra kernel: its 16x16 work fits one warp; more warps mostly replicate it
#   intra_BK    key/value columns per slice in the intra kernel.  Compiled for sm_90 (Triton 3.6): 32 keeps one
#               warp within 255 registers (64 spills ~0.6-0.9 KB per thread)
#   inverse     "subst" (forward substitution) | "double" (product form by tl.dot) for the 16x16 diagonal blocks
#   inv_prec    tl.dot precision of the block merges when the inputs are bf16/fp16 (fp32: always ieee);
#               see _inverse_precisions
#   wu_warps    warps of _wu_kernel ("solve")
# intra: "solve" where few (sequence, head) pairs leave SMs idle (its separate w/u kernel adds parallelism), "fused"
# where there are many (A never goes to memory); the state/out knobs are the fastest of an H200 sweep.
_COMMON = dict(intra="fused", intra_warps=1, intra_BK=32, inverse="subst", inv_prec="tf32", wu_warps=4,
               state_warps=4, state_stages=2, out_BV=64, out_warps=4)
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


@triton.jit(do_not_specialize_on_alignment=PER_SEQUENCE_POINTERS)
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
@triton.jit(do_not_specialize=["num_seqs", "num_tokens"])  # step sizes: one compile for every step
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
    G = torch.empty(HV, padded_tokens(T), dtype=torch.float32, device=dev)
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
