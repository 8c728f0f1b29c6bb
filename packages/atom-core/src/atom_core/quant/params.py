"""What the quantization schemes share: parameter swaps after loading, a 2-D GEMM over ``[..., K]`` inputs, and
the MX (microscaling) scale bytes.  A module of its own so that the schemes and their MoE methods import it rather
than each other."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from atom_core.errors import UnsupportedQuantizationError
from atom_core.layers.params import materialize

MX_GROUP = 32
# The Triton kernel keeps decoded weights as bf16 ``value * 2**-32``: e8m0 scale bytes above this
# (scales above 2**33) would overflow.  Real checkpoints stay far below (~2**-10 .. 2**0).
MAX_SCALE_BYTE = 160


def flat_apply(x: torch.Tensor, fn) -> torch.Tensor:
    """Run a 2-D GEMM ``fn(x2 [T, K]) -> [T, N]`` on ``x [..., K]``."""
    out = fn(x.reshape(-1, x.shape[-1]))
    return out.view(*x.shape[:-1], out.shape[-1])


def replace_param(layer: nn.Module, name: str, value: torch.Tensor) -> None:
    """Swap a parameter for its post-loading form (metadata is no longer needed)."""
    setattr(layer, name, nn.Parameter(value, requires_grad=False))


def as_bytes(tensor: Any) -> torch.Tensor:
    """A checkpoint tensor of e8m0 (or uint8) values as raw uint8 bytes."""
    t = materialize(tensor)
    return t.view(torch.uint8) if t.dtype != torch.uint8 and t.element_size() == 1 else t


def check_scale_range(prefix: str, scales: torch.Tensor) -> None:
    if scales.numel() and int(scales.max()) > MAX_SCALE_BYTE:
        raise UnsupportedQuantizationError(
            f"{prefix}: MXFP4 scale 2**{int(scales.max()) - 127} is above the supported 2**{MAX_SCALE_BYTE - 127}"
        )
