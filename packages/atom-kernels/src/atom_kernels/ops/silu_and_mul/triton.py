"""Triton SiLU-and-mul: 2-D grid over (rows, column blocks), fp32 math; launched with programmatic dependent
launch where the GPU has it (``ops/_pdl.py``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.ops._pdl import pdl_keywords, start_dependent


def unsupported(x) -> str | None:
    if x.shape[-1] % 2:
        return f"last dim {x.shape[-1]} is odd"
    return None


@triton.jit
def _silu_and_mul_kernel(x_ptr, x_stride, out_ptr, out_stride, inter, BLOCK: tl.constexpr, PDL: tl.constexpr):
    start_dependent(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * x_stride + inter + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * out_stride + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    inter = x.shape[-1] // 2
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty((x2.shape[0], inter), dtype=x.dtype, device=x.device)
    block = min(triton.next_power_of_2(max(inter, 1)), 1024)
    if x2.shape[0] > 0 and inter > 0:
        pdl_launch = pdl_keywords(x.device)
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(inter, block))](
            x2, x2.stride(0), out, out.stride(0), inter, BLOCK=block, num_warps=4, **pdl_launch,
        )
    return out.view(*x.shape[:-1], inter)
