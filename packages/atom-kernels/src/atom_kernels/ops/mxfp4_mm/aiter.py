"""AITER MXFP4 GEMM (ROCm, MI350/gfx950 only). Unverified here: nobody on the team has an AMD GPU.

``aiter.gemm_a4w4(A [M, K/2], B [N, K/2], A_scale [M, K/32], B_scale [N, K/32], out [M, N], bias,
alpha, beta, bpreshuffle)`` multiplies MXFP4 activations by MXFP4 weights, so the activations are
quantized first (``aiter.ops.triton.quant.dynamic_mxfp4_quant``).  That adds an activation rounding
this op's contract does not have, so the wrapper runs only when asked for with
``ATOM_AITER_MXFP4_A4W4=1``; otherwise the Triton weight-only kernel runs.
"""

from __future__ import annotations

import functools

import torch

from atom_kernels.dispatch import switch_on

A4W4_ENV = "ATOM_AITER_MXFP4_A4W4"


@functools.cache
def _is_gfx950() -> bool:
    return getattr(torch.cuda.get_device_properties(0), "gcnArchName", "").startswith("gfx950")


def unsupported(x, w, w_scale, bias=None, layout="rows", static_weights=False) -> str | None:
    if layout != "rows":
        return f"aiter gemm_a4w4 reads the checkpoint layout, not {layout!r}"
    if not switch_on(A4W4_ENV):
        return "aiter gemm_a4w4 also quantizes activations to MXFP4; set ATOM_AITER_MXFP4_A4W4=1 to allow it"
    if not _is_gfx950():
        return "aiter gemm_a4w4 needs an MI350-class GPU (gfx950)"
    if x.dtype != torch.bfloat16:
        return f"aiter gemm_a4w4 writes bf16, x is {x.dtype}"
    return None


def mxfp4_mm(x, w, w_scale, bias=None, layout="rows", static_weights=False):
    import aiter
    from aiter.ops.triton.quant import dynamic_mxfp4_quant

    x_q, x_scale = dynamic_mxfp4_quant(x)
    out = torch.empty((x.shape[0], w.shape[0]), dtype=torch.bfloat16, device=x.device)
    aiter.gemm_a4w4(x_q, w, x_scale, w_scale, out, bias=None, bpreshuffle=False)
    return out + bias.to(out.dtype) if bias is not None else out
