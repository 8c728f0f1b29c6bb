"""Quantized experts of :class:`atom_core.layers.moe.FusedMoE` (the ``moe_method`` of a scheme).

Parameters keep the checkpoint's per-expert names through the expert mapping
(``experts.<e>.gate_proj.weight_scale_inv`` -> ``experts.w13_weight_scale_inv``, shard ``("gate", e)``):

* FP8 block (``quant_method: fp8`` with ``weight_block_size``, e.g. Qwen3-30B-A3B-FP8): ``w13_weight``
  fp8 ``[E, 2I, H]``, ``w13_weight_scale_inv`` ``[E, 2I/128, ceil(H/128)]``, ``w2_weight`` fp8
  ``[E, H, I]``, ``w2_weight_scale_inv`` ``[E, ceil(H/128), I/128]``; I (per rank) a multiple of 128.
* MXFP4 (Quark): ``w13_weight`` uint8 ``[E, 2I, H/2]``, ``w13_weight_scale`` e8m0 ``[E, 2I, H/32]``,
  ``w2_weight`` uint8 ``[E, H, I/2]``, ``w2_weight_scale`` ``[E, H, I/32]``.

Both run ``atom_kernels.fused_moe`` with an :class:`ExpertQuant`.  Online quantization loads the
unquantized experts and encodes them per expert after loading.  (Imported by the schemes' ``moe_method``
only, once the MoE layer module is loaded.)
"""

from __future__ import annotations

from typing import Any

import torch

from atom_core.errors import UnsupportedQuantizationError
from atom_core.layers.moe import FusedMoE, MoEMethod, UnquantizedMoEMethod
from atom_core.quant.params import MX_GROUP, as_bytes, check_scale_range, replace_param

BLOCK = 128
FP8 = torch.float8_e4m3fn


def _bytes_param(layer: FusedMoE, shape, group: str, inter_divisor: int = 1):
    """An expert parameter of raw bytes: e8m0 checkpoint tensors are copied bit for bit."""
    param = layer.expert_param(shape, torch.uint8, group, inter_divisor=inter_divisor)
    param.weight_loader = lambda p, loaded, shard_id=None: layer.weight_loader(p, as_bytes(loaded), shard_id)
    return param


def _run(layer: FusedMoE, x, topk_weights, topk_ids, quant):
    from atom_kernels import fused_moe

    return fused_moe(x, layer.w13_weight, layer.w2_weight, topk_weights, topk_ids, expert_map=layer.expert_map,
                     quant=quant, **layer.kernel_options())


class Fp8BlockMoEMethod(MoEMethod):
    """FP8 experts in 128 x 128 blocks; activations quantized per token per 128 columns."""

    scale_suffix = "weight_scale_inv"

    def create_weights(self, layer: FusedMoE, params_dtype: torch.dtype) -> None:
        experts, inter, hidden = layer.num_local_experts, layer.inter_partition, layer.hidden_size
        if inter % BLOCK:
            raise UnsupportedQuantizationError(
                f"{layer.prefix}: FP8 block experts need an intermediate size per rank divisible by {BLOCK}, got {inter}"
            )
        layer.w13_weight = layer.expert_param((experts, 2 * inter, hidden), FP8, "w13")
        layer.w2_weight = layer.expert_param((experts, hidden, inter), FP8, "w2")
        hb = -(-hidden // BLOCK)
        setattr(layer, f"w13_{self.scale_suffix}",
                layer.expert_param((experts, 2 * inter // BLOCK, hb), torch.float32, "w13", inter_divisor=BLOCK))
        setattr(layer, f"w2_{self.scale_suffix}",
                layer.expert_param((experts, hb, inter // BLOCK), torch.float32, "w2", inter_divisor=BLOCK))

    def expert_quant(self, layer: FusedMoE):
        from atom_kernels import ExpertQuant

        return ExpertQuant("fp8-block", getattr(layer, f"w13_{self.scale_suffix}"),
                           getattr(layer, f"w2_{self.scale_suffix}"), (BLOCK, BLOCK), FP8)

    def apply(self, layer: FusedMoE, x, topk_weights, topk_ids):
        return _run(layer, x, topk_weights, topk_ids, self.expert_quant(layer))


class Mxfp4MoEMethod(MoEMethod):
    """MXFP4 experts (weight-only), Quark's per-expert ``weight`` / ``weight_scale``."""

    def create_weights(self, layer: FusedMoE, params_dtype: torch.dtype) -> None:
        experts, inter, hidden = layer.num_local_experts, layer.inter_partition, layer.hidden_size
        if inter % MX_GROUP or hidden % MX_GROUP:
            raise UnsupportedQuantizationError(
                f"{layer.prefix}: MXFP4 experts need hidden and intermediate sizes (per rank) divisible by {MX_GROUP}, "
                f"got {hidden} and {inter}"
            )
        layer.w13_weight = _bytes_param(layer, (experts, 2 * inter, hidden // 2), "w13")
        layer.w13_weight_scale = _bytes_param(layer, (experts, 2 * inter, hidden // MX_GROUP), "w13")
        layer.w2_weight = _bytes_param(layer, (experts, hidden, inter // 2), "w2", inter_divisor=2)
        layer.w2_weight_scale = _bytes_param(layer, (experts, hidden, inter // MX_GROUP), "w2", inter_divisor=MX_GROUP)

    def process_weights_after_loading(self, layer: FusedMoE) -> None:
        check_scale_range(layer.prefix, layer.w13_weight_scale.data)
        check_scale_range(layer.prefix, layer.w2_weight_scale.data)

    def expert_quant(self, layer: FusedMoE):
        from atom_kernels import ExpertQuant

        return ExpertQuant("mxfp4", layer.w13_weight_scale, layer.w2_weight_scale)

    def apply(self, layer: FusedMoE, x, topk_weights, topk_ids):
        return _run(layer, x, topk_weights, topk_ids, self.expert_quant(layer))


def _quantize_fp8_experts(layer: FusedMoE) -> None:
    from atom_kernels.formats import quantize_fp8_blocks

    w13, w2 = layer.w13_weight.data, layer.w2_weight.data
    inter = w2.shape[2]
    q13, s13, q2, s2 = [], [], [], []
    for e in range(w13.shape[0]):
        gate, gs = quantize_fp8_blocks(w13[e, :inter])
        up, us = quantize_fp8_blocks(w13[e, inter:])
        q13.append(torch.cat([gate, up]))
        s13.append(torch.cat([gs, us]))
        q, s = quantize_fp8_blocks(w2[e])
        q2.append(q)
        s2.append(s)
    replace_param(layer, "w13_weight", torch.stack(q13))
    replace_param(layer, "w2_weight", torch.stack(q2))
    replace_param(layer, "w13_weight_scale_inv", torch.stack(s13))
    replace_param(layer, "w2_weight_scale_inv", torch.stack(s2))


def _quantize_mxfp4_experts(layer: FusedMoE) -> None:
    from atom_kernels.formats import quantize_mxfp4

    for group in ("w13", "w2"):
        packed, scales = quantize_mxfp4(getattr(layer, f"{group}_weight").data)
        check_scale_range(layer.prefix, scales)
        replace_param(layer, f"{group}_weight", packed)
        replace_param(layer, f"{group}_weight_scale", scales)


class OnlineMoEMethod(MoEMethod):
    """Loads the experts unquantized, encodes them after loading, runs ``runner``'s kernel call."""

    QUANTIZERS: dict[str, Any] = {"fp8-block": (_quantize_fp8_experts, Fp8BlockMoEMethod),
                                  "mxfp4": (_quantize_mxfp4_experts, Mxfp4MoEMethod)}

    def __init__(self, scheme: str):
        self.quantize, runner = self.QUANTIZERS[scheme]
        self.runner = runner()
        self.scheme = scheme

    def create_weights(self, layer: FusedMoE, params_dtype: torch.dtype) -> None:
        inter, hidden = layer.inter_partition, layer.hidden_size
        multiple = BLOCK if self.scheme == "fp8-block" else MX_GROUP
        if inter % multiple or (self.scheme == "mxfp4" and hidden % MX_GROUP):
            raise UnsupportedQuantizationError(
                f"{layer.prefix}: online {self.scheme} experts need an intermediate size per rank divisible by "
                f"{multiple}, got {inter}"
            )
        UnquantizedMoEMethod().create_weights(layer, params_dtype)

    def process_weights_after_loading(self, layer: FusedMoE) -> None:
        self.quantize(layer)

    def apply(self, layer: FusedMoE, x, topk_weights, topk_ids):
        return self.runner.apply(layer, x, topk_weights, topk_ids)
