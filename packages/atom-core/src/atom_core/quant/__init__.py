"""Quantization: parsing ``quantization_config`` into a scheme, and the per-layer methods that
create, convert and apply quantized weights.

Schemes (``quant_method``): ``fp8`` (per tensor or DeepSeek-V3 blocks), ``compressed-tensors`` (FP8
channel/token, tensor, block), ``quark`` (MXFP4 dense), ``mxfp4`` (gpt-oss MoE experts), and the
online schemes ``ptpc-fp8`` / ``fp8-block`` / ``mxfp4`` that quantize an unquantized checkpoint at load.
"""

from atom_core.quant import compressed_tensors, fp8, mxfp4, online  # noqa: F401  (register the schemes)
from atom_core.quant.base import (
    LinearMethod,
    QuantConfig,
    UnquantizedLinearMethod,
    model_quant_config,
    parse_quant_config,
    register_scheme,
    supported_schemes,
)

__all__ = [
    "LinearMethod", "QuantConfig", "UnquantizedLinearMethod", "model_quant_config", "parse_quant_config", "register_scheme",
    "supported_schemes",
]
