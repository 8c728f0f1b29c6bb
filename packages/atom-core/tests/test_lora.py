"""LoRA adapters made by peft, applied in ATOM's linear layers by the native runner, against transformers + peft.

Every adapter here has random A *and* B (peft starts B at zero, which would make an adapter a no-op and these
tests unable to fail).  fp32 on CPU: the tolerance is parity's FP32_LOGIT_ATOL (summation order only).
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import hf_model
from parity import FP32_LOGIT_ATOL, PROMPTS, reference_greedy, reference_logits
from quant_helpers import logit_metrics, reference_with_quantized_weights
from safetensors.torch import save_file

from atom_core.errors import CheckpointError, UnsupportedConfigError, UsageError
from atom_core.lora import load_adapter, parse_lora_option
from atom_core.quant.quantize import quantize_checkpoint
from atom_core.runtime.runner import Runner
from atom_core.runtime.sampler import SamplingParams
from atom_core.tiny import random_lora_adapter

peft = pytest.importorskip("peft")

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
DENSE = [*ATTENTION, "gate_proj", "up_proj", "down_proj"]
NEW_TOKENS = 6


def make_adapter(model_dir: str, out, targets: list[str], *, seed: int, r: int = 4, alpha: int = 8,
                 rslora: bool = False, base=None):
    """A peft adapter of ``model_dir`` (or of the transformers model ``base``) with random A and B, saved at
    ``out``; returns (dir, the peft model)."""
    model = random_lora_adapter(base if base is not None else hf_model(model_dir), out, targets, seed=seed, r=r,
                                alpha=alpha, rslora=rslora)
    return str(out), model.eval()


def assert_close(got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> None:
    for prompt, g, w in zip(PROMPTS, got, want):
        err = (g - w).abs().max().item()
        assert err <= FP32_LOGIT_ATOL, f"{what}, prompt of {len(prompt)} tokens: max |Δlogit| {err:.2e}"


def assert_greedy(runner: Runner, reference, adapters) -> None:
    outputs = runner.generate(PROMPTS, SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True), adapters=adapters)
    for prompt, out, ref in zip(PROMPTS, outputs, reference):
        tokens, _ = reference_greedy(ref, prompt, NEW_TOKENS)
        assert out.token_ids == tokens, f"prompt of {len(prompt)} tokens: {out.token_ids} != reference {tokens}"


@pytest.mark.parametrize("arch, targets, rslora", [
    ("LlamaForCausalLM", DENSE, False),
    ("Qwen3ForCausalLM", DENSE, True),
    ("Qwen3MoeForCausalLM", ATTENTION, False),  # attention targets of a MoE family (experts are refused, below)
])
def test_adapter_matches_peft(tiny, tmp_path, arch, targets, rslora):
    model_dir = tiny(arch)
    adapter_dir, reference = make_adapter(model_dir, tmp_path / "a", targets, seed=1, rslora=rslora)
    runner = Runner(model_dir, lora={"a": adapter_dir})
    got = runner.prompt_logits(PROMPTS, adapters=["a"] * len(PROMPTS))
    assert_close(got, reference_logits(reference, PROMPTS), "adapter a")
    base = reference_logits(hf_model(model_dir), PROMPTS)
    assert min((g - b).abs().max().item() for g, b in zip(got, base)) > 100 * FP32_LOGIT_ATOL, "the adapter changed nothing"
    assert_greedy(runner, [reference] * len(PROMPTS), ["a"] * len(PROMPTS))


def test_two_adapters_and_none_in_one_batch(tiny, tmp_path):
    """Each prompt of one batch gets its own adapter's answer; the prompt without one gets the base model's."""
    model_dir = tiny("Qwen3ForCausalLM")
    a_dir, a_ref = make_adapter(model_dir, tmp_path / "a", DENSE, seed=1)
    b_dir, b_ref = make_adapter(model_dir, tmp_path / "b", ["q_proj", "v_proj", "down_proj"], seed=2, r=8, alpha=4)
    base = hf_model(model_dir)
    runner = Runner(model_dir, lora={"a": a_dir, "b": b_dir})
    refs = [a_ref, b_ref, base]
    adapters = ["a", "b", None]
    got = runner.prompt_logits(PROMPTS, adapters=adapters)
    want = [reference_logits(ref, [p])[0] for ref, p in zip(refs, PROMPTS)]
    assert_close(got, want, "mixed batch")
    assert_greedy(runner, refs, adapters)
    # the same batch the other way round: adapters follow the prompt, not the position
    got = runner.prompt_logits(PROMPTS, adapters=[None, "a", "b"])
    want = [reference_logits(ref, [p])[0] for ref, p in zip([base, a_ref, b_ref], PROMPTS)]
    assert_close(got, want, "mixed batch, rotated")
    assert_close(runner.prompt_logits(PROMPTS), reference_logits(base, PROMPTS), "no adapters")


# relative logit error against transformers + peft over the dequantized weights.  Per-token FP8 activations
# (ptpc-fp8) round each token's activations afresh: a float32 summation-order difference in the adapted
# activations flips a rounding here and there (measured 8.6e-4 on the 50-token prompt, 2e-6 on the others).
QUANTIZED_REL_TOL = {"fp8-block": 1e-5, "ptpc-fp8": 2e-3, "mxfp4": 1e-5}


@pytest.mark.parametrize("scheme", sorted(QUANTIZED_REL_TOL))
def test_adapter_over_a_quantized_base(tiny, tmp_path, scheme):
    """The adapter's delta is added in float32 on top of the quantized layer's output (the base GEMM, activation
    quantization included, unchanged): equal to transformers + peft over the dequantized weights."""
    src = tiny("Qwen3ForCausalLM")
    out = str(quantize_checkpoint(src, tmp_path / "q", scheme))
    base = reference_with_quantized_weights(hf_model(src), out, scheme)
    adapter_dir, reference = make_adapter(src, tmp_path / "a", DENSE, seed=3, base=base)
    runner = Runner(out, lora={"a": adapter_dir})
    got = runner.prompt_logits(PROMPTS, adapters=["a", None, "a"])
    plain = reference_with_quantized_weights(hf_model(src), out, scheme)
    want = [reference_logits(ref, [p])[0] for ref, p in zip([reference, plain, reference], PROMPTS)]
    rel, max_abs, _ = logit_metrics(got, want)
    tol = QUANTIZED_REL_TOL[scheme]
    assert rel <= tol, f"{scheme}: relative error {rel:.2e} (max {max_abs:.2e}) against transformers + peft"
    unadapted = logit_metrics(got[:1], reference_logits(plain, PROMPTS[:1]))[0]
    assert unadapted > 100 * tol, f"{scheme}: the adapter changed the logits by {unadapted:.2e} only"


def test_runner_without_adapters_is_unchanged(tiny):
    model_dir = tiny("LlamaForCausalLM")
    assert_close(Runner(model_dir).prompt_logits(PROMPTS), reference_logits(hf_model(model_dir), PROMPTS), "base")


def _write_adapter(out, tensors: dict[str, torch.Tensor], **config) -> str:
    out.mkdir(parents=True, exist_ok=True)
    (out / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 2, **config}))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "adapter_model.safetensors"))
    return str(out)


def _pair(module: str, rows: int, cols: int, r: int = 2) -> dict[str, torch.Tensor]:
    return {f"base_model.model.{module}.lora_A.weight": torch.randn(r, cols),
            f"base_model.model.{module}.lora_B.weight": torch.randn(rows, r)}


@pytest.mark.parametrize("module, message", [
    ("model.layers.0.mlp.experts.0.gate_proj", "is an MoE expert: LoRA is supported on ATOM's linear layers only"),
    ("model.layers.0.mlp.gate", "is a Router"),
    ("model.embed_tokens", "is a VocabParallelEmbedding"),
    ("model.layers.0.self_attn.nothing_here", "names no module of"),
])
def test_unsupported_targets_are_refused(tiny, tmp_path, module, message):
    model_dir = tiny("Qwen3MoeForCausalLM")
    adapter = _write_adapter(tmp_path / "x", _pair(module, 8, 8))
    with pytest.raises(UnsupportedConfigError, match=message) as err:
        Runner(model_dir, lora={"x": adapter})
    assert module in str(err.value) and "\n" not in str(err.value)


def test_latent_attention_absorbed_projection_refused(tiny, tmp_path):
    """DeepSeek-V3's kv_b_proj is read as a weight by the latent attention: an adapter there is refused, not
    silently dropped; its other projections take adapters."""
    from atom_core.config import load_hf_config

    model_dir = tiny("DeepseekV3ForCausalLM")
    cfg = load_hf_config(model_dir)
    heads = cfg.num_attention_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim)
    adapter = _write_adapter(tmp_path / "x", _pair("model.layers.0.self_attn.kv_b_proj", heads, cfg.kv_lora_rank))
    with pytest.raises(UnsupportedConfigError, match="kv_b_proj.*read by the attention itself"):
        Runner(model_dir, lora={"x": adapter})
    adapter = _write_adapter(tmp_path / "o", _pair("model.layers.0.self_attn.o_proj", cfg.hidden_size,
                                                   cfg.num_attention_heads * cfg.v_head_dim))
    assert Runner(model_dir, lora={"o": adapter}).model.model.layers[0].self_attn.o_proj.lora is not None


def test_adapter_shape_mismatch(tiny, tmp_path):
    adapter = _write_adapter(tmp_path / "x", _pair("model.layers.0.self_attn.q_proj", 5, 7))
    with pytest.raises(CheckpointError, match="do not fit the layer"):
        Runner(tiny("LlamaForCausalLM"), lora={"x": adapter})


@pytest.mark.parametrize("config, tensors, error, message", [
    ({"peft_type": "IA3"}, None, UnsupportedConfigError, "peft_type 'IA3'"),
    ({"use_dora": True}, None, UnsupportedConfigError, "DoRA"),
    ({"bias": "all"}, None, UnsupportedConfigError, "trained biases"),
    ({"modules_to_save": ["lm_head"]}, None, UnsupportedConfigError, "modules_to_save"),
    ({"r": 0}, None, CheckpointError, "r must be a positive integer"),
    ({"lora_alpha": "big"}, None, CheckpointError, "lora_alpha must be a finite number"),
    ({}, {"base_model.model.m.lora_A.weight": torch.randn(2, 4)}, CheckpointError, "has no lora_B"),
    ({}, {"base_model.model.m.lora_embedding_A": torch.randn(2, 4)}, UnsupportedConfigError, "not a LoRA A/B weight"),
    ({}, {"base_model.model.m.lora_A.weight": torch.randn(3, 4), "base_model.model.m.lora_B.weight": torch.randn(4, 3)},
     CheckpointError, "do not have rank r = 2"),
])
def test_bad_adapter_files(tmp_path, config, tensors, error, message):
    adapter = _write_adapter(tmp_path / "x", tensors or _pair("m", 4, 4), **config)
    with pytest.raises(error, match=message) as err:
        load_adapter("x", adapter)
    assert "\n" not in str(err.value)


def test_adapter_paths_and_names(tmp_path):
    outside = _write_adapter(tmp_path / "outside", _pair("m", 4, 4))
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2}))
    (linked / "adapter_model.safetensors").symlink_to(f"{outside}/adapter_model.safetensors")
    with pytest.raises(CheckpointError, match="outside the checkpoint directory"):
        load_adapter("x", linked)
    with pytest.raises(UsageError, match="is not a directory"):
        load_adapter("x", tmp_path / "missing")
    with pytest.raises(CheckpointError, match="adapter_config.json is missing"):
        load_adapter("x", tmp_path)
    for bad in ("../a", "", "a b", "x" * 65):
        with pytest.raises(UsageError, match="adapter name"):
            load_adapter(bad, outside)
    assert parse_lora_option("sql=/a/b")[0] == "sql"
    with pytest.raises(UsageError, match="expected NAME=PATH"):
        parse_lora_option("/a/b")


def test_unknown_adapter_name_in_a_request(tiny, tmp_path):
    model_dir = tiny("LlamaForCausalLM")
    adapter = _write_adapter(tmp_path / "x", _pair("model.layers.0.self_attn.q_proj", 256, 256))
    runner = Runner(model_dir, lora={"x": adapter})
    with pytest.raises(UsageError, match="adapter 'y' is not loaded"):
        runner.prompt_logits(PROMPTS, adapters=["y", None, None])
    with pytest.raises(UsageError, match="one per prompt"):
        runner.prompt_logits(PROMPTS, adapters=["x"])
    with pytest.raises(UsageError, match="built without LoRA adapters"):
        Runner(model_dir).prompt_logits(PROMPTS, adapters=["x", None, None])
    with pytest.raises(UsageError, match="speculative decoding with LoRA adapters is not supported"):
        Runner(model_dir, lora={"x": adapter}, speculative_tokens=1)  # the draft would run without the adapter


def _tp_rank(rank: int, port: int, model_dir: str, adapter_dir: str, out_path: str) -> None:
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        from atom_core.host import TorchDistributedTP

        torch.set_num_threads(1)
        runner = Runner(model_dir, tp=TorchDistributedTP(), lora={"a": adapter_dir})
        torch.save(runner.prompt_logits(PROMPTS, adapters=["a", None, "a"]), f"{out_path}.{rank}")
    finally:
        dist.destroy_process_group()


def test_tp2_adapter_follows_the_parallel_layers(tiny, tmp_path):
    """Two CPU ranks (gloo): column-parallel layers keep their rows of B (kv heads replicated over the ranks
    included), row-parallel layers their columns of A, the partial delta summed by the layer's all-reduce."""
    import torch.multiprocessing as mp
    from test_tensor_parallel import _free_port

    model_dir = tiny("LlamaForCausalLM", num_key_value_heads=1)
    adapter_dir, reference = make_adapter(model_dir, tmp_path / "a", DENSE, seed=4)
    out = str(tmp_path / "tp")
    mp.spawn(_tp_rank, args=(_free_port(), model_dir, adapter_dir, out), nprocs=2, join=True)
    base = hf_model(model_dir)
    want = [reference_logits(ref, [p])[0] for ref, p in zip([reference, base, reference], PROMPTS)]
    for rank in range(2):
        assert_close(torch.load(f"{out}.{rank}"), want, f"rank {rank}")


def test_generate_command_with_lora(tiny, tmp_path, capsys):
    """``atom generate --lora NAME=PATH [--adapter NAME ...]``: each prompt's tokens are transformers + peft's."""
    from atom_core.cli import main

    model_dir = tiny("Qwen3ForCausalLM")
    a_dir, a_ref = make_adapter(model_dir, tmp_path / "a", DENSE, seed=1)
    b_dir, b_ref = make_adapter(model_dir, tmp_path / "b", ATTENTION, seed=2)
    prompts = PROMPTS[:2]
    common = ["generate", "--model", model_dir, "--prompt-token-ids", ",".join(map(str, prompts[0])),
              "--prompt-token-ids", ",".join(map(str, prompts[1])), "--max-new-tokens", str(NEW_TOKENS),
              "--dtype", "float32", "--device", "cpu", "--ignore-eos", "--json"]
    assert main([*common, "--lora", f"a={a_dir}"]) == 0  # the only adapter: every prompt uses it
    lines = [json.loads(line)["token_ids"] for line in capsys.readouterr().out.strip().splitlines()]
    assert lines == [reference_greedy(a_ref, p, NEW_TOKENS)[0] for p in prompts]
    assert main([*common, "--lora", f"a={a_dir}", "--lora", f"b={b_dir}", "--adapter", "b", "--adapter", "a"]) == 0
    lines = [json.loads(line)["token_ids"] for line in capsys.readouterr().out.strip().splitlines()]
    assert lines == [reference_greedy(ref, p, NEW_TOKENS)[0] for ref, p in zip([b_ref, a_ref], prompts)]
    for bad, message in ((["--lora", f"a={a_dir}", "--lora", f"b={b_dir}"], "name the one the prompts use"),
                         (["--lora", f"../x={a_dir}"], "adapter name '../x'"),
                         (["--lora", f"a={a_dir}", "--adapter", "c"], "adapter 'c' is not loaded")):
        assert main([*common, *bad]) == 2
        assert message in capsys.readouterr().err


class _Tokens:
    token_adapter = None


def test_slots_write_clear_and_per_token_index():
    """LoraSlots (a host's adapter manager's interface): a fused q|k|v layer with two slots; slot 1 holds an adapter
    on q and v (rank 2 < the slot's 4), slot 0 one on k only.  Each token gets its own slot's ``x Aᵀ Bᵀ`` on its
    shard's rows and nothing elsewhere; a token with index -1 and a cleared slot get the base output."""
    from atom_core.layers.linear import QKVParallelLinear
    from atom_core.lora import LoraSlots
    from atom_core.runtime.host import NativeHost

    torch.manual_seed(0)
    layer = QKVParallelLinear(8, 4, 2, 1, host=NativeHost(), prefix="qkv")  # q 8, k 4, v 4 rows
    layer.weight.data.normal_()  # built empty (the loader writes it): garbage would drown the delta in the difference
    tokens = _Tokens()
    slots = LoraSlots(tokens, layer, slots=2, rank=4)
    layer.lora = slots
    a = {s: torch.randn(2, 8) for s in "qkv"}
    b = {"q": torch.randn(8, 2), "k": torch.randn(4, 2), "v": torch.randn(4, 2)}
    slots.write(1, 0, a["q"], b["q"], "q")
    slots.write(1, 2, a["v"], b["v"], "v")
    slots.write(0, 1, a["k"], b["k"], "k")
    x = torch.randn(3, 8)
    base = layer(x)
    tokens.token_adapter = torch.tensor([1, 0, -1])
    got = layer(x) - base
    want = torch.zeros_like(got)
    want[0, :8], want[0, 12:] = x[0] @ a["q"].t() @ b["q"].t(), x[0] @ a["v"].t() @ b["v"].t()
    want[1, 8:12] = x[1] @ a["k"].t() @ b["k"].t()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    tokens.token_scale = torch.tensor([0.5, 3.0, 7.0])  # a host scaling B per token (SGLang's manager)
    torch.testing.assert_close(layer(x) - base, want * torch.tensor([[0.5], [3.0], [0.0]]), rtol=1e-5, atol=1e-5)
    tokens.token_scale = None
    slots.clear(1)
    want[0] = 0
    torch.testing.assert_close(layer(x) - base, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(CheckpointError, match="rank 5"):
        slots.write(0, 0, torch.randn(5, 8), torch.randn(8, 5), "q")
