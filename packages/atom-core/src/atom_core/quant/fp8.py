"""FP8 e4m3 linear layers and the ``quant_method: fp8`` checkpoint format.

Three weight layouts, each a :class:`LinearMethod` whose parameters keep the checkpoint's names:

* per tensor: ``weight`` fp8 ``[N, K]``, ``weight_scale`` one per checkpoint tensor (so one per shard
  of a fused layer), optional static ``input_scale`` (one per shard; the largest is used, as the
  shards share their input).  The shard scales become one scale per output channel after loading,
  so the layer runs the same per-token x per-channel GEMM as PTPC without requantizing anything.
* per channel (PTPC): ``weight`` fp8 ``[N, K]``, ``weight_scale`` fp32 ``[N, 1]``; activations are
  quantized per token at run time.
* block (DeepSeek-V3): ``weight`` fp8 ``[N, K]``, ``weight_scale_inv`` fp32 ``[ceil(N/bn), ceil(K/bk)]``
  (the dequantization multiplier despite its name); activations per token per ``bk`` columns.

``quant_method: fp8`` checkpoints (vLLM / transformers' FP8 format) are per tensor, or block-wise when
``weight_block_size`` is given; ``activation_scheme`` is ``dynamic`` or ``static``; exclusions come from
``ignored_layers`` / ``modules_to_not_convert``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from atom_core.errors import UnsupportedQuantizationError
from atom_core.layers.params import make_param
from atom_core.quant.base import LinearMethod, QuantConfig, register_scheme
from atom_core.quant.exclusions import exclusion_patterns, layer_excluded, matches_any
from atom_core.quant.params import flat_apply, replace_param

if TYPE_CHECKING:
    from atom_core.layers.linear import LinearBase

FP8 = torch.float8_e4m3fn


class Fp8TensorLinearMethod(LinearMethod):
    """FP8 weights with one scale per checkpoint tensor, static or dynamic activation scale."""

    def __init__(self, static_input: bool):
        self.static_input = static_input

    def create_weights(self, layer: LinearBase, params_dtype: torch.dtype) -> None:
        shards = len(layer.out_partitions)
        layer.weight = make_param((sum(layer.out_partitions), layer.in_partition), FP8, output_dim=0, input_dim=1)
        layer.weight_scale = make_param((shards,), torch.float32, per_shard=True)
        if self.static_input:
            layer.input_scale = make_param((shards,), torch.float32, per_shard=True)

    def process_weights_after_loading(self, layer: LinearBase) -> None:
        sizes = torch.tensor(layer.out_partitions, device=layer.weight_scale.device)
        channel = layer.weight_scale.data.float().repeat_interleave(sizes).reshape(-1, 1)
        replace_param(layer, "weight_scale", channel.contiguous())
        if self.static_input:
            replace_param(layer, "input_scale", layer.input_scale.data.float().max().reshape(1))

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        from atom_kernels import fp8_scaled_mm, quant_fp8

        static = layer.input_scale if self.static_input else None

        def gemm(x2):
            q, s = quant_fp8(x2, None, static)
            return fp8_scaled_mm(q, s, layer.weight, layer.weight_scale, bias, x2.dtype)

        return flat_apply(x, gemm)


class Fp8ChannelLinearMethod(LinearMethod):
    """PTPC: FP8 weights with one scale per output channel, activations per token at run time."""

    scale_name = "weight_scale"

    def create_weights(self, layer: LinearBase, params_dtype: torch.dtype) -> None:
        n = sum(layer.out_partitions)
        layer.weight = make_param((n, layer.in_partition), FP8, output_dim=0, input_dim=1)
        layer.weight_scale = make_param((n, 1), torch.float32, output_dim=0)

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        from atom_kernels import fp8_scaled_mm, quant_fp8

        def gemm(x2):
            q, s = quant_fp8(x2)
            return fp8_scaled_mm(q, s, layer.weight, layer.weight_scale, bias, x2.dtype)

        return flat_apply(x, gemm)


class Fp8BlockLinearMethod(LinearMethod):
    """FP8 weights in ``bn x bk`` blocks, activations per token per ``bk`` columns at run time.
    ``scale_name`` is the checkpoint's name for the block scales (``weight_scale_inv`` in DeepSeek-V3's
    format, ``weight_scale`` in compressed-tensors')."""

    def __init__(self, block: tuple[int, int], scale_name: str = "weight_scale_inv"):
        self.block = (int(block[0]), int(block[1]))
        self.scale_name = scale_name

    def create_weights(self, layer: LinearBase, params_dtype: torch.dtype) -> None:
        bn, bk = self.block
        check_block_alignment(layer, bn, bk)
        n, k = sum(layer.out_partitions), layer.in_partition
        layer.weight = make_param((n, k), FP8, output_dim=0, input_dim=1)
        scales = make_param((-(-n // bn), -(-k // bk)), torch.float32, output_dim=0, input_dim=1,
                            out_divisor=bn, in_divisor=bk)
        setattr(layer, self.scale_name, scales)

    def apply(self, layer: LinearBase, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        from atom_kernels import fp8_block_mm, quant_fp8

        scales = getattr(layer, self.scale_name)

        def gemm(x2):
            q, s = quant_fp8(x2, self.block[1])
            return fp8_block_mm(q, s, layer.weight, scales, self.block, bias, x2.dtype)

        return flat_apply(x, gemm)


def check_block_alignment(layer: LinearBase, bn: int, bk: int) -> None:
    """Block scales can be split only between blocks: every shard boundary of a fused layer and every
    tensor-parallel split must fall on a block edge."""
    boundaries = []
    offset = 0
    for size in layer.out_partitions[:-1]:
        offset += size
        boundaries.append(offset)
    if layer.tp.world_size > 1 and layer.parallel == "column":
        boundaries.extend(layer.out_partitions)
    bad = [b for b in boundaries if b % bn]
    if bad:
        raise UnsupportedQuantizationError(
            f"{layer.prefix}: output shards {layer.out_partitions} (tensor-parallel size {layer.tp.world_size}) do not "
            f"fall on the {bn}-row weight blocks"
        )
    if layer.tp.world_size > 1 and layer.parallel == "row" and layer.in_partition % bk:
        raise UnsupportedQuantizationError(
            f"{layer.prefix}: the input split {layer.in_partition} per rank does not fall on the {bk}-column blocks"
        )


@register_scheme("fp8")
class Fp8Config(QuantConfig):
    """``{"quant_method": "fp8", "activation_scheme": "dynamic"|"static", "weight_block_size": [bn, bk]?,
    "ignored_layers"|"modules_to_not_convert": [...]}``."""

    name = "fp8"

    def __init__(self, activation_scheme: str, block: tuple[int, int] | None, ignored: list[str]):
        self.activation_scheme = activation_scheme
        self.block = block
        self.ignored = ignored

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Fp8Config:
        fmt = config.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise UnsupportedQuantizationError(f"fp8 checkpoints in format {fmt!r} are not supported (only e4m3)")
        scheme = config.get("activation_scheme", "dynamic")
        if scheme not in ("dynamic", "static"):
            raise UnsupportedQuantizationError(f"fp8 activation_scheme {scheme!r} is not 'dynamic' or 'static'")
        block = config.get("weight_block_size")
        if block is not None:
            if not isinstance(block, list | tuple) or len(block) != 2 or scheme != "dynamic":
                raise UnsupportedQuantizationError(
                    f"block-wise fp8 needs weight_block_size [bn, bk] and dynamic activations, got {block} / {scheme!r}"
                )
            if not all(isinstance(b, int) and b > 0 for b in block):
                raise UnsupportedQuantizationError(f"fp8 weight_block_size must be two positive integers, got {block}")
            block = (int(block[0]), int(block[1]))
        return cls(scheme, block, exclusion_patterns(config, "ignored_layers", "modules_to_not_convert"))

    def linear_method(self, layer: LinearBase, prefix: str) -> LinearMethod | None:
        if layer_excluded(prefix, self.ignored, self.packed_modules_mapping):
            return None
        if self.block is not None:
            return Fp8BlockLinearMethod(self.block)
        return Fp8TensorLinearMethod(static_input=self.activation_scheme == "static")

    def moe_method(self, layer: Any, prefix: str):
        """FP8 block experts (128 x 128); the other FP8 layouts have no expert kernel."""
        if matches_any(prefix, self.ignored):
            return None
        if self.block != (128, 128):
            raise UnsupportedQuantizationError(
                f"{prefix}: FP8 experts are supported in 128x128 blocks only (this checkpoint: "
                f"{'per tensor' if self.block is None else self.block})"
            )
        from atom_core.quant.moe import Fp8BlockMoEMethod

        return Fp8BlockMoEMethod()
