"""Layouts an architecture's own published quantized checkpoints use, which ``atom quantize`` writes for that
architecture in place of the scheme's generic layout (:mod:`atom_core.quant.quantize`).

:data:`NATIVE_LAYOUTS` maps ``(scheme, architecture)`` to a :class:`NativeLayout`; a pair not in it gets the
generic layout (``mxfp4``: AMD Quark's dense MXFP4).

* ``("mxfp4", "GptOssForCausalLM")``: the layout of openai/gpt-oss-20b / -120b, which transformers'
  ``integrations/mxfp4.py`` and vLLM's ``GptOssForCausalLM`` (``gpt_oss_mxfp4``) load: only the MoE experts are
  quantized.  A stacked ``<layer>.mlp.experts.gate_up_proj`` ``[E, H, 2I]`` (in x out, gate and up columns
  interleaved) becomes ``gate_up_proj_blocks`` uint8 ``[E, 2I, H/32, 16]`` and ``gate_up_proj_scales`` uint8 e8m0
  ``[E, 2I, H/32]`` (out x in: the rows keep the interleaving), ``down_proj`` ``[E, I, H]`` becomes
  ``down_proj_blocks [E, H, I/32, 16]`` / ``down_proj_scales [E, H, I/32]``; each group of 32 codes is 16 bytes,
  element 2i in the low nibble.  Every other tensor (attention, router, embeddings, norms, sinks, the expert
  biases) is copied as it is, and ``quantization_config`` is ``{"quant_method": "mxfp4",
  "modules_to_not_convert": [...]}`` as the published checkpoints spell it.
* ``("mxfp4", "KimiK25ForConditionalGeneration")``: the layout of amd/Kimi-K2.5-MXFP4 (an :class:`ExpertsOnly`
  layout): AMD Quark MXFP4 on the routed experts only, under the checkpoint's own names
  (``language_model.model.layers.N.mlp.experts.E.gate_proj.weight`` uint8 ``[N, K/2]`` + ``.weight_scale`` e8m0
  ``[N, K/32]``); the latent attention, the shared experts, the dense MLPs, the routers, the vision tower, the
  merger and ``lm_head`` stay unquantized and are listed in ``exclude`` by their checkpoint names; activations are
  declared MXFP4 (``input_tensors``, W4A4 as published for MI355), which ATOM runs weight-only where there is no
  FP4 math.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from atom_core.config import text_config
from atom_core.errors import UnsupportedQuantizationError
from atom_core.layers.params import materialize
from atom_core.quant.mxfp4 import MX_GROUP


@dataclass(frozen=True)
class NativeLayout:
    name: str  # what the log and errors call it
    # a checkpoint tensor (name, value, device to encode on) -> the tensors to write for it, or None to copy it as is
    encode: Callable[[str, torch.Tensor, torch.device], dict[str, torch.Tensor] | None]
    check: Callable[[Any], None]  # raises UnsupportedQuantizationError for a config the layout cannot hold
    quantization_config: dict[str, Any]


_GPT_OSS_EXPERTS = re.compile(r"^(?:.*\.)?experts\.(?:gate_up_proj|down_proj)$")
# openai/gpt-oss-20b and -120b: everything but the experts stays unquantized
GPT_OSS_NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def _gpt_oss_experts(name: str, tensor: torch.Tensor, device: torch.device) -> dict[str, torch.Tensor] | None:
    """A stacked ``[E, K, N]`` (in x out) expert projection -> its ``_blocks [E, N, K/32, 16]`` and
    ``_scales [E, N, K/32]``."""
    from atom_kernels.formats import quantize_mxfp4

    if not _GPT_OSS_EXPERTS.match(name):
        return None
    w = materialize(tensor)
    if w.dim() != 3:
        raise UnsupportedQuantizationError(f"{name}: expected stacked experts [E, in, out], got shape {tuple(w.shape)}")
    # one expert at a time: the encoder's temporaries for all experts of a gpt-oss-120b layer would not fit a GPU
    encoded = [quantize_mxfp4(w[e].to(device).T.contiguous()) for e in range(w.shape[0])]
    packed = torch.stack([p.cpu() for p, _ in encoded])
    scales = torch.stack([s.view(torch.uint8).cpu() for _, s in encoded])
    e, n, half_k = packed.shape
    return {f"{name}_blocks": packed.reshape(e, n, half_k * 2 // MX_GROUP, MX_GROUP // 2), f"{name}_scales": scales}


def _gpt_oss_fits(hf_config: Any) -> None:
    text = text_config(hf_config)
    sizes = {"hidden_size": text.hidden_size, "intermediate_size": text.intermediate_size}
    bad = {key: size for key, size in sizes.items() if size % MX_GROUP}
    if bad:
        raise UnsupportedQuantizationError(
            f"gpt-oss MXFP4 experts need hidden_size and intermediate_size divisible by {MX_GROUP}, got "
            + ", ".join(f"{key} {size}" for key, size in bad.items())
        )


GPT_OSS_MXFP4 = NativeLayout(
    "gpt-oss MXFP4 experts", _gpt_oss_experts, _gpt_oss_fits,
    {"quant_method": "mxfp4", "modules_to_not_convert": GPT_OSS_NOT_CONVERTED},
)

@dataclass(frozen=True)
class ExpertsOnly:
    """The scheme's generic tensors on the routed MoE experts only: every linear layer is copied as it is and listed
    in the exclusions; ``config`` is merged (key by key) into the scheme's ``quantization_config``."""

    name: str
    config: dict[str, Any]


# Quark's dynamic MXFP4 activations (``input_tensors``), as AMD's MI355 checkpoints declare them
QUARK_MXFP4_ACTIVATIONS = {"dtype": "fp4", "qscheme": "per_group", "group_size": MX_GROUP, "ch_axis": -1,
                           "scale_format": "e8m0", "is_dynamic": True, "symmetric": None}
KIMI_K25_MXFP4 = ExpertsOnly("Kimi-K2.5 MXFP4 experts",
                             {"global_quant_config": {"input_tensors": QUARK_MXFP4_ACTIVATIONS}})

# (scheme, architecture) -> the layout that architecture's published checkpoints of that scheme use
NATIVE_LAYOUTS: dict[tuple[str, str], NativeLayout | ExpertsOnly] = {
    ("mxfp4", "GptOssForCausalLM"): GPT_OSS_MXFP4,
    ("mxfp4", "KimiK25ForConditionalGeneration"): KIMI_K25_MXFP4,
}


def native_layout(scheme: str, architecture: str) -> NativeLayout | ExpertsOnly | None:
    return NATIVE_LAYOUTS.get((scheme, architecture))
