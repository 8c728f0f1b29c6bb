"""Random-weight checkpoints of real model shapes (few layers): what the native bench, the accuracy gate and the
end-to-end benches load.  ``SHAPES`` holds each architecture's real widths; the layer count is the caller's."""

from __future__ import annotations

from pathlib import Path

import torch

from atom_core import catalog
from atom_core.tiny import tiny_config

# Real model shapes (hidden, intermediate, heads, kv heads, head dim, vocab); layers come from --layers.
SHAPES = {
    "Qwen3ForCausalLM": dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8,
                             head_dim=128, vocab_size=151936, max_position_embeddings=40960),  # Qwen3-8B
    "LlamaForCausalLM": dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                             head_dim=128, vocab_size=128256, max_position_embeddings=8192),  # Llama-3-8B
    "Qwen3MoeForCausalLM": dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                                num_experts_per_tok=8, norm_topk_prob=True, mlp_only_layers=[], num_attention_heads=32,
                                num_key_value_heads=4, head_dim=128, vocab_size=151936,
                                max_position_embeddings=40960),  # Qwen3-30B-A3B
    "MixtralForCausalLM": dict(hidden_size=4096, intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2,
                               num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=32000,
                               max_position_embeddings=32768, sliding_window=None),  # Mixtral-8x7B
    "Qwen3NextForCausalLM": dict(hidden_size=2048, intermediate_size=5120, moe_intermediate_size=512,
                                 shared_expert_intermediate_size=512, num_experts=512, num_experts_per_tok=10,
                                 norm_topk_prob=True, mlp_only_layers=[], num_attention_heads=16,
                                 num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
                                 linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                                 linear_conv_kernel_dim=4, partial_rotary_factor=0.25, rope_theta=10_000_000.0,
                                 vocab_size=151936, max_position_embeddings=262144),  # Qwen3-Next-80B-A3B
    "DeepseekV3ForCausalLM": dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                                  n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8, n_group=8,
                                  topk_group=4, routed_scaling_factor=2.5, first_k_dense_replace=1,
                                  num_attention_heads=128, num_key_value_heads=128, q_lora_rank=1536, kv_lora_rank=512,
                                  qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, head_dim=64,
                                  vocab_size=129280, max_position_embeddings=163840, tie_word_embeddings=False,
                                  rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0,
                                                   "original_max_position_embeddings": 4096, "beta_fast": 32,
                                                   "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}),  # V3 / R1
    "GptOssForCausalLM": dict(hidden_size=2880, intermediate_size=2880, num_local_experts=128, num_experts_per_tok=4,
                              num_attention_heads=64, num_key_value_heads=8, head_dim=64, sliding_window=128,
                              vocab_size=201088, max_position_embeddings=131072, tie_word_embeddings=False,
                              rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0,
                                               "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                                               "beta_slow": 1.0, "truncate": False}),  # gpt-oss-120b
    # Qwen3.5-35B-A3B's text model (SSM state in fp32, as its config asks); its vision tower has the real widths
    # but 2 of 27 blocks (text prompts never reach it); real placeholder ids.
    "Qwen3_5MoeForConditionalGeneration": dict(
        text_config=dict(hidden_size=2048, moe_intermediate_size=512, shared_expert_intermediate_size=512,
                         num_experts=256, num_experts_per_tok=8, num_attention_heads=16, num_key_value_heads=2,
                         head_dim=256, linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128,
                         linear_value_head_dim=128, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
                         mamba_ssm_dtype="float32", vocab_size=248320, max_position_embeddings=262144,
                         tie_word_embeddings=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0,
                                          "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
                                          "mrope_interleaved": True}),
        vision_config=dict(depth=2, hidden_size=1152, intermediate_size=4304, num_heads=16, patch_size=16,
                           temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=2048,
                           num_position_embeddings=2304),
        image_token_id=248056, video_token_id=248057, vision_start_token_id=248053, vision_end_token_id=248054,
        tie_word_embeddings=False),
}
# Layer schedules of the real models (Qwen3-Next, Qwen3.5: every 4th layer full attention; gpt-oss: sliding and
# full attention alternating), cut to the bench's layer count.
LAYER_TYPES = {"Qwen3NextForCausalLM": ["linear_attention"] * 3 + ["full_attention"],
               "Qwen3_5MoeForConditionalGeneration": ["linear_attention"] * 3 + ["full_attention"],
               "GptOssForCausalLM": ["sliding_attention", "full_attention"]}
# Keys the published configs carry that transformers' config class no longer writes, but a host's own config
# class reads (SGLang's Qwen3NextConfig makes layer l full attention where (l + 1) % full_attention_interval == 0:
# the length of the layer pattern above, whose last layer is the full-attention one).
PUBLISHED_KEYS = {"Qwen3NextForCausalLM": {"full_attention_interval": len(LAYER_TYPES["Qwen3NextForCausalLM"])}}
# Config keys of a multimodal model's placeholder tokens: random text prompts stay below them (a prompt holding
# an image or video placeholder without its pixels is no text prompt; ATOM's MRoPE positions refuse it).
PLACEHOLDER_KEYS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def text_fields(config: dict) -> dict:
    """The text model's fields of a checkpoint's ``config.json``: its ``text_config`` where it nests one
    (multimodal models), else the config itself."""
    return config.get("text_config", config)


def prompt_vocab(config: dict) -> int:
    """Random text prompts of a checkpoint draw token ids below this: its text vocabulary size, cut at its
    lowest multimodal placeholder id."""
    placeholders = [config[k] for k in PLACEHOLDER_KEYS if isinstance(config.get(k), int)]
    return min([text_fields(config)["vocab_size"], *placeholders])


def checkpoint_config(arch: str, layers: int, shape: dict | None = None):
    """The config of ``arch`` at ``shape`` (default: its real shape in ``SHAPES``) with ``layers`` layers in the
    real layer schedule.  Where the architecture's config nests the text model's (``text_config`` of a
    multimodal model), the layer count and schedule go there."""
    spec = catalog.get(arch)
    shape = dict(shape if shape is not None else SHAPES[arch])
    text = shape
    if "text_config" in spec.tiny:
        text = shape["text_config"] = dict(shape.get("text_config", {}))
    text["num_hidden_layers"] = layers
    if arch in LAYER_TYPES and "layer_types" not in text:
        pattern = LAYER_TYPES[arch]
        text["layer_types"] = [pattern[i % len(pattern)] for i in range(layers)]
    config = tiny_config(arch, **shape)
    for key, value in PUBLISHED_KEYS.get(arch, {}).items():
        setattr(config, key, value)
    return config


def write_checkpoint(arch: str, layers: int, out: Path, dtype: torch.dtype, device: str, shape: dict | None = None) -> Path:
    """A random checkpoint (transformers' reference class, ``save_pretrained``) of :func:`checkpoint_config`.
    A multimodal one also gets the tiny tokenizer and image-processor files (:func:`atom_core.tiny.write_processor_files`):
    a host that builds the model's processor at start-up (SGLang) needs them, whatever the prompts."""
    from atom_core.tiny import write_processor_files

    config = checkpoint_config(arch, layers, shape)
    with torch.device(device):
        model = catalog.get(arch).hf_model_class()(config).to(dtype)
    model.save_pretrained(str(out))
    if catalog.get(arch).tiny_preprocessor:
        write_processor_files(arch, config, out)
    return out

