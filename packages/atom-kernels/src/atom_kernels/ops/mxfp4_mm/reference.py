"""Plain-torch MXFP4 weight-only GEMM: the specification."""

from __future__ import annotations

from atom_kernels.formats import dequantize_mxfp4


def mxfp4_mm(x, w, w_scale, bias=None):
    out = x.float() @ dequantize_mxfp4(w, w_scale).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
