"""SGLang's own LoRA manager driving ATOM's linear layers (``--enable-lora``, ``--lora-paths``) on the CPU.

Two peft adapters of a tiny Qwen3 (random A *and* B: peft starts B at zero) and a prompt without one, in one
``sglang.Engine.generate`` batch (scheduler, ModelRunner, SGLang's LoRA manager, memory pool and torch-native LoRA
backend): each prompt's greedy tokens equal transformers + peft with its adapter (the third the base model) and
SGLang's own Qwen3 with the same adapters; then a third adapter in a second batch, which SGLang loads into an evicted
slot.  The Qwen3 quantized to ptpc-FP8, in float16 (SGLang takes compressed-tensors in 16-bit dtypes only), with two
adapters: = transformers + peft over the dequantized weights (atom-core's quant_helpers), to a float16 logit gap.

The engines' processes run with ``_cpu_engine/sitecustomize.py``: SGLang 0.5.23's engine pins host memory in its
torch-native LoRA backend, which its CUDA build of torch refuses without an NVIDIA driver (pinning becomes a no-op
there), and SGLang's own rotary embedding takes a CUDA kernel on a CPU it does not recognise (its torch path is
chosen).
"""

from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _sglang_env import run_fresh
from test_construct import load_with_sglang

from atom_core import catalog
from atom_core.errors import UnsupportedConfigError
from atom_core.tiny import random_lora_adapter
from atom_sglang import compat, lora

sys.path.append(str(Path(__file__).resolve().parents[2] / "atom-core" / "tests"))  # atom-core's quant_helpers
from quant_helpers import reference_with_quantized_weights  # noqa: E402

pytestmark = pytest.mark.sglang

ARCH = "Qwen3ForCausalLM"
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
DENSE = [*ATTENTION, "gate_proj", "up_proj", "down_proj"]
PROMPTS = [[5, 17, 99, 3, 200, 41, 7], [11, 300, 8], [42, 7, 19, 250]]
NEW_TOKENS = 5
CPU_ENGINE = Path(__file__).parent / "_cpu_engine"
SCHEME = "ptpc-fp8"  # `atom quantize`: compressed-tensors, FP8 weights per channel, FP8 activations per token
FP16_GAP = 0.02  # a float16 engine token below the fp32 reference's best logit (adapters move them by > 1)

ENGINE = """
import json
import sglang

path, adapters, batches, new_tokens, dtype = json.loads(%r)
engine = sglang.Engine(model_path=path, device="cpu", dtype=dtype, attention_backend="torch_native",
                       sampling_backend="pytorch", skip_tokenizer_init=True, disable_cuda_graph=True,
                       max_total_tokens=1024, random_seed=0, log_level="error", enable_lora=True,
                       lora_backend="torch_native", max_loras_per_batch=3,
                       lora_paths=[f"{name}={adapter}" for name, adapter in adapters.items()])
try:
    outputs = [engine.generate(input_ids=prompts, lora_path=names,
                               sampling_params={"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True})
               for prompts, names in batches]
finally:
    engine.shutdown()
print(json.dumps([[out["output_ids"] for out in batch] for batch in outputs]))
"""


def engine_tokens(model_dir: str, adapters: dict[str, str], batches: list, *, own: bool = False,
                  dtype: str = "float32") -> list:
    """Greedy output ids of each batch through ``sglang.Engine`` with ``adapters`` loaded: ATOM's class, or with
    ``own`` SGLang's own (no external model package); the processes run with ``_cpu_engine``'s sitecustomize."""
    pythonpath = os.pathsep.join(p for p in (str(CPU_ENGINE), os.environ.get("PYTHONPATH")) if p)
    return run_fresh(ENGINE % json.dumps([model_dir, adapters, batches, NEW_TOKENS, dtype]),
                     env={"PYTHONPATH": pythonpath}, **({"external_package": None} if own else {}))


def hf_model(model_dir: str, arch: str = ARCH, quantized: str | None = None):
    """transformers' model of ``model_dir``; with ``quantized`` (a checkpoint of ``model_dir`` in SCHEME) its linear
    layers on the dequantized weights, their inputs quantized as ATOM's kernels do (atom-core's quant_helpers)."""
    model = catalog.get(arch).hf_model_class().from_pretrained(model_dir, dtype=torch.float32).eval()
    return reference_with_quantized_weights(model, quantized, SCHEME) if quantized else model


def make_adapter(model_dir: str, out: Path, targets: list[str], *, seed: int, r: int, alpha: int, arch: str = ARCH) -> str:
    random_lora_adapter(hf_model(model_dir, arch), out, targets, seed=seed, r=r, alpha=alpha)
    return str(out)


def peft_model(model_dir: str, adapter: str | None, arch: str = ARCH, quantized: str | None = None):
    import peft

    model = hf_model(model_dir, arch, quantized)
    return peft.PeftModel.from_pretrained(model, adapter).eval() if adapter else model


@torch.inference_mode()
def peft_greedy(model_dir: str, adapter: str | None, prompt: list[int], arch: str = ARCH,
                quantized: str | None = None) -> list[int]:
    out = peft_model(model_dir, adapter, arch, quantized).generate(
        input_ids=torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()


@torch.inference_mode()
def shortfalls(model, prompt: list[int], tokens: list[int]) -> list[float]:
    """For each of ``tokens`` (greedy output after ``prompt``): how far below the best logit ``model`` puts it, given
    the same tokens before it (0 where it is the model's greedy choice)."""
    logits = model(input_ids=torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1 :].float()
    return (logits.max(-1).values - logits[torch.arange(len(tokens)), tokens]).tolist()


def test_engine_two_adapters_and_none_in_one_batch(tiny_checkpoints, tmp_path):
    """Then a second batch with a third adapter: SGLang evicts the least recently used one from its three slots
    (two adapters and the no-adapter slot) and loads the third there, at another rank."""
    if not compat.lora_internals_checked():
        pytest.skip(f"SGLang {compat.installed_version()}: ATOM's class refuses LoRA (test_lora_refused_elsewhere)")
    model_dir = tiny_checkpoints[ARCH]
    # all seven projections at r=4, the attention projections at r=8: fused q|k|v and gate|up at two ranks
    adapters = {
        "first": make_adapter(model_dir, tmp_path / "first", DENSE, seed=1, r=4, alpha=8),
        "second": make_adapter(model_dir, tmp_path / "second", ATTENTION, seed=2, r=8, alpha=16),
        "third": make_adapter(model_dir, tmp_path / "third", DENSE, seed=3, r=2, alpha=4),
    }
    batches = [(PROMPTS, ["first", "second", None]), (PROMPTS[:2], ["third", None])]
    with ThreadPoolExecutor(2) as pool:  # ATOM's class and SGLang's own, side by side
        runs = [pool.submit(engine_tokens, model_dir, adapters, batches, own=own) for own in (False, True)]
        got, own = (run.result() for run in runs)
    want = [
        [peft_greedy(model_dir, adapters[name] if name else None, prompt) for prompt, name in zip(prompts, names)]
        for prompts, names in batches
    ]
    # the adapters change the tokens (else a layer ignoring them would pass)
    assert want[0][0] != peft_greedy(model_dir, None, PROMPTS[0])
    assert want[0][1] != peft_greedy(model_dir, None, PROMPTS[1])
    assert want[1][0] not in (peft_greedy(model_dir, None, PROMPTS[0]), want[0][0])
    assert got == want
    assert own == want


def test_engine_attention_adapter_on_a_moe_model(tiny_checkpoints, tmp_path):
    """Qwen3-MoE (the MoE family): an adapter on the attention projections and a prompt without one in one batch =
    transformers + peft.  SGLang's own Qwen3-MoE is not compared: on the CPU it gives the prompt without an adapter
    43, 43, 43, 43, 43 where transformers gives 43, 43, 43, 504, 43 (a top-2 gap of 6.3e-3 at that step) and ATOM's
    class follows transformers; it does so with LoRA off and the prompt alone in its batch too, so the difference is
    SGLang's own class on this CPU, not its LoRA batch (SGLang 0.5.23; docs/lora.md)."""
    arch = "Qwen3MoeForCausalLM"
    if not compat.lora_internals_checked() or arch not in tiny_checkpoints:
        pytest.skip("ATOM's class refuses LoRA here, or does not serve Qwen3-MoE")
    model_dir = tiny_checkpoints[arch]
    adapters = {"attention": make_adapter(model_dir, tmp_path / "attention", ATTENTION, seed=4, r=4, alpha=8, arch=arch)}
    got = engine_tokens(model_dir, adapters, [(PROMPTS[:2], ["attention", None])])
    want = [[peft_greedy(model_dir, adapters["attention"], PROMPTS[0], arch), peft_greedy(model_dir, None, PROMPTS[1], arch)]]
    assert want[0][0] != peft_greedy(model_dir, None, PROMPTS[0], arch)
    assert got == want


def test_engine_adapters_over_an_fp8_base(tiny_checkpoints, tmp_path):
    """The Qwen3 quantized by `atom quantize --scheme ptpc-fp8` (compressed-tensors), two adapters and a prompt without
    one in one batch = transformers + peft over the dequantized weights with the same activation rounding (atom-core's
    quant_helpers), in fp32.  The engine runs in float16: SGLang's loader refuses compressed-tensors in float32 before
    the model class is built (``get_supported_act_dtypes``: float16, bfloat16).  So each engine token may fall short of
    the reference's best logit by FP16_GAP, given the same tokens before it (bfloat16 flipped a 9e-3 near tie)."""
    if not compat.lora_internals_checked():
        pytest.skip(f"SGLang {compat.installed_version()}: ATOM's class refuses LoRA (test_lora_refused_elsewhere)")
    from atom_core.quant.quantize import quantize_checkpoint

    dense = tiny_checkpoints[ARCH]
    fp8 = str(quantize_checkpoint(dense, tmp_path / SCHEME, SCHEME))
    adapters = {
        "first": make_adapter(dense, tmp_path / "first", DENSE, seed=1, r=4, alpha=8),
        "second": make_adapter(dense, tmp_path / "second", ATTENTION, seed=2, r=8, alpha=16),
    }
    names = ["first", None, "second"]
    got = engine_tokens(fp8, adapters, [(PROMPTS, names)], dtype="float16")[0]
    for prompt, name, tokens in zip(PROMPTS, names, got):
        reference = peft_model(dense, adapters[name] if name else None, quantized=fp8)
        assert len(tokens) == NEW_TOKENS and max(shortfalls(reference, prompt, tokens)) <= FP16_GAP, (name, tokens)
        if name:  # the base model's tokens fall far short under the adapter (else a layer ignoring it would pass)
            base = peft_greedy(dense, None, prompt, quantized=fp8)
            assert max(shortfalls(reference, prompt, base)) > 10 * FP16_GAP, name


def test_lora_refused_elsewhere(cpu_runtime, tiny_checkpoints, monkeypatch):
    """Releases whose LoRA internals were not checked, and tensor parallelism: one line, at construction, naming the
    architecture and the switch that keeps SGLang's own class."""
    from sglang.srt.runtime_context import get_lora

    monkeypatch.setattr(compat, "LORA_INTERNALS_CHECKED", ("0.0.1",))
    with get_lora().override(enable_lora=True), pytest.raises(UnsupportedConfigError) as err:
        load_with_sglang(tiny_checkpoints[ARCH])
    message = str(err.value)
    assert message.startswith(
        f"{ARCH}: SGLang's LoRA (--enable-lora / --lora-paths) with ATOM's class is checked on SGLang 0.0.1 only"
    ), message
    assert f"not {compat.installed_version()}" in message
    assert "ATOM_TAKE_OVER=none" in message and "\n" not in message

    monkeypatch.setattr(compat, "LORA_INTERNALS_CHECKED", (str(compat.installed_version()),))
    two_ranks = SimpleNamespace(tp_size=2, attn_tp_size=2, pp_size=1)
    monkeypatch.setattr(compat, "parallel", lambda: two_ranks)
    with get_lora().override(enable_lora=True), pytest.raises(UnsupportedConfigError) as err:
        load_with_sglang(tiny_checkpoints[ARCH])
    assert str(err.value).startswith(f"{ARCH}: SGLang's LoRA with ATOM's class runs on one rank only, not tp_size=2")


def test_lora_layers_and_targets(cpu_runtime, tiny_checkpoints):
    """ATOM's linear layers get ATOM's wrapper through SGLang's get_lora_layer (as the manager calls it), the sizes
    SGLang's pool asks for are the layers', and targets that are no ATOM linear layer are refused by name."""
    if not compat.lora_internals_checked():
        pytest.skip(f"SGLang {compat.installed_version()}: ATOM's class refuses LoRA")
    import sglang.srt.lora.lora_manager as manager
    from sglang.srt.runtime_context import get_lora

    with get_lora().override(enable_lora=True):
        model = load_with_sglang(tiny_checkpoints[ARCH])
    config = model.config
    layer = model.model.layers[0]
    wrapped = manager.get_lora_layer(layer.self_attn.qkv_proj, SimpleNamespace(max_loras_per_batch=2))
    assert type(wrapped).__name__ == "AtomLinearWithLoRA" and wrapped.base_layer is layer.self_attn.qkv_proj
    assert wrapped.split == layer.self_attn.qkv_proj.split  # the model's own calls reach ATOM's layer
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    assert model.get_hidden_dim("qkv_proj", 1) == (config.hidden_size, q + 2 * kv)
    assert model.get_hidden_dim("gate_up_proj", 0) == (config.hidden_size, 2 * config.intermediate_size)
    assert model.get_hidden_dim("down_proj", 1) == (config.intermediate_size, config.hidden_size)
    for target in ("embed_tokens", "lm_head"):
        with pytest.raises(UnsupportedConfigError, match=f"LoRA target '{target}' is no linear layer"):
            model.get_hidden_dim(target, 0)
    with pytest.raises(UnsupportedConfigError, match="adapters apply to ATOM's linear layers only"):
        manager.get_lora_layer(model.model.embed_tokens, SimpleNamespace(max_loras_per_batch=2))


def test_lora_on_moe_experts_refused(cpu_runtime, tiny_checkpoints):
    """Qwen3-MoE: its MLPs are experts (no ATOM linear layer named gate_up_proj / down_proj), so SGLang's pool asking
    for those targets is refused naming them; the attention projections take adapters."""
    arch = "Qwen3MoeForCausalLM"
    if not compat.lora_internals_checked() or arch not in tiny_checkpoints:
        pytest.skip("ATOM's class refuses LoRA here, or does not serve Qwen3-MoE")
    from sglang.srt.runtime_context import get_lora

    with get_lora().override(enable_lora=True):
        model = load_with_sglang(tiny_checkpoints[arch])
    assert model.get_hidden_dim("o_proj", 0)[1] == model.config.hidden_size
    for target in ("gate_up_proj", "down_proj"):
        with pytest.raises(UnsupportedConfigError, match=f"target '{target}' is no linear layer .* not MoE experts"):
            model.get_hidden_dim(target, 0)


def test_batch_tokens_from_sglang_batch_info():
    """Each token's slot and scaling from the backend's segments; a rank-0 slot (no adapter) gives -1."""
    info = SimpleNamespace(
        num_segments=3,
        weight_indices=torch.tensor([2, 0, 1], dtype=torch.int32),
        seg_lens=torch.tensor([2, 1, 3], dtype=torch.int32),
        lora_ranks=torch.tensor([4, 0, 8], dtype=torch.int32),
        scalings=torch.tensor([2.0, 0.0, 0.5]),
        permutation=None,
    )
    tokens = lora.BatchTokens(SimpleNamespace(get_batch_info=lambda: info))
    assert tokens.token_adapter.tolist() == [2, 2, 0, -1, -1, -1]
    assert tokens.token_scale.tolist() == [0.5, 0.5, 2.0, 0.0, 0.0, 0.0]
    info.permutation = torch.tensor([5, 4, 3, 2, 1, 0])
    assert tokens.token_adapter.tolist() == [-1, -1, -1, 0, 2, 2]
    assert lora.BatchTokens(SimpleNamespace(get_batch_info=lambda: None)).token_adapter is None
