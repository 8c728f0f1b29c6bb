"""Triton gated RMSNorm: program (token, block of heads) normalises whole head rows held in registers."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.ops.rms_norm_gated.reference import check_args

MAX_HEAD_DIM = 8192


def unsupported(x, z, weight, eps) -> str | None:
    if x.shape[-1] > MAX_HEAD_DIM:
        return f"head dim {x.shape[-1]} > {MAX_HEAD_DIM}"
    if x.stride(-1) != 1 or z.stride(-1) != 1:
        return "x and z need a contiguous last dim"
    return None


@triton.jit
def _rms_norm_gated_kernel(x_ptr, z_ptr, w_ptr, out_ptr, sx_t, sx_h, sz_t, sz_h, so_t, so_h, heads, N, eps,
                           BH: tl.constexpr, BN: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BH + tl.arange(0, BH)
    cols = tl.arange(0, BN)
    mask = (h < heads)[:, None] & (cols < N)[None, :]
    x = tl.load(x_ptr + t * sx_t + h[:, None] * sx_h + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + t * sz_t + h[:, None] * sz_h + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, 1) / N + eps)
    y = x * inv_rms[:, None] * w[None, :] * (z * tl.sigmoid(z))
    tl.store(out_ptr + t * so_t + h[:, None] * so_h + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


def _strides(t: torch.Tensor) -> tuple[int, int]:
    return (t.stride(0), t.stride(1)) if t.dim() == 3 else (t.stride(0), 0)


def rms_norm_gated(x, z, weight, eps):
    check_args(x, z, weight)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    tokens, heads, n = x.shape[0], (x.shape[1] if x.dim() == 3 else 1), x.shape[-1]
    bn = triton.next_power_of_2(n)
    bh = max(1, min(triton.next_power_of_2(heads), 4096 // bn))
    if tokens > 0:
        _rms_norm_gated_kernel[(tokens, triton.cdiv(heads, bh))](
            x, z, weight, out, *_strides(x), *_strides(z), *_strides(out), heads, n, eps,
            BH=bh, BN=bn, num_warps=4,
        )
    return out
