"""Quantization: parsing ``quantization_config`` into a scheme, and the per-layer methods that
create, convert and apply quantized weights."""

from atom_core.quant.base import (
    LinearMethod,
    QuantConfig,
    UnquantizedLinearMethod,
    parse_quant_config,
    register_scheme,
)

__all__ = ["LinearMethod", "QuantConfig", "UnquantizedLinearMethod", "parse_quant_config", "register_scheme"]
