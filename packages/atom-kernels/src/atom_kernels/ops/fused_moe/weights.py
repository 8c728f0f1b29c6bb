"""How quantized expert weights are described to :func:`fused_moe`: a format name, the scales in
that format's layout, and a registry of dequantizers the reference uses.

Adding a format (FP8 block-scaled, MXFP4, ...) means: ``register_expert_format(name, dequantize)``
here, a branch in the Triton kernels (their ``unsupported`` declines formats they do not know), and a
quantization method in atom-core that creates the expert parameters and passes an :class:`ExpertQuant`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ExpertQuant:
    """Quantized stacked expert weights.

    * ``format``: a name registered with :func:`register_expert_format`;
    * ``w13_scale`` / ``w2_scale``: per-expert scales in the format's layout, first dim = experts
      (e.g. FP8 block ``[E, ceil(2I/bn), ceil(H/bk)]`` fp32; MXFP4 ``[E, 2I, H/32]`` e8m0);
    * ``block_shape``: ``(bn, bk)`` of one scale block, for block-scaled formats;
    * ``act_dtype``: the dtype activations are quantized to at run time, when the format does that.
    """

    format: str
    w13_scale: torch.Tensor | None = None
    w2_scale: torch.Tensor | None = None
    block_shape: tuple[int, int] | None = None
    act_dtype: torch.dtype | None = None


# name -> dequantize(weight_e, scale_e, quant) -> fp32 [out, in] matrix of one expert
Dequantizer = Callable[[torch.Tensor, "torch.Tensor | None", ExpertQuant], torch.Tensor]
EXPERT_FORMATS: dict[str, Dequantizer] = {}
# name -> the rounding a format applies to a GEMM's input rows at run time (fp32 [rows, K] -> fp32)
ActivationQuant = Callable[[torch.Tensor, ExpertQuant], torch.Tensor]
EXPERT_ACTIVATIONS: dict[str, ActivationQuant] = {}


def register_expert_format(name: str, dequantize: Dequantizer, activation: ActivationQuant | None = None) -> None:
    EXPERT_FORMATS[name] = dequantize
    if activation is not None:
        EXPERT_ACTIVATIONS[name] = activation


def quantize_activation(x: torch.Tensor, quant: ExpertQuant | None) -> torch.Tensor:
    """``x`` (fp32 rows entering an expert GEMM) as the format's kernels see it."""
    if quant is None or quant.format not in EXPERT_ACTIVATIONS:
        return x
    return EXPERT_ACTIVATIONS[quant.format](x, quant)


def dequantize_expert(weights: torch.Tensor, scales: torch.Tensor | None, expert: int,
                      quant: ExpertQuant | None) -> torch.Tensor:
    """Expert ``expert``'s weight matrix as fp32 ``[out, in]``."""
    if quant is None:
        return weights[expert].float()
    if quant.format not in EXPERT_FORMATS:
        raise ValueError(f"fused_moe: unknown expert weight format {quant.format!r}; known: {sorted(EXPERT_FORMATS)}")
    return EXPERT_FORMATS[quant.format](weights[expert], scales[expert] if scales is not None else None, quant)
