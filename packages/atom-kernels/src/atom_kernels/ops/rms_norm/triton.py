"""Triton RMSNorm: one program per row, the row held in registers, fp32 math; launched with programmatic dependent
launch where the GPU has it (``ops/_pdl.py``), so the GEMM after it can start streaming its weights."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.ops._pdl import pdl_keywords, start_dependent

MAX_HIDDEN = 65536


def unsupported(x, weight, eps, residual=None, weight_offset=0.0) -> str | None:
    if x.shape[-1] > MAX_HIDDEN:
        return f"hidden size {x.shape[-1]} > {MAX_HIDDEN}"
    if weight.shape != (x.shape[-1],):
        return f"weight shape {tuple(weight.shape)} does not match hidden size {x.shape[-1]}"
    if residual is not None and residual.shape != x.shape:
        return "residual shape differs from x"
    return None


@triton.jit
def _rms_norm_kernel(
    x_ptr, x_stride, res_ptr, res_stride, sum_ptr, sum_stride, out_ptr, out_stride, w_ptr,
    hidden, eps, weight_offset,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    start_dependent(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # add in fp32 and round once: what a bf16/fp16 add does, and exact for fp32
        res = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + res.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(sum_ptr + row * sum_stride + cols, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, axis=0) / hidden + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) + weight_offset
    tl.store(out_ptr + row * out_stride + cols, (xf * inv_rms * w).to(out_ptr.dtype.element_ty), mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    t2 = t.reshape(-1, t.shape[-1])
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def rms_norm(x, weight, eps, residual=None, weight_offset=0.0):
    hidden = x.shape[-1]
    x2 = _rows(x)
    out = torch.empty_like(x2)
    block = triton.next_power_of_2(hidden)
    num_warps = min(max(block // 256, 1), 16)
    if residual is None:
        res2 = summed = x2  # unused
    else:
        res2 = _rows(residual)
        summed = torch.empty_like(x2)
    if x2.shape[0] > 0:
        pdl_launch = pdl_keywords(x.device)
        _rms_norm_kernel[(x2.shape[0],)](
            x2, x2.stride(0), res2, res2.stride(0), summed, summed.stride(0), out, out.stride(0), weight,
            hidden, eps, weight_offset,
            HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=num_warps, **pdl_launch,
        )
    if residual is None:
        return out.view(x.shape)
    return out.view(x.shape), summed.view(x.shape)
