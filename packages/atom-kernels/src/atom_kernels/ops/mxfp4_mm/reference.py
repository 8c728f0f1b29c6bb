"""Plain-torch MXFP4 weight-only GEMM: the specification."""

from __future__ import annotations

from atom_kernels.formats import dequantize_mxfp4, mxfp4_in_rows


def mxfp4_mm(x, w, w_scale, bias=None, layout="rows", static_weights=False):
    out = x.float() @ dequantize_mxfp4(mxfp4_in_rows(w, layout), w_scale).t()
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)
