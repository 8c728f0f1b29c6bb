"""Model-level benchmark: ATOM's native runner against transformers' eager implementation on the same
random checkpoint of a real model shape (few layers), prefill and decode, on one GPU.

``python -m atom_core.bench --arch Qwen3ForCausalLM --layers 4 --out model.json``

The native host is a small runtime (ATOM's paged attention over its block cache), not a serving engine, so this
measures the model code (fused ops, loader, layers) rather than a scheduler.  ATOM runs twice: eager
(``atom-native``) and with decode steps replayed from CUDA graphs (``atom-native-graphs``).

The end-to-end benches inside a host (:mod:`atom_vllm.bench`, :mod:`atom_sglang.bench`) share what here is not
about a host: the models and their checkpoints, the prompts, the agreement summary and the spread of repeats.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import tempfile
import time
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


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _wall(fn, device: str, reps: int) -> float:
    fn()  # warm-up (compilation, allocator)
    _sync(device)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


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
    return tiny_config(arch, **shape)


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


# ---- shared by the end-to-end benches inside a host (atom_vllm.bench, atom_sglang.bench) ----------------------
# name -> (architecture, layers); shapes are SHAPES
MODELS: dict[str, tuple[str, int]] = {
    "qwen3-8b": ("Qwen3ForCausalLM", 8),
    "qwen3-30b-a3b": ("Qwen3MoeForCausalLM", 6),
    "llama3-8b": ("LlamaForCausalLM", 8),
    "mixtral-8x7b": ("MixtralForCausalLM", 4),
    "qwen3-next-80b-a3b": ("Qwen3NextForCausalLM", 4),
    "deepseek-v3": ("DeepseekV3ForCausalLM", 2),  # one dense layer, one with 256 experts
    "gpt-oss-120b": ("GptOssForCausalLM", 2),  # one sliding-window layer, one full
    "qwen3.5-35b-a3b": ("Qwen3_5MoeForConditionalGeneration", 4),  # three linear-attention layers, one full
    "smollm2-135m": ("LlamaForCausalLM", 30),  # the demo model's shape (all 30 layers), random weights
}
# Models whose shape is not their architecture's SHAPES entry
MODEL_SHAPES: dict[str, dict] = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
                         head_dim=64, vocab_size=49152, max_position_embeddings=8192, tie_word_embeddings=True,
                         rope_parameters={"rope_type": "default", "rope_theta": 100000.0}),
}
AGREEMENT_PROMPTS, AGREEMENT_TOKENS = 16, 32
# Agreement prompts for a real checkpoint (its tokenizer encodes them); random-weight ones use random tokens.
TEXT_PROMPTS = ("The capital of France is", "Water boils at a temperature of",
                "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
                "The three primary colors are", "In 1969, the first humans to walk on the Moon were",
                "A haiku about autumn:\n", "Translate to French: I would like a cup of coffee.\n",
                "The largest planet in the solar system is")


def random_prompts(vocab: int, count: int, length: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (count, length), generator=gen).tolist()


def checkpoint_prompt_vocab(model_dir: Path) -> int:
    """:func:`prompt_vocab` of the checkpoint in ``model_dir``."""
    return prompt_vocab(json.loads((Path(model_dir) / "config.json").read_text()))


def agreement_prompts(model_dir: Path) -> list[list[int]]:
    """The fixed prompt set of a random-weight checkpoint: random tokens, lengths 16 to 211."""
    vocab = checkpoint_prompt_vocab(model_dir)
    return [p[: 16 + 13 * i] for i, p in enumerate(random_prompts(vocab, AGREEMENT_PROMPTS, 256, seed=1))]


def text_prompts(model_dir: Path) -> list[list[int]]:
    """``TEXT_PROMPTS`` as the tokenizer of the checkpoint in ``model_dir`` encodes them."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=False)
    return [tokenizer(p)["input_ids"] for p in TEXT_PROMPTS]


def model_checkpoints(name: str, layers: int, formats: list[str], workdir: Path):
    """Yield ``(format, directory)`` of the model ``name`` of :data:`MODELS` at ``layers`` layers: the bf16 random
    checkpoint, then ``atom quantize``'s copy per format."""
    from atom_core.quant.quantize import quantize_checkpoint

    arch = MODELS[name][0]
    bf16 = write_checkpoint(arch, layers, workdir / "bf16", torch.bfloat16, "cuda", MODEL_SHAPES.get(name))
    torch.cuda.empty_cache()
    for fmt in formats:
        if fmt == "bf16":
            yield fmt, bf16
        else:
            out = quantize_checkpoint(bf16, workdir / fmt, fmt, device="cuda")
            torch.cuda.empty_cache()  # before the engines start: this process's cached blocks count against them
            yield fmt, out


def compare_agreement(ref: list[dict], other: list[dict]) -> dict:
    """Two implementations' greedy outputs on the same prompts (per prompt ``tokens``, ``logprobs`` of them and
    ``prompt_logprobs`` of prompt tokens 1..): how many are identical, where they first diverge, and how far
    their log-probabilities are apart."""
    same = sum(a["tokens"] == b["tokens"] for a, b in zip(ref, other))
    first_diff = [next((i for i, (x, y) in enumerate(zip(a["tokens"], b["tokens"])) if x != y), len(a["tokens"]))
                  for a, b in zip(ref, other)]
    prompt_delta = [abs(x - y) for a, b in zip(ref, other) for x, y in zip(a["prompt_logprobs"], b["prompt_logprobs"])]
    # output log-probabilities are comparable only while both chose the same tokens
    out_delta = [abs(x - y) for a, b, n in zip(ref, other, first_diff) for x, y in zip(a["logprobs"][:n], b["logprobs"][:n])]
    return {"prompts": len(ref), "identical_greedy": same, "mean_first_divergence": statistics.mean(first_diff),
            "prompt_logprob_mean_abs_diff": statistics.mean(prompt_delta), "prompt_logprob_max_abs_diff": max(prompt_delta),
            "output_logprob_mean_abs_diff": statistics.mean(out_delta) if out_delta else None}


def spread(values: list[float]) -> dict:
    """Median, min, max and every sample (ci/regression.py tests the samples) of a metric's repeats."""
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2),
            "samples": [round(v, 3) for v in values]}


def _time_atom(runner, prompts, decode_tokens: int, device: str, reps: int, params_cls) -> tuple[float, float]:
    one = params_cls(max_new_tokens=1, ignore_eos=True)
    many = params_cls(max_new_tokens=decode_tokens, ignore_eos=True)
    return (_wall(lambda: runner.generate(prompts, one), device, reps),
            _wall(lambda: runner.generate(prompts, many), device, reps))


def run(arch: str, layers: int, batch: int, prompt_len: int, decode_tokens: int, device: str = "cuda",
        dtype: torch.dtype = torch.bfloat16, reps: int = 3, shape: dict | None = None) -> list[dict]:
    import transformers

    from atom_core.runtime.runner import Runner
    from atom_core.runtime.sampler import SamplingParams

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_checkpoint(arch, layers, Path(tmp), dtype, device, shape)
        vocab = prompt_vocab(json.loads((ckpt / "config.json").read_text()))
        gen = torch.Generator().manual_seed(0)
        prompts = torch.randint(0, vocab, (batch, prompt_len), generator=gen)
        prompt_lists = prompts.tolist()

        atom = {impl: _time_atom(Runner(ckpt, device=device, dtype=dtype, cuda_graphs=graphs), prompt_lists,
                                 decode_tokens, device, reps, SamplingParams)
                for impl, graphs in (("atom-native", False), ("atom-native-graphs", True))}

        hf = transformers.AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=dtype, trust_remote_code=False).to(device).eval()
        ids = prompts.to(device)

        @torch.inference_mode()
        def hf_generate(n: int):
            return hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)

        hf_prefill = _wall(lambda: hf_generate(1), device, reps)
        hf_total = _wall(lambda: hf_generate(decode_tokens), device, reps)

    for impl, (prefill, total) in {**atom, "hf-eager": (hf_prefill, hf_total)}.items():
        decode_step = (total - prefill) / max(decode_tokens - 1, 1)
        rows.append({
            "arch": arch, "layers": layers, "batch": batch, "prompt_len": prompt_len, "impl": impl,
            "prefill_ms": prefill * 1e3, "prefill_tok_per_s": batch * prompt_len / prefill,
            "decode_step_ms": decode_step * 1e3, "decode_tok_per_s": batch / decode_step,
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atom_core.bench")
    parser.add_argument("--arch", default="Qwen3ForCausalLM", choices=sorted(SHAPES))
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = [row for b in args.batch for row in run(args.arch, args.layers, b, args.prompt_len, args.decode_tokens, device)]
    context = {"gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu",
               "date": datetime.date.today().isoformat(), "torch": torch.__version__}
    Path(args.out).write_text(json.dumps({"context": context, "rows": rows}, indent=1))
    for row in rows:
        print({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
