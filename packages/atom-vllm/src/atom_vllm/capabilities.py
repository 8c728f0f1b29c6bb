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
from atom_core.catalog import COMPRESSED_ATTENTION, HYBRID, MLA, MROPE, MULTIMODAL, SPARSE_ATTENTION, TEXT


@dataclass(frozen=True)
class Extension:
    needs: str  # what the wrapper (and the host) must provide for this capability
    bases: tuple[str, ...] = ()  # "module:Class" of the vLLM interfaces the wrapper derives from
    # the flags vLLM reports for it: inspection's registry._ModelInfo fields, and supports_mrope (asked of the
    # class with vllm's interfaces.supports_mrope: it is not an inspection field)
    flags: tuple[str, ...] = ()
    implemented: bool = True
    mixin: str | None = None  # "module:Class" of atom-vllm's implementation of those interfaces


INTERFACES = "vllm.model_executor.models.interfaces"

EXTENSIONS: dict[str, Extension] = {
    TEXT: Extension(
        "the base wrapper (vLLM's VllmModelForTextGeneration): __init__(*, vllm_config, prefix), forward, "
        "embed_input_ids, compute_logits, load_weights -> set[str], packed_modules_mapping; SupportsLoRA (vLLM's "
        "LoRA manager wraps ATOM's linear layers: atom_vllm.lora)",
        bases=(f"{INTERFACES}:SupportsLoRA",), flags=("is_text_generation_model", "supports_lora"),
    ),
    SPARSE_ATTENTION: Extension(
        "VllmHost.attention(mla=LatentAttentionSpec(sparse=...)): atom_vllm.sparse's own attention layer over vLLM's "
        "paged cache (latent row and indexer key per token, metadata from atom-vllm's backend builder), running "
        "atom-core's sparse step (indexer scores, top-k, sparse MLA with ATOM's kernels); eager only",
    ),
    COMPRESSED_ATTENTION: Extension(
        "VllmHost.attention(compressed=CompressedAttentionSpec(...)): DeepSeek-V4's caches in vLLM (the "
        "sliding window of shared K=V, the compressors' partial windows, the compressed entries, the CSA index "
        "keys) and the step over them (atom_core.runtime.compressed_attention is the native host's); not "
        "started: DeepSeek-V4 runs in the native runner only",
        implemented=False,
    ),
    "pipeline-parallel": Extension(
        "SupportsPP: atom-core models built for a [start_layer, end_layer) slice (vLLM's PPMissingLayer "
        "elsewhere), forward taking/returning IntermediateTensors {hidden_states, residual}, "
        "make_empty_intermediate_tensors (required by vLLM <= 0.27, see compat)",
        bases=(f"{INTERFACES}:SupportsPP",), flags=("supports_pp",), implemented=False,
    ),
    HYBRID: Extension(
        "IsHybrid + HasInnerState: classmethods get_mamba_state_shape_from_config, "
        "get_mamba_state_dtype_from_config, get_mamba_state_copy_func; VllmHost.linear_attention_state "
        "returning a vLLM MambaBase layer that reads its conv/SSM state and slots from vLLM's GDN metadata",
        bases=(f"{INTERFACES}:IsHybrid", f"{INTERFACES}:HasInnerState"), flags=("is_hybrid", "has_inner_state"),
        mixin="atom_vllm.hybrid:HybridModel",
    ),
    MULTIMODAL: Extension(
        "SupportsMultiModal: embed_multimodal(**kwargs), embed_input_ids merging the multimodal embeddings "
        "(deepstack features through a persistent buffer), get_placeholder_str, and vLLM's own processor "
        "of the architecture registered on the wrapper",
        bases=(f"{INTERFACES}:SupportsMultiModal",), flags=("supports_multimodal",),
        mixin="atom_vllm.multimodal:MultimodalModel",
    ),
    MLA: Extension(
        "VllmHost.attention(mla=...): vLLM's MLAAttention over its latent KV cache (kv_c_normed, k_pe; "
        "atom-core's kv_b_proj handed to the layer through atom_vllm.latent.LatentProjection, absorbed for "
        "decode), and vLLM sizing that cache from the config (its is_deepseek_mla model_type check)",
    ),
    MROPE: Extension(
        "SupportsMRoPE: get_mrope_input_positions(input_tokens, mm_features) -> (positions [3, T], delta) "
        "(0.11.1+ signature); forward then receives positions of shape [3, T]",
        bases=(f"{INTERFACES}:SupportsMRoPE",), flags=("supports_mrope",), mixin="atom_vllm.multimodal:MRoPEModel",
    ),
}


def missing(spec: catalog.ArchSpec) -> list[str]:
    """Why atom-vllm cannot serve ``spec`` yet (empty when it can)."""
    return catalog.unserved_reasons(spec, EXTENSIONS, "atom-vllm")


def plan() -> tuple[list[str], dict[str, str]]:
    """(architectures served, {architecture: why not} for the rest), in catalog order."""
    return catalog.host_plan(EXTENSIONS, "atom-vllm")


def _load(target: str):
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def _extensions(spec: catalog.ArchSpec) -> list[Extension]:
    return [EXTENSIONS[capability] for capability in sorted(spec.capabilities)]


def vllm_bases(spec: catalog.ArchSpec) -> tuple[type, ...]:
    """The vLLM interface classes the wrapper of ``spec`` derives from (imports vLLM)."""
    return tuple(_load(target) for ext in _extensions(spec) for target in ext.bases)


def mixins(spec: catalog.ArchSpec) -> tuple[type, ...]:
    """atom-vllm's implementations of those interfaces (they come first in the wrapper's bases)."""
    return tuple(_load(ext.mixin) for ext in _extensions(spec) if ext.mixin)


def expected_flags(spec: catalog.ArchSpec) -> dict[str, bool]:
    """The capability flags vLLM must report for the wrapper of ``spec``."""
    return {flag: capability in spec.capabilities for capability, ext in EXTENSIONS.items() for flag in ext.flags}
