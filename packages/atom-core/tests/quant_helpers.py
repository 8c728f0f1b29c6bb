"""Helpers of the quantization tests: the transformers reference run with a quantized checkpoint's
dequantized weights (and, for FP8 schemes, the same activation quantization applied in forward hooks),
and the logit metrics the tests bound."""

from __future__ import annotations

import torch
from safetensors import safe_open
from torch import nn

from atom_kernels import formats

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
           "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "wq_b", "wk")  # wq_b, wk: the DSA indexer
# layers ATOM runs on their dequantized weight, unquantized activations: latent attention absorbs kv_b_proj
WEIGHT_ONLY = ("kv_b_proj",)


def read_tensors(model_dir) -> dict[str, torch.Tensor]:
    from atom_core.loader import Checkpoint

    checkpoint = Checkpoint(model_dir)
    out = {}
    for file in checkpoint.files:
        with safe_open(f"{model_dir}/{file}", framework="pt") as handle:
            out.update({name: handle.get_tensor(name) for name in handle.keys()})
    return out


def dequantized_weight(tensors: dict[str, torch.Tensor], module: str, scheme: str) -> torch.Tensor | None:
    """The weight ATOM computes with for ``module`` of a checkpoint written by ``atom quantize``."""
    w = tensors.get(f"{module}.weight")
    if scheme == "fp8-block" and f"{module}.weight_scale_inv" in tensors:
        return formats.dequantize_fp8_blocks(w, tensors[f"{module}.weight_scale_inv"])
    if scheme == "ptpc-fp8" and f"{module}.weight_scale" in tensors:
        return formats.dequantize_fp8(w, tensors[f"{module}.weight_scale"])
    if scheme == "mxfp4" and f"{module}.weight_scale" in tensors:
        return formats.dequantize_mxfp4(w, tensors[f"{module}.weight_scale"])
    return None


# activation quantization of each scheme, as the ATOM reference kernels do it
FAKE_ACT = {
    "ptpc-fp8": lambda x: formats.dequantize_fp8(*formats.quantize_fp8_per_row(x)),
    "fp8-block": lambda x: _fake_group(x, 128),
    "mxfp4": None,  # weight-only
}


def _fake_group(x: torch.Tensor, group: int) -> torch.Tensor:
    q, s = formats.quantize_fp8_per_group(x, group)
    return q.float() * s.repeat_interleave(group, dim=-1)[..., : x.shape[-1]]


def reference_with_quantized_weights(hf: nn.Module, quantized_dir: str, scheme: str,
                                     checkpoint_name=lambda name: name) -> nn.Module:
    """``hf`` with every quantized linear's weight replaced by its dequantized value and, for FP8,
    a pre-hook that quantizes the linear's input like ATOM does.  ``checkpoint_name``: a transformers module name
    as the checkpoint spells it (where the two differ)."""
    tensors = read_tensors(quantized_dir)
    _replace_experts(hf, tensors, scheme, checkpoint_name)
    fake = FAKE_ACT[scheme]
    for name, module in hf.named_modules():
        if not isinstance(module, nn.Linear) or name.split(".")[-1] not in LINEARS:
            continue
        weight = dequantized_weight(tensors, checkpoint_name(name), scheme)
        if weight is None:
            continue
        module.weight.data = weight.to(module.weight.dtype)
        if fake is not None and name.split(".")[-1] not in WEIGHT_ONLY:
            module.register_forward_pre_hook(lambda _m, args: (fake(args[0].float()).to(args[0].dtype),))
    return hf


def _replace_experts(hf: nn.Module, tensors: dict[str, torch.Tensor], scheme: str, checkpoint_name) -> None:
    """transformers' stacked experts (``gate_up_proj [E, 2I, H]``, ``down_proj [E, H, I]``) get the
    dequantized per-expert weights; for FP8 blocks their forward also rounds each GEMM's input rows
    per 128 columns, as the fused MoE kernels do."""
    for name, module in hf.named_modules():
        if not (hasattr(module, "gate_up_proj") and hasattr(module, "down_proj") and name.endswith("experts")):
            continue
        name = checkpoint_name(name)
        gates = [dequantized_weight(tensors, f"{name}.{e}.gate_proj", scheme) for e in range(module.num_experts)]
        if gates[0] is None:
            continue  # experts left unquantized
        ups = [dequantized_weight(tensors, f"{name}.{e}.up_proj", scheme) for e in range(module.num_experts)]
        downs = [dequantized_weight(tensors, f"{name}.{e}.down_proj", scheme) for e in range(module.num_experts)]
        module.gate_up_proj.data = torch.stack([torch.cat([g, u]) for g, u in zip(gates, ups)]).to(module.gate_up_proj.dtype)
        module.down_proj.data = torch.stack(downs).to(module.down_proj.dtype)
        if FAKE_ACT[scheme] is not None:
            module.forward = _fake_quant_experts_forward(module, FAKE_ACT[scheme])


def _fake_quant_experts_forward(module: nn.Module, fake):
    """transformers' expert loop (Qwen3-MoE) with the inputs of both GEMMs fake-quantized."""
    import torch.nn.functional as F

    def forward(hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for expert in range(module.num_experts):
            slot, token = torch.where((top_k_index == expert).t())
            if token.numel() == 0:
                continue
            gate, up = F.linear(fake(hidden_states[token].float()), module.gate_up_proj[expert].float()).chunk(2, dim=-1)
            act = fake((module.act_fn(gate) * up).to(hidden_states.dtype).float())
            y = F.linear(act, module.down_proj[expert].float()) * top_k_weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        return out

    return forward


def logit_metrics(got: list[torch.Tensor], want: list[torch.Tensor]) -> tuple[float, float, float]:
    """(relative error ``||got - want|| / ||want||``, max ``|got - want|``, top-1 agreement), over all
    positions of all prompts."""
    g, w = torch.cat(got).float(), torch.cat(want).float()
    rel = ((g - w).norm() / w.norm()).item()
    return rel, (g - w).abs().max().item(), (g.argmax(-1) == w.argmax(-1)).float().mean().item()


def rewrite_checkpoint(src, dst, config, tensors):
    """A copy of checkpoint ``src`` at ``dst`` with ``config`` as its quantization_config and ``tensors`` as its weights."""
    import json
    import shutil

    from safetensors.torch import save_file

    shutil.copytree(src, dst)
    data = json.loads(open(f"{src}/config.json").read())
    data["quantization_config"] = config
    (dst / "config.json").write_text(json.dumps(data))
    save_file(tensors, str(dst / "model.safetensors"))
    return str(dst)
