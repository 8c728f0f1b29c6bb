"""compressed-tensors FP8 checkpoints (llm-compressor's ``"format": "float-quantized"``).

``quantization_config = {"quant_method": "compressed-tensors", "format": "float-quantized",
"config_groups": {name: {"targets": [...], "weights": {...}, "input_activations": {...}}}, "ignore": [...]}``.
Each group targets layers (``Linear``, exact names or ``re:`` patterns); a layer no group targets, or
one the ``ignore`` list names, stays unquantized.  FP8 groups map onto ATOM's layouts by strategy:

==================  =======================================  ==================================
weights strategy    input_activations                        ATOM method
==================  =======================================  ==================================
``channel``         ``token``, dynamic                       PTPC (per-channel x per-token)
``tensor``          ``tensor`` static, or dynamic            FP8 per tensor
``block`` [bn, bk]  ``group`` (size bk) or ``token``, dynamic  FP8 block (scales: ``weight_scale``)
==================  =======================================  ==================================

Anything else (integer types, 4-bit packs, weight-only FP8, asymmetric) is a clear error naming the
layer and the group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from atom_core.errors import UnsupportedQuantizationError
from atom_core.quant.base import LinearMethod, QuantConfig, register_scheme
from atom_core.quant.exclusions import exclusion_patterns, layer_excluded, layer_selected, matches, matches_any
from atom_core.quant.fp8 import Fp8BlockLinearMethod, Fp8ChannelLinearMethod, Fp8TensorLinearMethod

if TYPE_CHECKING:
    from atom_core.layers.linear import LinearBase

FLOAT_FORMATS = ("float-quantized", "naive-quantized")


def method_for_group(name: str, group: dict[str, Any], fmt: str | None) -> LinearMethod:
    """The ATOM method for one config group (raises for what ATOM cannot run)."""
    weights = group.get("weights") or {}
    acts = group.get("input_activations")
    fmt = group.get("format") or fmt
    what = f"compressed-tensors group {name!r}"
    if fmt not in FLOAT_FORMATS:
        raise UnsupportedQuantizationError(f"{what}: format {fmt!r} is not supported (FP8 'float-quantized' only)")
    if weights.get("type") != "float" or weights.get("num_bits") != 8 or not weights.get("symmetric", True):
        raise UnsupportedQuantizationError(f"{what}: weights {weights} are not symmetric 8-bit float")
    if weights.get("dynamic"):
        raise UnsupportedQuantizationError(f"{what}: dynamic weight quantization is not supported")
    if not acts:
        raise UnsupportedQuantizationError(f"{what}: FP8 weights with unquantized activations (W8A16) are not supported")
    if acts.get("type") != "float" or acts.get("num_bits") != 8:
        raise UnsupportedQuantizationError(f"{what}: input activations {acts} are not 8-bit float")
    strategy, act_strategy, dynamic = weights.get("strategy"), acts.get("strategy"), bool(acts.get("dynamic"))
    if strategy == "channel" and act_strategy == "token" and dynamic:
        return Fp8ChannelLinearMethod()
    if strategy == "tensor" and act_strategy == "tensor":
        return Fp8TensorLinearMethod(static_input=not dynamic)
    if strategy == "block" and dynamic and act_strategy in ("group", "token"):
        block = weights.get("block_structure") or [128, 128]
        if act_strategy == "group" and acts.get("group_size") not in (None, block[1]):
            raise UnsupportedQuantizationError(
                f"{what}: activation groups of {acts.get('group_size')} do not match weight blocks {block}"
            )
        return Fp8BlockLinearMethod((block[0], block[1]), scale_name="weight_scale")
    raise UnsupportedQuantizationError(
        f"{what}: weights strategy {strategy!r} with {'dynamic' if dynamic else 'static'} {act_strategy!r} "
        "activations is not supported"
    )


@register_scheme("compressed-tensors")
class CompressedTensorsConfig(QuantConfig):
    name = "compressed-tensors"

    def __init__(self, groups: dict[str, dict[str, Any]], fmt: str | None, ignore: list[str]):
        self.groups = groups
        self.fmt = fmt
        self.ignore = ignore
        for name, group in groups.items():  # validate every group up front: a bad config fails at parse time
            method_for_group(name, group, fmt)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> CompressedTensorsConfig:
        groups = config.get("config_groups") or {}
        if not groups:
            raise UnsupportedQuantizationError("compressed-tensors config has no config_groups")
        return cls(dict(groups), config.get("format"), exclusion_patterns(config, "ignore"))

    def linear_method(self, layer: LinearBase, prefix: str) -> LinearMethod | None:
        packed = self.packed_modules_mapping
        if layer_excluded(prefix, self.ignore, packed):
            return None
        for name, group in self.groups.items():
            if layer_selected(prefix, group.get("targets") or [], packed):
                return method_for_group(name, group, self.fmt)
        return None

    def moe_method(self, layer: Any, prefix: str):
        """Experts must be ignored (or not targeted): ATOM has no compressed-tensors expert kernel."""
        if matches_any(prefix, self.ignore):
            return None
        targeted = [name for name, group in self.groups.items()
                    if any(t == "Linear" or matches(prefix, t) for t in group.get("targets") or [])]
        if targeted:
            raise UnsupportedQuantizationError(
                f"{prefix}: compressed-tensors quantized experts (group {targeted[0]!r}) are not supported; "
                "ignore the experts or use an fp8 / quark checkpoint"
            )
        return None
