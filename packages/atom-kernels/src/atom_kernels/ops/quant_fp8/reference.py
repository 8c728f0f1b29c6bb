"""Plain-torch FP8 activation quantization: the specification."""

from __future__ import annotations

import torch

from atom_kernels import formats


def quant_fp8(x: torch.Tensor, group_size: int | None = None, static_scale: torch.Tensor | None = None):
    if static_scale is not None:
        scale = static_scale.float().reshape(1).expand(*x.shape[:-1], 1).contiguous()
        return formats.fp8_encode(x, scale), scale
    if group_size is None:
        return formats.quantize_fp8_per_row(x)
    return formats.quantize_fp8_per_group(x, group_size)
