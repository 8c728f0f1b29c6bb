"""Online quantization: an unquantized (bf16/fp32) checkpoint is loaded as is and each linear layer's
weight is quantized right after loading (``atom generate --quantization ptpc-fp8``,
``parse_quant_config(hf_config, online="ptpc-fp8")``).

Schemes (the same names as ``atom quantize --scheme``):

* ``ptpc-fp8``: FP8 weights with one scale per output channel, activations per token;
* ``fp8-block``: FP8 weights in 128 x 128 blocks, activations per token per 128 columns;
* ``mxfp4``: MXFP4 weights (weight-only).

Each rank quantizes its own partition, so no alignment with fused shards or tensor-parallel splits
is needed (a block of a fused layer may span two shards).  The weights are encoded by the same
functions ``atom quantize`` writes checkpoints with (``atom_kernels.formats``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from atom_core.errors import UnsupportedQuantizationError
from atom_core.quant.base import LinearMethod, QuantConfig, UnquantizedLinearMethod, register_online_scheme, register_scheme
from atom_core.quant.fp8 import Fp8BlockLinearMethod, Fp8ChannelLinearMethod
from atom_core.quant.mxfp4 import Mxfp4LinearMethod, adopt_kernel_layout
from atom_core.quant.params import MX_GROUP, check_scale_range, replace_param

if TYPE_CHECKING:
    from atom_core.layers.linear import LinearBase

BLOCK = (128, 128)


def _ptpc(layer: LinearBase, w: torch.Tensor) -> None:
    from atom_kernels.formats import quantize_fp8_per_row

    q, s = quantize_fp8_per_row(w)
    replace_param(layer, "weight", q)
    replace_param(layer, "weight_scale", s)


def _fp8_block(layer: LinearBase, w: torch.Tensor) -> None:
    from atom_kernels.formats import quantize_fp8_blocks

    q, s = quantize_fp8_blocks(w, BLOCK)
    replace_param(layer, "weight", q)
    replace_param(layer, "weight_scale_inv", s)


def _mxfp4(layer: LinearBase, w: torch.Tensor) -> None:
    from atom_kernels.formats import quantize_mxfp4

    packed, scales = quantize_mxfp4(w)
    check_scale_range(layer.prefix, scales)
    replace_param(layer, "weight", packed)
    replace_param(layer, "weight_scale", scales)
    adopt_kernel_layout(layer)


# scheme -> (how to quantize a loaded weight, the method that runs the result)
ONLINE_SCHEMES: dict[str, tuple[Any, Any]] = {
    "ptpc-fp8": (_ptpc, Fp8ChannelLinearMethod),
    "fp8-block": (_fp8_block, lambda: Fp8BlockLinearMethod(BLOCK)),
    "mxfp4": (_mxfp4, Mxfp4LinearMethod),
}


class OnlineLinearMethod(LinearMethod):
    """Loads like an unquantized layer, then quantizes and runs as ``runner``."""

    def __init__(self, scheme: str):
        self.quantize, make_runner = ONLINE_SCHEMES[scheme]
        self.runner = make_runner()
        self.scheme = scheme

    def create_weights(self, layer: LinearBase, params_dtype: torch.dtype) -> None:
        if self.scheme == "mxfp4" and layer.in_partition % MX_GROUP:
            raise UnsupportedQuantizationError(
                f"{layer.prefix}: online MXFP4 needs input features per rank divisible by {MX_GROUP}, "
                f"got {layer.in_partition}"
            )
        UnquantizedLinearMethod().create_weights(layer, params_dtype)

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        self.quantize(layer, layer.weight.data)

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.runner.apply(layer, x, bias)


@register_online_scheme
@register_scheme("ptpc-fp8", "fp8-block")  # named by a checkpoint: refused with the reason (from_config)
class OnlineQuantConfig(QuantConfig):
    """Quantize every linear layer of an unquantized checkpoint at load."""

    def __init__(self, scheme: str):
        if scheme not in ONLINE_SCHEMES:
            raise UnsupportedQuantizationError(
                f"online quantization {scheme!r} is not supported; choose one of {', '.join(ONLINE_SCHEMES)}"
            )
        self.name = scheme

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> OnlineQuantConfig:
        if not config.get("online"):
            raise UnsupportedQuantizationError(
                f"{config.get('quant_method')!r} is an online scheme (--quantization), not a checkpoint format"
            )
        return cls(config["quant_method"])

    def linear_method(self, layer: LinearBase, prefix: str) -> LinearMethod | None:
        return OnlineLinearMethod(self.name)

    def moe_method(self, layer: Any, prefix: str):
        """fp8-block and mxfp4 quantize the experts too; ptpc-fp8 has no expert format and keeps them."""
        if self.name == "ptpc-fp8":
            return None
        from atom_core.quant.moe import OnlineMoEMethod

        return OnlineMoEMethod(self.name)
