"""What the vLLM wrapper of a catalog model adds for each capability it declares.

A catalog entry's ``capabilities`` pick the vLLM interfaces its wrapper class implements.  A capability
this adapter does not implement yet is listed with what it needs; architectures that declare one are
not registered (vLLM's own implementation keeps serving them, with a warning) until it is.
Imports neither torch nor vLLM: the plugin calls :func:`plan` at load.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from atom_core import catalog
from atom_core.catalog import TEXT


@dataclass(frozen=True)
class Extension:
    needs: str  # what the wrapper (and the host) must provide for this capability
    bases: tuple[str, ...] = ()  # "module:Class" of the vLLM interfaces the wrapper derives from
    flag: str | None = None  # the flag vLLM's inspection reports for it (registry._ModelInfo)
    implemented: bool = True


EXTENSIONS: dict[str, Extension] = {
    TEXT: Extension(
        "the base wrapper (vLLM's VllmModelForTextGeneration): __init__(*, vllm_config, prefix), forward, "
        "embed_input_ids, compute_logits, load_weights -> set[str], packed_modules_mapping",
        flag="is_text_generation_model",
    ),
    "pipeline-parallel": Extension(
        "SupportsPP: atom-core models built for a [start_layer, end_layer) slice (vLLM's PPMissingLayer "
        "elsewhere), forward taking/returning IntermediateTensors {hidden_states, residual}, "
        "make_empty_intermediate_tensors (required by vLLM <= 0.27, see compat)",
        bases=("vllm.model_executor.models.interfaces:SupportsPP",), flag="supports_pp", implemented=False,
    ),
    "hybrid": Extension(
        "IsHybrid (+ HasInnerState): classmethods get_mamba_state_shape_from_config, "
        "get_mamba_state_dtype_from_config, get_mamba_state_copy_func (vLLM 0.15.1+); "
        "VllmHost.linear_attention_state returning a vLLM MambaBase layer registered in "
        "static_forward_context (mamba_type: str <= 0.20.2, enum 0.21+; bind_kv_cache 0.28+) that reads "
        "its conv/SSM state and slot indices from the forward context",
        bases=("vllm.model_executor.models.interfaces:IsHybrid", "vllm.model_executor.models.interfaces:HasInnerState"),
        flag="is_hybrid", implemented=False,
    ),
    "multimodal": Extension(
        "SupportsMultiModal: embed_multimodal(**kwargs) (0.11.1+ name), embed_input_ids merging the "
        "multimodal embeddings, get_placeholder_str, and a processor registered with "
        "MULTIMODAL_REGISTRY.register_processor (processing info, dummy-inputs builder)",
        bases=("vllm.model_executor.models.interfaces:SupportsMultiModal",), flag="supports_multimodal",
        implemented=False,
    ),
    "mrope": Extension(
        "SupportsMRoPE: get_mrope_input_positions(input_tokens, mm_features) -> (positions [3, T], delta) "
        "(0.11.1+ signature); forward then receives positions of shape [3, T]",
        bases=("vllm.model_executor.models.interfaces:SupportsMRoPE",), implemented=False,
    ),
}


def missing(spec: catalog.ArchSpec) -> list[str]:
    """Why the adapter cannot serve ``spec`` yet (empty when it can)."""
    reasons = []
    for capability in sorted(spec.capabilities):
        ext = EXTENSIONS.get(capability)
        if ext is None:
            reasons.append(f"capability {capability!r} is unknown to atom-vllm")
        elif not ext.implemented:
            reasons.append(f"capability {capability!r} needs {ext.needs.split(':')[0]}")
    return reasons


def plan() -> tuple[list[str], dict[str, str]]:
    """(architectures served, {architecture: why not} for the rest), in catalog order."""
    served, skipped = [], {}
    for name, spec in catalog.ARCHITECTURES.items():
        reasons = missing(spec)
        if reasons:
            skipped[name] = "; ".join(reasons)
        else:
            served.append(name)
    return served, skipped


def vllm_bases(spec: catalog.ArchSpec) -> tuple[type, ...]:
    """The vLLM interface classes the wrapper of ``spec`` derives from (imports vLLM)."""
    bases = []
    for capability in sorted(spec.capabilities):
        for target in EXTENSIONS[capability].bases:
            module, _, name = target.partition(":")
            bases.append(getattr(importlib.import_module(module), name))
    return tuple(bases)


def expected_flags(spec: catalog.ArchSpec) -> dict[str, bool]:
    """The capability flags vLLM's inspection must report for the wrapper of ``spec``."""
    return {ext.flag: capability in spec.capabilities for capability, ext in EXTENSIONS.items() if ext.flag}
