"""Triton cache write: program ``(token, part)`` moves ``BLOCK`` of the token's ``kv_heads * D`` key values and
as many of its values to the token's slot (nothing for a negative slot).  An fp8 cache gets ``x / scale`` clamped
to +-448 and rounded to the e4m3 grid in fp32 first (see :mod:`atom_kernels.ops.quant_fp8.triton`), so the cast
is exact and agrees with torch's round-to-nearest-even."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.formats import FP8_MAX
from atom_kernels.ops.quant_fp8.triton import _round_to_e4m3
from atom_kernels.ops.reshape_and_cache.reference import check_cache_args

BLOCK = 1024
_MAX = tl.constexpr(FP8_MAX)


def unsupported(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None) -> str | None:
    ok = (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn)
    if k_cache.dtype not in ok or v_cache.dtype not in ok:
        return f"caches {k_cache.dtype} / {v_cache.dtype}: float or fp8 e4m3fn"
    if k.stride(-1) != 1 or v.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        return "inputs and caches need a contiguous last dim"
    return None


@triton.jit
def _write(x_ptr, sx_t, sx_h, c_ptr, sc_blk, sc_tok, sc_h, scale_ptr, t, block, offset, part,
           D: tl.constexpr, N: tl.constexpr, HAS_SCALE: tl.constexpr, FP8: tl.constexpr, BLOCK: tl.constexpr):
    e = part * BLOCK + tl.arange(0, BLOCK)
    ok = e < N
    h = e // D
    d = e % D
    x = tl.load(x_ptr + t * sx_t + h * sx_h + d, mask=ok, other=0.0)  # cast once, at the store, when unscaled
    if HAS_SCALE or FP8:
        x = x.to(tl.float32)
    if HAS_SCALE:
        x = tl.math.div_rn(x, tl.load(scale_ptr).to(tl.float32) + tl.zeros([BLOCK], tl.float32))
    if FP8:
        x = _round_to_e4m3(tl.minimum(tl.maximum(x, -_MAX), _MAX))
    tl.store(c_ptr + block * sc_blk + offset * sc_tok + h * sc_h + d, x.to(c_ptr.dtype.element_ty), mask=ok)


@triton.jit
def _cache_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, ks_ptr, vs_ptr,
    sk_t, sk_h, sv_t, sv_h, skc_blk, skc_tok, skc_h, svc_blk, svc_tok, svc_h,
    PAGE: tl.constexpr, DK: tl.constexpr, NK: tl.constexpr, DV: tl.constexpr, NV: tl.constexpr,
    HAS_K_SCALE: tl.constexpr, HAS_V_SCALE: tl.constexpr, K_FP8: tl.constexpr, V_FP8: tl.constexpr,
    BLOCK: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        block = slot // PAGE
        offset = slot % PAGE
        if part * BLOCK < NK:
            _write(k_ptr, sk_t, sk_h, kc_ptr, skc_blk, skc_tok, skc_h, ks_ptr, t, block, offset, part,
                   DK, NK, HAS_K_SCALE, K_FP8, BLOCK)
        if part * BLOCK < NV:
            _write(v_ptr, sv_t, sv_h, vc_ptr, svc_blk, svc_tok, svc_h, vs_ptr, t, block, offset, part,
                   DV, NV, HAS_V_SCALE, V_FP8, BLOCK)


def reshape_and_cache(k, v, k_cache, v_cache, slot_mapping, k_scale=None, v_scale=None):
    check_cache_args(k, v, k_cache, v_cache, slot_mapping)
    tokens = k.shape[0]
    nk, nv = k.shape[1] * k.shape[2], v.shape[1] * v.shape[2]
    if tokens == 0 or max(nk, nv) == 0:
        return
    block = min(BLOCK, triton.next_power_of_2(max(nk, nv)))
    _cache_kernel[(tokens, triton.cdiv(max(nk, nv), block))](
        k, v, k_cache, v_cache, slot_mapping,
        k_scale if k_scale is not None else slot_mapping, v_scale if v_scale is not None else slot_mapping,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        PAGE=k_cache.shape[1], DK=k.shape[2], NK=nk, DV=max(1, v.shape[2]), NV=nv,
        HAS_K_SCALE=k_scale is not None, HAS_V_SCALE=v_scale is not None,
        K_FP8=k_cache.dtype == torch.float8_e4m3fn, V_FP8=v_cache.dtype == torch.float8_e4m3fn, BLOCK=block,
    )
