"""THE list of supported architectures.

Each entry names the architecture as Hugging Face configs spell it, the ATOM class that implements it,
what it can do, which quantization formats it loads, the transformers class that is its correctness
reference, and the small config ``atom make-tiny`` builds.  The adapters register every entry with
their framework and the README's model table is generated from here.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from atom_core.errors import UnsupportedArchitectureError

TEXT = "text-generation"
HYBRID = "hybrid-linear-attention"  # per-sequence recurrent state (Gated DeltaNet) besides the KV cache
MULTIMODAL = "multimodal"  # takes images (and videos) besides text
MROPE = "mrope"  # positions are [3, T] (time, height, width), computed by the model from the prompt
MLA = "latent-attention"  # multi-head latent attention: the KV cache holds one latent per token (DeepSeek-V3)
# DeepSeek sparse attention: a lightning indexer (its own key cache) picks the top-k tokens each query attends to
SPARSE_ATTENTION = "sparse-attention"
# DeepSeek-V4: attention over a sliding window plus compressed entries (one per few tokens) kept in caches of its own
COMPRESSED_ATTENTION = "compressed-attention"


@dataclass(frozen=True)
class ArchSpec:
    name: str  # e.g. "LlamaForCausalLM"
    model: str  # "module:Class" of the ATOM implementation
    family: str
    hf_class: str  # "module:Class" of the transformers reference implementation
    model_type: str  # transformers' model_type, for building tiny configs
    capabilities: frozenset[str] = frozenset({TEXT})
    quant_formats: tuple[str, ...] = ()
    tiny: dict[str, Any] = field(default_factory=dict)  # config overrides for `atom make-tiny`
    tiny_preprocessor: dict[str, Any] = field(default_factory=dict)  # its preprocessor_config.json, if any
    # special tokens its tiny tokenizer spells at these ids: the placeholders a host's processor finds by their text
    tiny_tokens: dict[str, int] = field(default_factory=dict)
    # (regex, replacement) from the names transformers' ``save_pretrained`` writes to the published checkpoints'
    # names, where its reverse name conversion falls short (applied by ``atom make-tiny``)
    published_names: tuple[tuple[str, str], ...] = ()

    def model_class(self) -> type:
        module, _, name = self.model.partition(":")
        return getattr(importlib.import_module(module), name)

    def hf_model_class(self) -> type:
        module, _, name = self.hf_class.partition(":")
        return getattr(importlib.import_module(module), name)


# A tiny dense decoder: every head size the hosts' CPU attention accepts (64), GQA, two layers.
_TINY_DENSE = dict(
    vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=64, max_position_embeddings=512, rms_norm_eps=1e-6,
)

# A tiny Qwen3-VL: the dense decoder above with interleaved MRoPE (sections sum to head_dim / 2), and a
# two-block vision tower of 8-pixel patches whose merged 2x2 patches land in the decoder's width.
_TINY_VISION = dict(
    depth=2, hidden_size=64, intermediate_size=128, num_heads=2, patch_size=8, temporal_patch_size=2,
    spatial_merge_size=2, out_hidden_size=_TINY_DENSE["hidden_size"], num_position_embeddings=16,
    deepstack_visual_indexes=[0, 1],
)
_TINY_QWEN3_VL = dict(
    text_config=dict(_TINY_DENSE, rope_parameters={
        "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [12, 10, 10], "mrope_interleaved": True,
    }),
    vision_config=_TINY_VISION,
    # placeholder ids above the tiny tokenizer's 384 tokens
    image_token_id=500, video_token_id=501, vision_start_token_id=502, vision_end_token_id=503,
    tie_word_embeddings=False,
)
_TINY_QWEN_VL_IMAGES = {
    "image_processor_type": "Qwen2VLImageProcessor", "patch_size": _TINY_VISION["patch_size"],
    "temporal_patch_size": _TINY_VISION["temporal_patch_size"], "merge_size": _TINY_VISION["spatial_merge_size"],
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "size": {"shortest_edge": 16 * 16, "longest_edge": 64 * 64},  # images of 256 to 4096 pixels
}

# Tiny mixture-of-experts decoders: 8 experts of 96 intermediate features, top-2/4.
_TINY_MOE = dict(_TINY_DENSE, tie_word_embeddings=False)

# A tiny DeepSeek-V3: latent attention with a q LoRA and YaRN (mscale folded into the softmax scale), layers
# 0-1 dense, layer 2 sparse: sigmoid routing over 4 groups of 4 experts (2 groups kept), one shared expert.
# ``topk_method``/``scoring_func`` are DeepSeek-V3's own config keys (transformers and ATOM route this way without
# them; vLLM's own class reads them).
_TINY_DEEPSEEK_V3 = dict(
    _TINY_MOE, num_hidden_layers=3, first_k_dense_replace=2, num_key_value_heads=4, q_lora_rank=96, kv_lora_rank=64,
    qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=48, head_dim=16, n_routed_experts=16, num_experts_per_tok=4,
    moe_intermediate_size=64, n_shared_experts=1, n_group=4, topk_group=2, routed_scaling_factor=2.5,
    norm_topk_prob=True, rope_interleave=True, topk_method="noaux_tc", scoring_func="sigmoid",
    rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
)

# A tiny DeepSeek-V3.2: the tiny DeepSeek-V3 with a lightning indexer of 16 heads of 32 keeping the top 6 tokens, so
# the test prompts (7 and 50 tokens) attend sparsely.  DeepSeek-V3.2's config has no rope_interleave (always pairs).
# ``num_experts`` repeats ``n_routed_experts`` for transformers 5.12.1 (SGLang 0.5.17-0.5.21's pin), whose class
# builds ``num_experts`` experts (256 by default); 5.19 reads it as ``n_routed_experts``.
_TINY_DEEPSEEK_V32 = dict(
    {k: v for k, v in _TINY_DEEPSEEK_V3.items() if k not in ("rope_interleave", "head_dim")},
    index_topk=6, index_n_heads=16, index_head_dim=32, num_experts=_TINY_DEEPSEEK_V3["n_routed_experts"],
)
# A tiny GLM-5: the same with GLM-5's indexer-sharing pattern (layer 1 reuses layer 0's selection).
_TINY_GLM_MOE_DSA = dict(_TINY_DEEPSEEK_V32, indexer_types=["full", "shared", "full"])

# A tiny DeepSeek-V4: one layer of each attention type (sliding window 8; CSA entries of 4 tokens, an indexer of 16 heads keeping
# 3; HCA entries of 8 tokens), a hash-routed layer then top-k routed ones over 8 experts, 3 residual streams, the
# experts' SwiGLU clamped at 0.2 (reached by the random weights' pre-activations), YaRN on the CSA / HCA layers' rope
# as published (transformers' config gives it to the "compress" rope only, attention_factor 1).  The 50-token test prompt passes
# the window, the top-k and several HCA entries.
_TINY_DEEPSEEK_V4 = dict(
    vocab_size=512, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=3, num_attention_heads=4, head_dim=32,
    q_lora_rank=32, partial_rotary_factor=0.25, num_experts_per_tok=2, n_routed_experts=8,
    layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
    mlp_layer_types=["hash_moe", "moe", "moe"],
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}, hc_mult=3,
    hc_sinkhorn_iters=5, sliding_window=8, o_groups=2, o_lora_rank=16, index_n_heads=16, index_head_dim=16,
    index_topk=3, swiglu_limit=0.2, max_position_embeddings=512, tie_word_embeddings=False,
    rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128, "beta_fast": 32,
                     "beta_slow": 1},
)

# DeepSeek's names outside the layers, and layers without transformers' "model." (transformers' conversion reads
# them; its save_pretrained writes them back under "model." with its own spellings)
_DEEPSEEK_V4_PUBLISHED_NAMES = (
    (r"^model\.embed_tokens\.weight$", "embed.weight"), (r"^model\.norm\.weight$", "norm.weight"),
    (r"^model\.hc_head\.hc_(fn|base|scale)$", r"hc_head_\1"), (r"^model\.layers\.", "layers."),
)

# A tiny Kimi-K2.5: the tiny DeepSeek-V3 above under a two-block MoonViT tower of 8-pixel patches (head 32, an 8x8
# learned position grid resampled to each image) whose 2x2-merged patches land in the decoder's width.
_TINY_KIMI_K25 = dict(
    text_config=dict(_TINY_DEEPSEEK_V3, model_type="deepseek_v3"),
    vision_config=dict(patch_size=8, pos_emb_height=8, pos_emb_width=8, pos_emb_time=4, num_attention_heads=2,
                       num_hidden_layers=2, hidden_size=64, intermediate_size=128, merge_kernel_size=[2, 2],
                       rope_parameters={"rope_type": "axial", "rope_theta": 10000.0}),
    projection_hidden_size=64, tie_word_embeddings=False,
    # placeholder ids above the tiny tokenizer's 384 tokens
    image_token_id=500, video_token_id=501, vision_start_token_id=502, vision_end_token_id=503,
    media_placeholder_token_id=500,  # the published configs' spelling of image_token_id (SGLang's processor reads it)
)
_TINY_KIMI_IMAGES = {
    "image_processor_type": "Kimi_K25ImageProcessor", "patch_size": 8, "merge_size": 2, "max_patches": 256,
    "size": {"max_height": 16, "max_width": 16},  # at most 16 patches a side
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    # the same resize as the published checkpoints' media processor spells it (vLLM's Kimi-K2.5 processor reads it)
    "media_proc_cfg": {"config_type": "media_proc_cfg", "patch_size": 8, "merge_kernel_size": 2, "in_patch_limit": 256,
                       "patch_limit_on_one_side": 16, "in_patch_limit_each_frame": 256, "in_patch_limit_video": None,
                       "fixed_output_tokens": None, "temporal_merge_kernel_size": 4,
                       "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]},
}
# transformers' save_pretrained writes three Kimi-K2.5 names its reverse conversion misses
_KIMI_PUBLISHED_NAMES = (
    (r"^language_model\.model\.blocks\.", "language_model.model.layers."),
    (r"^model\.mm_projector\.", "mm_projector."),
    (r"^vision_tower\.encoder\.patch_embed\.", "vision_tower.patch_embed."),
)

# A tiny hybrid: Gated DeltaNet layers 0 and 2 (HV = 2H), gated full attention 1 and 3 (partial rotary);
# sparse MoE with a shared expert except layer 2's dense MLP.
_TINY_QWEN3_NEXT = dict(
    _TINY_DENSE, tie_word_embeddings=False, num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
    linear_conv_kernel_dim=4, partial_rotary_factor=0.25, num_experts=8, num_experts_per_tok=2,
    moe_intermediate_size=96, shared_expert_intermediate_size=128, norm_topk_prob=True, mlp_only_layers=[2],
)

# Tiny Qwen3.5: the hybrid schedule above with Qwen3.5's real attention shape (head 256, rotary 64 with
# sections [11, 11, 10] interleaved), a dense MLP (Qwen3.5) or sparse MoE with a shared expert in every layer
# (Qwen3.5-MoE), and the Qwen3-VL tower without deepstack.
_TINY_QWEN3_5_TEXT = dict(
    _TINY_DENSE, head_dim=256, num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
    linear_conv_kernel_dim=4,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [11, 11, 10], "mrope_interleaved": True},
)
_TINY_QWEN3_5_VISION = {k: v for k, v in _TINY_VISION.items() if k != "deepstack_visual_indexes"}
_TINY_QWEN3_5 = dict(_TINY_QWEN3_VL, text_config=_TINY_QWEN3_5_TEXT, vision_config=_TINY_QWEN3_5_VISION)
_TINY_QWEN3_5_MOE = dict(
    _TINY_QWEN3_5,
    text_config=dict({k: v for k, v in _TINY_QWEN3_5_TEXT.items() if k != "intermediate_size"},
                     num_experts=8, num_experts_per_tok=2, moe_intermediate_size=96, shared_expert_intermediate_size=128),
)

# A tiny MiniMax-M2: q/k norms over the whole projection, rotary on half of each 64-wide head (``rotary_dim``, as its
# published configs spell it), sigmoid routing with a correction bias over 8 experts of 96 features, top-2.
_TINY_MINIMAX_M2 = dict(_TINY_MOE, intermediate_size=96, num_local_experts=8, num_experts_per_tok=2, rotary_dim=32,
                        scoring_func="sigmoid", use_routing_bias=True)

# Tiny gpt-oss: a sliding-window layer (window 16, shorter than the parity prompts) then a full one, YaRN
# rope (factor 8 over 64 original positions, untruncated as gpt-oss' own), 8 experts of 96 features, top-4.
_TINY_GPT_OSS = dict(
    _TINY_MOE, intermediate_size=96, num_local_experts=8, num_experts_per_tok=4, attention_bias=True,
    layer_types=["sliding_attention", "full_attention"], sliding_window=16,
    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "original_max_position_embeddings": 64,
                     "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False},
)

# Checkpoint formats (and online schemes) every dense decoder loads through atom_core.quant:
# quant_method fp8 (per tensor or 128x128 blocks), compressed-tensors FP8 (PTPC / tensor / block),
# AMD Quark MXFP4; online ptpc-fp8 / fp8-block / mxfp4.
DENSE_QUANT = ("fp8", "fp8-block", "compressed-tensors-fp8", "quark-mxfp4")

ARCHITECTURES: dict[str, ArchSpec] = {
    spec.name: spec
    for spec in [
        ArchSpec(
            "LlamaForCausalLM", "atom_core.models.llama:LlamaForCausalLM", "llama",
            "transformers:LlamaForCausalLM", "llama", quant_formats=DENSE_QUANT,
            tiny=dict(_TINY_DENSE, tie_word_embeddings=False),
        ),
        ArchSpec(
            "MistralForCausalLM", "atom_core.models.llama:MistralForCausalLM", "llama",
            "transformers:MistralForCausalLM", "mistral", quant_formats=DENSE_QUANT,
            tiny=dict(_TINY_DENSE, sliding_window=32, tie_word_embeddings=False),
        ),
        ArchSpec(
            "Qwen2ForCausalLM", "atom_core.models.llama:Qwen2ForCausalLM", "qwen",
            "transformers:Qwen2ForCausalLM", "qwen2", quant_formats=DENSE_QUANT,
            tiny=dict(_TINY_DENSE, tie_word_embeddings=True),
        ),
        ArchSpec(
            "Qwen3ForCausalLM", "atom_core.models.llama:Qwen3ForCausalLM", "qwen",
            "transformers:Qwen3ForCausalLM", "qwen3", quant_formats=DENSE_QUANT,
            tiny=dict(_TINY_DENSE, tie_word_embeddings=False),
        ),
        ArchSpec(
            "Qwen3MoeForCausalLM", "atom_core.models.qwen_moe:Qwen3MoeForCausalLM", "qwen_moe",
            "transformers:Qwen3MoeForCausalLM", "qwen3_moe",
            # layer 1 is dense (mlp_only_layers), layers 0 and 2 sparse
            tiny=dict(_TINY_MOE, num_hidden_layers=3, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=96,
                      norm_topk_prob=True, mlp_only_layers=[1]),
        ),
        ArchSpec(
            "Qwen2MoeForCausalLM", "atom_core.models.qwen_moe:Qwen2MoeForCausalLM", "qwen_moe",
            "transformers:Qwen2MoeForCausalLM", "qwen2_moe",
            tiny=dict(_TINY_MOE, num_experts=8, num_experts_per_tok=4, moe_intermediate_size=96,
                      shared_expert_intermediate_size=160, norm_topk_prob=False),
        ),
        ArchSpec(
            "MixtralForCausalLM", "atom_core.models.mixtral:MixtralForCausalLM", "mixtral",
            "transformers:MixtralForCausalLM", "mixtral",
            tiny=dict(_TINY_MOE, num_local_experts=8, num_experts_per_tok=2, intermediate_size=96, sliding_window=32),
        ),
        ArchSpec(
            "Glm4MoeForCausalLM", "atom_core.models.glm4_moe:Glm4MoeForCausalLM", "glm4_moe",
            "transformers:Glm4MoeForCausalLM", "glm4_moe",
            # layer 0 dense; sigmoid routing over 2 groups of 4 experts (1 group kept), one shared expert
            tiny=dict(_TINY_MOE, num_hidden_layers=3, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=96,
                      n_shared_experts=1, n_group=2, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
                      first_k_dense_replace=1, attention_bias=True, use_qk_norm=True, partial_rotary_factor=0.5),
        ),
        ArchSpec(
            "DeepseekV3ForCausalLM", "atom_core.models.deepseek_v3:DeepseekV3ForCausalLM", "deepseek_v3",
            "transformers:DeepseekV3ForCausalLM", "deepseek_v3", capabilities=frozenset({TEXT, MLA}),
            quant_formats=("fp8-block", "quark-mxfp4"), tiny=_TINY_DEEPSEEK_V3,
        ),
        ArchSpec(
            "DeepseekV32ForCausalLM", "atom_core.models.deepseek_v32:DeepseekV32ForCausalLM", "deepseek_v32",
            "transformers:DeepseekV32ForCausalLM", "deepseek_v32", capabilities=frozenset({TEXT, MLA, SPARSE_ATTENTION}),
            quant_formats=("fp8-block",), tiny=_TINY_DEEPSEEK_V32,
        ),
        ArchSpec(
            "GlmMoeDsaForCausalLM", "atom_core.models.deepseek_v32:GlmMoeDsaForCausalLM", "deepseek_v32",
            "transformers:GlmMoeDsaForCausalLM", "glm_moe_dsa", capabilities=frozenset({TEXT, MLA, SPARSE_ATTENTION}),
            quant_formats=("fp8-block",), tiny=_TINY_GLM_MOE_DSA,
        ),
        ArchSpec(
            "DeepseekV4ForCausalLM", "atom_core.models.deepseek_v4:DeepseekV4ForCausalLM", "deepseek_v4",
            "transformers:DeepseekV4ForCausalLM", "deepseek_v4", capabilities=frozenset({TEXT, COMPRESSED_ATTENTION}),
            tiny=_TINY_DEEPSEEK_V4, published_names=_DEEPSEEK_V4_PUBLISHED_NAMES,
        ),
        ArchSpec(
            "MiniMaxM2ForCausalLM", "atom_core.models.minimax_m2:MiniMaxM2ForCausalLM", "minimax_m2",
            "transformers:MiniMaxM2ForCausalLM", "minimax_m2", tiny=_TINY_MINIMAX_M2,
        ),
        ArchSpec(
            "KimiK25ForConditionalGeneration", "atom_core.models.kimi_k25:KimiK25ForConditionalGeneration", "kimi_k25",
            "transformers:Kimi_K25ForConditionalGeneration", "kimi_k25", capabilities=frozenset({TEXT, MLA, MULTIMODAL}),
            tiny=_TINY_KIMI_K25, tiny_preprocessor=_TINY_KIMI_IMAGES, published_names=_KIMI_PUBLISHED_NAMES,
            tiny_tokens={"<|media_pad|>": _TINY_KIMI_K25["media_placeholder_token_id"]},
        ),
        ArchSpec(
            "GptOssForCausalLM", "atom_core.models.gpt_oss:GptOssForCausalLM", "gpt_oss",
            "transformers:GptOssForCausalLM", "gpt_oss", quant_formats=("mxfp4", "quark-mxfp4"), tiny=_TINY_GPT_OSS,
        ),
        ArchSpec(
            "Qwen3NextForCausalLM", "atom_core.models.qwen3_next:Qwen3NextForCausalLM", "qwen3_next",
            "transformers:Qwen3NextForCausalLM", "qwen3_next", capabilities=frozenset({TEXT, HYBRID}),
            tiny=_TINY_QWEN3_NEXT,
        ),
        ArchSpec(
            "Qwen3VLForConditionalGeneration", "atom_core.models.qwen3_vl:Qwen3VLForConditionalGeneration", "qwen-vl",
            "transformers:Qwen3VLForConditionalGeneration", "qwen3_vl",
            capabilities=frozenset({TEXT, MULTIMODAL, MROPE}), tiny=_TINY_QWEN3_VL,
            tiny_preprocessor=_TINY_QWEN_VL_IMAGES,
        ),
        ArchSpec(
            "Qwen3_5ForConditionalGeneration", "atom_core.models.qwen3_5:Qwen3_5ForConditionalGeneration", "qwen3_5",
            "transformers:Qwen3_5ForConditionalGeneration", "qwen3_5",
            capabilities=frozenset({TEXT, HYBRID, MULTIMODAL, MROPE}), tiny=_TINY_QWEN3_5,
            tiny_preprocessor=_TINY_QWEN_VL_IMAGES,
        ),
        ArchSpec(
            "Qwen3_5MoeForConditionalGeneration", "atom_core.models.qwen3_5:Qwen3_5MoeForConditionalGeneration", "qwen3_5",
            "transformers:Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe",
            capabilities=frozenset({TEXT, HYBRID, MULTIMODAL, MROPE}), tiny=_TINY_QWEN3_5_MOE,
            tiny_preprocessor=_TINY_QWEN_VL_IMAGES,
        ),
    ]
}


def supported() -> list[str]:
    return sorted(ARCHITECTURES)


def get(name: str) -> ArchSpec:
    if name not in ARCHITECTURES:
        raise UnsupportedArchitectureError(f"architecture {name!r} is not supported by ATOM; supported: {', '.join(supported())}")
    return ARCHITECTURES[name]


def resolve(hf_config: Any) -> ArchSpec:
    """The catalog entry for a config's ``architectures``."""
    names = list(getattr(hf_config, "architectures", None) or [])
    for name in names:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    raise UnsupportedArchitectureError(
        f"architecture(s) {names or '(none listed in config.json)'} not supported by ATOM; supported: {', '.join(supported())}"
    )


def unserved_reasons(spec: ArchSpec, extensions: Mapping[str, Any], host: str) -> list[str]:
    """Why the ``host`` adapter cannot serve ``spec`` (empty when it can).  ``extensions``: the adapter's table
    of capability -> extension, each with ``implemented`` and ``needs`` (what is missing, up to its first ':')."""
    reasons = []
    for capability in sorted(spec.capabilities):
        ext = extensions.get(capability)
        if ext is None:
            reasons.append(f"capability {capability!r} is unknown to {host} (add it to "
                           f"{host.replace('-', '_')}.capabilities)")
        elif not ext.implemented:
            reasons.append(f"capability {capability!r} needs {ext.needs.split(':')[0]}")
    return reasons


def host_plan(extensions: Mapping[str, Any], host: str) -> tuple[list[str], dict[str, str]]:
    """(architectures the ``host`` adapter serves, {architecture: why not} for the rest), in catalog order."""
    served, skipped = [], {}
    for name, spec in ARCHITECTURES.items():
        reasons = unserved_reasons(spec, extensions, host)
        if reasons:
            skipped[name] = "; ".join(reasons)
        else:
            served.append(name)
    return served, skipped


# where a draft's weights are: in the target's checkpoint (MTP layers), or a checkpoint of its own (EAGLE-3 heads)
IN_TARGET = "in-target"
SEPARATE = "separate"


@dataclass(frozen=True)
class DraftSpec:
    """A draft model of speculative decoding over some target architectures."""

    name: str  # the architecture the hosts resolve the draft by (vLLM's ``DeepSeekMTPModel``)
    model: str  # "module:Class" of the ATOM implementation
    targets: tuple[str, ...]  # the target architectures it drafts for
    method: str  # the hosts' speculative method name
    checkpoint: str = IN_TARGET  # IN_TARGET or SEPARATE
    aliases: tuple[str, ...] = ()  # other names a separate draft's config.json spells its architecture with

    def model_class(self) -> type:
        module, _, name = self.model.partition(":")
        return getattr(importlib.import_module(module), name)


DRAFTS: dict[str, DraftSpec] = {
    spec.name: spec
    for spec in (
        DraftSpec("DeepSeekMTPModel", "atom_core.models.deepseek_mtp:DeepSeekMTP", ("DeepseekV3ForCausalLM",), "mtp"),
        DraftSpec("Qwen3NextMTP", "atom_core.models.qwen3_next_mtp:Qwen3NextMTP", ("Qwen3NextForCausalLM",), "mtp"),
        DraftSpec("Eagle3LlamaForCausalLM", "atom_core.models.llama_eagle3:Eagle3LlamaForCausalLM",
                  ("LlamaForCausalLM", "Qwen3ForCausalLM"), "eagle3", SEPARATE, aliases=("LlamaForCausalLMEagle3",)),
    )
}


def draft_for(target: ArchSpec, draft_architectures: list[str] | None = None, where: str = "") -> DraftSpec:
    """The draft of ``target``: the one its own checkpoint carries (``draft_architectures`` None), or the one a separate
    draft checkpoint's config names (its ``architectures``, read from ``where``).  An
    :class:`UnsupportedArchitectureError` (or :class:`UsageError`) naming what is wrong and what exists."""
    from atom_core.errors import UsageError

    if draft_architectures is not None:
        for spec in DRAFTS.values():
            if spec.checkpoint == SEPARATE and {spec.name, *spec.aliases} & set(draft_architectures):
                if target.name not in spec.targets:
                    raise UnsupportedArchitectureError(f"{where}: a {spec.name} draft takes {', '.join(spec.targets)} "
                                                       f"targets, not {target.name}")
                return spec
        have = sorted(n for spec in DRAFTS.values() if spec.checkpoint == SEPARATE for n in (spec.name, *spec.aliases))
        raise UnsupportedArchitectureError(f"{where}: architectures {draft_architectures} is no draft ATOM runs; "
                                           f"separate drafts: {', '.join(have)}")
    for spec in DRAFTS.values():
        if target.name in spec.targets and spec.checkpoint == IN_TARGET:
            return spec
    separate = [spec.name for spec in DRAFTS.values() if target.name in spec.targets]
    if separate:
        raise UsageError(f"{target.name}'s drafts ({', '.join(separate)}) are separate checkpoints: give the draft "
                         "checkpoint's directory (--draft DIR)")
    have = sorted(t for spec in DRAFTS.values() for t in spec.targets)
    raise UnsupportedArchitectureError(f"{target.name} has no draft model in ATOM for speculative decoding; "
                                       f"drafts exist for: {', '.join(have)}")
