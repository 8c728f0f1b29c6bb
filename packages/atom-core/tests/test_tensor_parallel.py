"""Tensor parallelism on the native host: two CPU ranks (gloo) give the same logits as transformers,
including tied embeddings, kv heads replicated across ranks (fewer kv heads than ranks), a MoE block with a
gated shared expert (one all-reduce for both) and DeepSeek-V3's latent attention (heads split, latent shared)."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import hf_model
from parity import FP32_LOGIT_ATOL, PROMPTS, reference_logits

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, model_dir: str, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        from atom_core.host import TorchDistributedTP
        from atom_core.runtime.runner import Runner
        from atom_core.runtime.sampler import SamplingParams

        torch.set_num_threads(1)
        runner = Runner(model_dir, tp=TorchDistributedTP())
        logits = runner.prompt_logits(PROMPTS)
        tokens = [o.token_ids for o in runner.generate(PROMPTS, SamplingParams(max_new_tokens=4, ignore_eos=True))]
        qkv = getattr(runner.model.model.layers[0].self_attn, "qkv_proj", None)
        shard = tuple(qkv.weight.shape) if qkv is not None else None
        torch.save({"logits": logits, "tokens": tokens, "qkv_shard": shard}, f"{out_path}.{rank}")
    finally:
        dist.destroy_process_group()


def run_tp(model_dir: str, tmp_path) -> list[dict]:
    out = str(tmp_path / "tp")
    mp.spawn(_rank_main, args=(_free_port(), model_dir, out), nprocs=WORLD, join=True)
    return [torch.load(f"{out}.{r}") for r in range(WORLD)]


@pytest.mark.parametrize(
    "arch,overrides",
    [("Qwen2ForCausalLM", {}), ("LlamaForCausalLM", {"num_key_value_heads": 1}), ("Qwen2MoeForCausalLM", {}),
     ("DeepseekV3ForCausalLM", {}), ("GlmMoeDsaForCausalLM", {})],
    ids=["qwen2-tied", "llama-kv-replicated", "qwen2-moe-shared-expert", "deepseek-v3-latent", "glm5-sparse-latent"],
)
def test_tp2_matches_transformers(tiny, tmp_path, arch, overrides):
    model_dir = tiny(arch, **overrides)
    results = run_tp(model_dir, tmp_path)
    hf = hf_model(model_dir)
    want = reference_logits(hf, PROMPTS)
    for rank, result in enumerate(results):
        for got, ref in zip(result["logits"], want):
            assert (got - ref).abs().max().item() <= FP32_LOGIT_ATOL, f"rank {rank}"
    assert results[0]["tokens"] == results[1]["tokens"]
    if results[0]["qkv_shard"] is None:
        return
    # each rank holds half the q heads and its share (or a replica) of the kv heads
    heads, kv_heads, head_dim = 4, overrides.get("num_key_value_heads", 2), 64
    local_kv = max(kv_heads // WORLD, 1)
    assert results[0]["qkv_shard"] == ((heads // WORLD + 2 * local_kv) * head_dim, 256)
