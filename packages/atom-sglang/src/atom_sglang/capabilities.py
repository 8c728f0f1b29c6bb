"""What the SGLang wrapper of a catalog model does for each capability the catalog entry declares.

A capability this adapter does not implement yet is listed with what it needs.  Architectures that
declare one are left out of ``EntryClass`` (SGLang keeps serving them with its own implementation) and
an error line names the architecture and what is missing — never a half-working wrapper.  The
capability names are shared with atom-vllm.  Imports neither torch nor SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass

from atom_core import catalog
from atom_core.catalog import HYBRID, MROPE, MULTIMODAL, TEXT


@dataclass(frozen=True)
class Extension:
    needs: str  # what the wrapper and the SGLang host must provide for this capability
    implemented: bool = True


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
        "SGLangHost.linear_attention_state returning an atom_core.host.LinearAttentionState whose step() reads "
        "SGLang's hybrid linear-attention backend: the layer's conv and SSM pools from its mamba pool "
        "(req_to_token_pool.mamba2_layer_cache(layer_id); ssm_layout as SGLang stores it) and this step's slot "
        "indices and decode/prefill split (forward_metadata.mamba_cache_indices, the batch's extend lengths); "
        "architectures whose config SGLang does not recognise as hybrid declared with register_linear_attn_model "
        "(compat) from the plugin",
        implemented=False,
    ),
    MULTIMODAL: Extension(
        "a multimodal processor package (SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE: BaseMultimodalProcessor subclasses "
        "whose `models` list the generated classes), pad_input_ids, the vision encoder's feature hook and the merge of "
        "image embeddings into input_embeds before the language model",
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
    reasons = []
    for capability in sorted(spec.capabilities):
        ext = EXTENSIONS.get(capability)
        if ext is None:
            reasons.append(f"capability {capability!r} is unknown to atom-sglang (add it to atom_sglang.capabilities)")
        elif not ext.implemented:
            reasons.append(f"capability {capability!r} needs {ext.needs}")
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
