"""MXFP4 (OCP microscaling FP4) checkpoints: AMD Quark's dense layout and gpt-oss' expert layout.

* Quark (``quant_method: quark``, ``global_quant_config.weight = {"dtype": "fp4", "qscheme": "per_group",
  "group_size": 32, "scale_format": "e8m0"}``, ``exclude: [...]``): a linear layer stores ``weight``
  uint8 ``[N, K/2]`` (two e2m1 codes per byte, low nibble first) and ``weight_scale`` e8m0 ``[N, K/32]``.
  Quark checkpoints made for MI355 also quantize activations to MXFP4 (``input_tensors``); a GPU
  without FP4 tensor cores runs them weight-only (bf16 activations), which is closer to the
  unquantized model than W4A4, not bit-identical to an MI355 run.
* gpt-oss (``quant_method: mxfp4``, ``modules_to_not_convert: [...]``): only MoE experts are
  quantized, as ``<name>_blocks`` uint8 ``[E, N, K/32, 16]`` and ``<name>_scales`` ``[E, N, K/32]``;
  ``gpt_oss_expert_layout`` turns them into the dense ``[E, N, K/2]`` / ``[E, N, K/32]`` layout the
  kernels use (a view).  Dense layers of such a checkpoint must be excluded.

Linear layers run ``atom_kernels.mxfp4_mm``: the weights stay 4-bit in memory.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch

from atom_core.env import env_choice
from atom_core.errors import UnsupportedQuantizationError
from atom_core.layers.params import make_param
from atom_core.quant.base import LinearMethod, QuantConfig, register_scheme
from atom_core.quant.exclusions import exclusion_patterns, layer_excluded, matches_any, shard_names
from atom_core.quant.params import MX_GROUP, as_bytes, check_scale_range, flat_apply

if TYPE_CHECKING:
    from atom_core.layers.linear import LinearBase

logger = logging.getLogger(__name__)

MXFP4_WEIGHT = {"dtype": "fp4", "qscheme": "per_group", "group_size": 32}


class Mxfp4LinearMethod(LinearMethod):
    """``weight`` uint8 ``[N, K/2]``, ``weight_scale`` uint8 ``[N, K/32]`` (Quark's names)."""

    def create_weights(self, layer: LinearBase, params_dtype: torch.dtype) -> None:
        n, k = sum(layer.out_partitions), layer.in_partition
        if k % MX_GROUP:
            raise UnsupportedQuantizationError(
                f"{layer.prefix}: MXFP4 needs input features per rank divisible by {MX_GROUP}, got {k}"
            )

        def load_bytes(param, loaded, shard_id=None):
            layer.weight_loader(param, as_bytes(loaded), shard_id)

        layer.weight = make_param((n, k // 2), torch.uint8, output_dim=0, input_dim=1, in_divisor=2,
                                  weight_loader=load_bytes)
        layer.weight_scale = make_param((n, k // MX_GROUP), torch.uint8, output_dim=0, input_dim=1,
                                        in_divisor=MX_GROUP, weight_loader=load_bytes)

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        check_scale_range(layer.prefix, layer.weight_scale.data)
        adopt_kernel_layout(layer)

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        from atom_kernels import mxfp4_mm

        layout = getattr(layer, "weight_layout", "rows")
        # static_weights: a layer's parameters are written at load time only, so the kernel may start streaming
        # them before the previous kernel on the stream has finished (programmatic dependent launch on sm_90)
        return flat_apply(x, lambda x2: mxfp4_mm(x2, layer.weight, layer.weight_scale, bias, layout=layout,
                                                 static_weights=True))


LAYOUT_ENV = "ATOM_MXFP4_LAYOUT"  # the byte order MXFP4 linear weights are kept in: a key of LAYOUT_CHOICES


def _preferred(weight: torch.Tensor) -> str:
    from atom_kernels.ops.mxfp4_mm import preferred_layout

    return preferred_layout(weight.shape[0], weight.shape[1] * 2, weight.device)


# ATOM_MXFP4_LAYOUT value -> the layout for a weight: the kernels' preference (default), or the checkpoint's order.
LAYOUT_CHOICES = {"auto": _preferred, "rows": lambda weight: "rows"}


def adopt_kernel_layout(layer: LinearBase) -> None:
    """Keep ``layer.weight`` in the byte order the MXFP4 kernels on its device read fastest
    (``atom_kernels.ops.mxfp4_mm.preferred_layout``): ``"lanes"`` (codes permuted inside each 128-code block, bits
    inside each word) where the sm_90 small-M ring kernel serves decode-sized calls (K % 256 == 0), the checkpoint's
    ``"rows"`` elsewhere.
    On an H200 lanes is faster at every batch size above one token (about 2x above 16 tokens; docs/kernels.md).
    ``ATOM_MXFP4_LAYOUT=rows``
    keeps the checkpoint's order.  ``layer.weight_layout`` says which, for ``apply``."""
    from atom_kernels.formats import mxfp4_rows_to_lanes

    wanted = env_choice(LAYOUT_ENV)  # one of atom_core.env.CHOICE_SWITCHES[LAYOUT_ENV], the keys of LAYOUT_CHOICES
    weight = layer.weight.data
    layer.weight_layout = LAYOUT_CHOICES[wanted](weight)
    if layer.weight_layout == "lanes":
        layer.weight.data = mxfp4_rows_to_lanes(weight)


def _is_mxfp4(spec: Any) -> bool:
    return (
        isinstance(spec, dict)
        and all(spec.get(key) == value for key, value in MXFP4_WEIGHT.items())
        and spec.get("scale_format", "e8m0") == "e8m0"
        and not spec.get("is_dynamic", False)
    )


@register_scheme("quark")
class QuarkConfig(QuantConfig):
    """AMD Quark: MXFP4 weights (per group of 32, e8m0 scales) for every linear layer not in ``exclude``."""

    name = "quark"

    def __init__(self, exclude: list[str], layer_specs: dict[str, Any]):
        self.exclude = exclude
        self.layer_specs = layer_specs  # per-layer overrides, by name glob

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> QuarkConfig:
        glob = config.get("global_quant_config") or {}
        weight = glob.get("weight")
        if not _is_mxfp4(weight):
            raise UnsupportedQuantizationError(
                f"quark global weight config {weight} is not supported (MXFP4: fp4, per_group, group_size 32, e8m0)"
            )
        acts = glob.get("input_tensors")
        if acts is not None:
            if acts.get("dtype") != "fp4":
                raise UnsupportedQuantizationError(f"quark input_tensors {acts} are not supported (none or MXFP4)")
            logger.info("quark MXFP4 activations are not quantized here: running the weights weight-only")
        for kind, spec in (config.get("layer_type_quant_config") or {}).items():
            if not _is_mxfp4((spec or {}).get("weight")):
                raise UnsupportedQuantizationError(f"quark layer_type_quant_config[{kind!r}] = {spec} is not supported")
        return cls(exclusion_patterns(config, "exclude"), dict(config.get("layer_quant_config") or {}))

    def linear_method(self, layer: LinearBase, prefix: str) -> LinearMethod | None:
        if layer_excluded(prefix, self.exclude, self.packed_modules_mapping):
            return None
        for pattern, spec in self.layer_specs.items():
            names = shard_names(prefix, self.packed_modules_mapping)
            if any(matches_any(n, [pattern]) for n in names) and not _is_mxfp4((spec or {}).get("weight")):
                raise UnsupportedQuantizationError(
                    f"{prefix}: quark layer_quant_config[{pattern!r}] = {spec} is not supported (MXFP4 only)"
                )
        return Mxfp4LinearMethod()

    def moe_method(self, layer: Any, prefix: str):
        if matches_any(prefix, self.exclude):
            return None
        from atom_core.quant.moe import Mxfp4MoEMethod

        return Mxfp4MoEMethod()


@register_scheme("mxfp4", "gpt_oss_mxfp4")
class GptOssMxfp4Config(QuantConfig):
    """gpt-oss: ``{"quant_method": "mxfp4", "modules_to_not_convert": [...]}``; MoE experts only.  (vLLM rewrites
    such a config's ``quant_method`` to ``gpt_oss_mxfp4`` in the config it builds models with: the same scheme.)"""

    name = "mxfp4"

    def __init__(self, not_converted: list[str]):
        self.not_converted = not_converted

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> QuantConfig:
        return cls(exclusion_patterns(config, "modules_to_not_convert"))

    def linear_method(self, layer: LinearBase, prefix: str) -> LinearMethod | None:
        if layer_excluded(prefix, self.not_converted, self.packed_modules_mapping):
            return None
        raise UnsupportedQuantizationError(
            f"{prefix}: a 'quant_method: mxfp4' (gpt-oss) checkpoint quantizes MoE experts only, but this dense "
            "layer is not in modules_to_not_convert"
        )

    def moe_method(self, layer: Any, prefix: str):
        if matches_any(prefix, self.not_converted):
            return None
        if getattr(layer, "activation", None) != "swigluoai":
            raise UnsupportedQuantizationError(
                f"{prefix}: gpt-oss MXFP4 experts (quant_method: mxfp4) load into GptOssForCausalLM only"
            )
        from atom_core.quant.moe import Mxfp4MoEMethod

        return Mxfp4MoEMethod()  # atom_core.models.gpt_oss splits the stacked blocks / scales per expert


def gpt_oss_expert_layout(blocks: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss ``*_blocks [E, N, K/32, 16]`` and ``*_scales [E, N, K/32]`` -> ``([E, N, K/2], [E, N, K/32])``
    uint8: the 16 bytes of each group are its 32 codes in order, so this is a view."""
    e, n, groups, width = blocks.shape
    if width != MX_GROUP // 2 or tuple(scales.shape) != (e, n, groups):
        raise UnsupportedQuantizationError(
            f"gpt-oss MXFP4 blocks {tuple(blocks.shape)} and scales {tuple(scales.shape)} do not match "
            f"([E, N, K/32, 16] and [E, N, K/32])"
        )
    return as_bytes(blocks).reshape(e, n, groups * width), as_bytes(scales)
