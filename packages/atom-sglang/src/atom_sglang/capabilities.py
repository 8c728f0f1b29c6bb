"""What the SGLang wrapper of a catalog model does for each capability the catalog entry declares.

A capability this adapter does not implement yet is listed with what it needs.  Architectures that
declare one stay SGLang's own (a log line says why) unless ATOM_TAKE_OVER names them or SGLang has no class of
its own; then they get a class in ``EntryClass`` that refuses to build, and an error line names the
architecture and what is missing — never a half-working wrapper (:func:`atom_sglang.wrapper.entry_classes`).  The
capability names are shared with atom-vllm.  Imports neither torch nor SGLang.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from atom_core import catalog
from atom_core.catalog import COMPRESSED_ATTENTION, HYBRID, MLA, MROPE, MULTIMODAL, SPARSE_ATTENTION, TEXT


@dataclass(frozen=True)
class Extension:
    needs: str  # what the wrapper and the SGLang host must provide for this capability
    implemented: bool = True
    mixin: str | None = None  # "module:Class" placed before SGLangCausalLM in the wrapper's bases


EXTENSIONS: dict[str, Extension] = {
    TEXT: Extension(
        "the base wrapper: __init__(config, quant_config=None, prefix=''), forward(input_ids, positions, "
        "forward_batch, input_embeds=None, pp_proxy_tensors=None) -> LogitsProcessorOutput, load_weights, "
        "get_embed_and_head/set_embed_and_head, packed_modules_mapping; RadixAttention; SGLang's TP group"
    ),
    MROPE: Extension(
        "positions [3, T] from forward_batch.mrope_positions, which SGLang fills when the config's rope "
        "parameters carry mrope_section (the wrapper swaps them in; the model takes [3, T] positions, and 1-D "
        "ones when SGLang serves the checkpoint text-only)"
    ),
    HYBRID: Extension(
        "SGLangHost.linear_attention_state (atom_sglang.linear_attention): each GDN layer's step() reads SGLang's mamba "
        "pool (req_to_token_pool.mamba2_layer_cache(layer_id): conv [slots, conv_dim, W-1], SSM V-major "
        "[slots, HV, V, K]) and the slots and query offsets its hybrid linear-attention backend prepared "
        "(forward_metadata.mamba_cache_indices / query_start_loc; extend_prefix_lens > 0 = initial state); "
        "SGLang must recognise the config as hybrid (its config classes, or register_linear_attn_model) and plan "
        "its pool for exactly the model's GDN layers (checked at build); no extra_buffer radix strategy, no "
        "speculative decoding",
    ),
    MULTIMODAL: Extension(
        "images through SGLang's own processor for the architecture (matched by class name), pad_input_ids, "
        "get_image_feature -> the ATOM model's embed_multimodal, general_mm_embed_routine merging the image "
        "embeddings (and deepstack features, as a dense Deepstack) before the language model; no videos",
        mixin="atom_sglang.multimodal:SGLangMultimodal",
    ),
    MLA: Extension(
        "SGLangHost.attention(mla=...) (atom_sglang.latent): a RadixAttention over SGLang's latent KV pool (one kv "
        "head of kv_lora_rank + qk_rope_head_dim, v_head_dim kv_lora_rank) with W_UK absorbed into the query and "
        "W_UV after it on every step (split from atom-core's kv_b_proj after loading), SGLang sizing that pool from "
        "the config (its ModelConfig lists the architecture as MLA); attention backends torch_native and triton, "
        "no decode context parallelism"
    ),
    SPARSE_ATTENTION: Extension(
        "SGLangHost.attention(mla=LatentAttentionSpec(sparse=...)) (atom_sglang.sparse): SGLang's DSA KV pool (its "
        "ModelConfig lists the architecture as DSA) holding each token's latent row and its FP8 indexer key; every "
        "step runs atom-kernels' indexer_scores / topk_indices / sparse_mla over those pools through req_to_token "
        "(SGLang's attention backend is not called for these layers); an unpooled index (index_kpool 1), a bf16/fp32 "
        "latent, no decode context parallelism, no speculative decoding, no CUDA graphs"
    ),
    COMPRESSED_ATTENTION: Extension(
        "SGLangHost.attention(compressed=CompressedAttentionSpec(...)): DeepSeek-V4's caches in SGLang (the "
        "sliding window of shared K=V, the compressors' partial windows, the compressed entries, the CSA index "
        "keys) and the step over them (atom_core.runtime.compressed_attention is the native host's); not "
        "started: DeepSeek-V4 runs in the native runner only",
        implemented=False,
    ),
    "pipeline-parallel": Extension(
        "models built for a [start_layer, end_layer) slice with start_layer/end_layer attributes, PPProxyTensors "
        "{hidden_states, residual} in and out of forward",
        implemented=False,
    ),
}


def missing(spec: catalog.ArchSpec) -> list[str]:
    """Why atom-sglang cannot serve ``spec`` yet (empty when it can)."""
    return catalog.unserved_reasons(spec, EXTENSIONS, "atom-sglang")


def mixins(spec: catalog.ArchSpec) -> list[type]:
    """The wrapper mixins of ``spec``'s capabilities, in capability order (imports them)."""
    classes = []
    for capability in sorted(spec.capabilities):
        path = EXTENSIONS[capability].mixin
        if path is not None:
            module, _, name = path.partition(":")
            classes.append(getattr(importlib.import_module(module), name))
    return classes


def plan() -> tuple[list[str], dict[str, str]]:
    """(architectures served, {architecture: why not} for the rest), in catalog order."""
    return catalog.host_plan(EXTENSIONS, "atom-sglang")
