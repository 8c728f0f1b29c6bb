"""MXFP4 weights -> a dense ``[N, K]`` tile of bf16 (or fp32) values in natural K order, on the GPU.

At prefill sizes the fused kernel decodes every weight tile once per token tile (32 times at 4096 tokens with
128-token tiles), so it is compute-bound on the decode; dequantizing the weight once (reading its 4-bit bytes,
writing 16-bit values) and handing the product to cuBLAS costs less from about a thousand tokens (the measured
crossover is ``triton.DEQUANT_MIN_TOKENS``).  The price is a transient ``[N, K]`` buffer of the activations' dtype.

One program decodes ``BLOCK_N`` rows of one 128-code block (64 bytes): a byte's two codes land at natural K
``2 q`` / ``2 q + 1`` (checkpoint order) or, in the ``"lanes"`` order, ``32 j + 8 p + 2 t`` / ``+ 1`` for byte
``q = 16 t + 4 j + p`` of the block.  Values are computed exactly in fp32 (``e2m1 * 2**(e - 127)`` has at most two
significant bits, so the cast to bf16 is exact for every normal result).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.formats import LANES_BLOCK, MX_GROUP

BLOCK_N = 32


@triton.jit
def _e2m1(code, scale):
    """4-bit e2m1 codes (sign in bit 3) times fp32 scales."""
    mag = code & 7
    value = tl.where(mag < 2, mag.to(tl.float32) * 0.5,
                     (2 + (mag & 1)).to(tl.float32) * tl.where(mag >= 6, 2.0, tl.where(mag >= 4, 1.0, 0.5)))
    return tl.where((code & 8) != 0, -value, value) * scale


@triton.jit
def _dequant_kernel(w_ptr, s_ptr, out_ptr, N, K: tl.constexpr, BLOCK_N: tl.constexpr, LANES: tl.constexpr):
    pid_n = tl.program_id(0)
    blk = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < N)[:, None]
    rows = rows.to(tl.int64)
    q = tl.arange(0, 64)
    if LANES:
        col = 32 * ((q // 4) % 4) + 8 * (q % 4) + 2 * (q // 16)
    else:
        col = 2 * q
    byte = tl.load(w_ptr + rows[:, None] * (K // 2) + blk * 64 + q[None, :], mask=mask, other=0).to(tl.int32)
    e = tl.load(s_ptr + rows[:, None] * (K // 32) + blk * 4 + (col // 32)[None, :], mask=mask, other=127)
    e = e.to(tl.int32)
    scale = tl.where(e == 0, 2.0 ** -127, (e << 23).to(tl.float32, bitcast=True))  # e8m0: 2**(e - 127)
    scale = tl.where(e == 255, float("nan"), scale)  # as the format defines
    out = out_ptr + rows[:, None] * K + blk * 128 + col[None, :]
    tl.store(out, _e2m1(byte & 15, scale).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out + 1, _e2m1(byte >> 4, scale).to(out_ptr.dtype.element_ty), mask=mask)


def dequantize(w: torch.Tensor, w_scale: torch.Tensor, dtype: torch.dtype, layout: str = "rows") -> torch.Tensor:
    """``w [N, K/2]`` uint8 (``layout`` byte order) and ``w_scale [N, K/32]`` e8m0 -> ``[N, K]`` values in
    ``dtype``, equal to ``formats.dequantize_mxfp4`` of the checkpoint bytes.  K must be a multiple of 128."""
    n, k = w.shape[0], w.shape[1] * 2
    if k % LANES_BLOCK or tuple(w_scale.shape) != (n, k // MX_GROUP):
        raise ValueError(f"dequantize needs K % {LANES_BLOCK} == 0 and scales [N, K/32]; got w {tuple(w.shape)}, "
                         f"w_scale {tuple(w_scale.shape)}")
    out = torch.empty((n, k), dtype=dtype, device=w.device)
    if n:
        _dequant_kernel[(triton.cdiv(n, BLOCK_N), k // LANES_BLOCK)](
            w.view(torch.uint8), w_scale.view(torch.uint8), out, n, K=k, BLOCK_N=BLOCK_N, LANES=layout == "lanes")
    return out
