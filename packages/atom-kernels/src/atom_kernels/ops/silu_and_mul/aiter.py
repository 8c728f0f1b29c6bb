"""AITER SiLU-and-mul (ROCm). Unverified here: nobody on the team has an AMD GPU."""

from __future__ import annotations

import torch


def unsupported(x) -> str | None:
    if x.dtype not in (torch.float16, torch.bfloat16):
        return f"aiter silu_and_mul takes fp16/bf16, not {x.dtype}"
    return None


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    import aiter

    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    out = torch.empty((x2.shape[0], x2.shape[1] // 2), dtype=x.dtype, device=x.device)
    aiter.silu_and_mul(out, x2)
    return out.view(*x.shape[:-1], x.shape[-1] // 2)
