"""cuBLASLt's row-wise scaled FP8 GEMM through ``torch._scaled_mm``.

Row-wise scaling (``scale_a [M, 1]``, ``scale_b [1, N]``) needs a Hopper-class GPU (compute capability
9.0 or newer) and K, N multiples of 16; ``b`` is passed as ``weight.t()``, the column-major ``[K, N]``
operand cuBLASLt wants, without a copy.  The bias is added afterwards (row-wise scaling takes none).
"""

from __future__ import annotations

import functools

import torch

_OUT_DTYPES = (torch.bfloat16,)  # cuBLASLt's row-wise scaling writes bf16 only
# Token counts below this go to the Triton kernel instead (swapped operands + split K can beat
# cuBLASLt at decode sizes; set from the `quant` bench: fp8-rowwise rows at M = 1 and 16).
MIN_M = 1


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def unsupported(a, a_scale, b, b_scale, bias=None, out_dtype=torch.bfloat16) -> str | None:
    if torch.version.hip is not None:
        return "the row-wise torch._scaled_mm path is for NVIDIA GPUs here"
    if _capability(a.device.index or 0) < (9, 0):
        return "row-wise torch._scaled_mm needs compute capability 9.0 or newer"
    m, k = a.shape
    n = b.shape[0]
    if m < MIN_M:
        return f"M={m} < {MIN_M}: the Triton kernel is faster at this size"
    if m == 0 or k % 16 or n % 16:
        return f"torch._scaled_mm needs K and N multiples of 16 (M={m}, K={k}, N={n})"
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        return "torch._scaled_mm path takes float8_e4m3fn operands"
    if a.stride(1) != 1 or b.stride(1) != 1:
        return "operands must be K-contiguous"
    if out_dtype not in _OUT_DTYPES:
        return f"row-wise torch._scaled_mm writes bf16, not {out_dtype}"
    return None


def fp8_scaled_mm(a, a_scale, b, b_scale, bias=None, out_dtype=torch.bfloat16):
    scale_a = a_scale.float().reshape(-1, 1).contiguous()
    scale_b = b_scale.float().reshape(1, -1).contiguous()
    out = torch._scaled_mm(a, b.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)
    return out + bias.to(out_dtype) if bias is not None else out
