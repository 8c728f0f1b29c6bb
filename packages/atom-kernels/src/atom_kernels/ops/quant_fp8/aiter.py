"""AITER FP8 activation quantization (ROCm). Unverified here: nobody on the team has an AMD GPU.

AITER writes the platform's fp8 type: e4m3fnuz on MI300 (gfx942), e4m3fn on MI350 (gfx950).  This
op's contract is e4m3fn, so the wrapper runs only where the two agree; per-group quantization is
left to the Triton kernel.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def _arch_has_e4m3fn() -> bool:
    name = getattr(torch.cuda.get_device_properties(0), "gcnArchName", "")
    return name.startswith("gfx950")


def unsupported(x, group_size=None, static_scale=None) -> str | None:
    if group_size is not None:
        return "the aiter wrapper covers per-token and static quantization only"
    if x.dtype not in (torch.bfloat16, torch.float16):
        return f"aiter quantization takes fp16/bf16, not {x.dtype}"
    if not _arch_has_e4m3fn():
        return "this GPU's AITER fp8 type is e4m3fnuz, not the e4m3fn this op returns"
    return None


def quant_fp8(x, group_size=None, static_scale=None):
    import aiter

    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    q = torch.empty(x2.shape, dtype=torch.float8_e4m3fn, device=x.device)
    if static_scale is not None:
        aiter.static_per_tensor_quant(q, x2, static_scale.float().reshape(1))
        scale = static_scale.float().reshape(1, 1).expand(x2.shape[0], 1).contiguous()
    else:
        scale = torch.empty(x2.shape[0], 1, dtype=torch.float32, device=x.device)
        aiter.dynamic_per_token_scaled_quant(q, x2, scale)
    return q.view(x.shape), scale.view(*x.shape[:-1], 1)
