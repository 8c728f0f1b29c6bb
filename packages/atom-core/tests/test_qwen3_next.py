"""Qwen3-Next (hybrid Gated DeltaNet + gated attention, MoE) against transformers' Qwen3NextForCausalLM.

The tiny checkpoint is written by transformers, then the parameters its initialisation leaves
degenerate are randomised: every zero-centred norm weight (transformers sets them to 0, which would
hide a missing "+1"), the gated norm's weight, ``dt_bias`` and ``A_log`` (drawn so that decays are
mild and the recurrent state carries information across many tokens, which transformers'
``uniform(0.01, 16)`` mostly does not).

* fp32 CPU parity: prefill logits of three prompts (2, 7 and 50 tokens) in one batch, greedy decode
  tokens and their log-probabilities (``parity.check_model``), with the SSM state pool K-major and
  V-major, and with the GDN ops forced onto their Triton kernels (interpreter);
* tensor parallelism over two gloo ranks (heads split; the per-group packing undone per rank);
* the loader's un-interleaving of ``in_proj_qkvz`` / ``in_proj_ba`` against transformers' own split;
* bf16 parity on a GPU.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import hf_model
from parity import BF16_LOGIT_ATOL, FP32_LOGIT_ATOL, PROMPTS, check_model, reference_logits

from atom_core.runtime.host import NativeHost
from atom_core.runtime.positions import PositionPlan
from atom_core.runtime.runner import Runner
from atom_kernels import OPS
from atom_kernels.gdn import K_MAJOR, V_MAJOR

ARCH = "Qwen3NextForCausalLM"
GDN_OPS = ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "causal_conv1d", "causal_conv1d_update",
           "rms_norm_gated")


def _is_vision_norm_weight(name: str) -> bool:
    """A LayerNorm weight of a vision tower (Qwen3.5's checkpoints share this helper)."""
    return ".visual." in name and "norm" in name and name.endswith(".weight")


def _randomise_degenerate_params(src: str, dst: Path, load=hf_model) -> str:
    """A copy of the checkpoint in ``src`` (read with ``load``) with the parameters above randomised."""
    if not (dst / "config.json").exists():
        model = load(src)
        gen = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("A_log"):
                    param.copy_(torch.empty(param.shape).uniform_(0.02, 0.4, generator=gen).log())
                elif name.endswith("dt_bias"):
                    param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
                elif name.endswith("linear_attn.norm.weight") or _is_vision_norm_weight(name):  # not zero-centred
                    param.copy_(1 + torch.randn(param.shape, generator=gen) * 0.2)
                elif name.endswith("norm.weight"):  # zero-centred: input/post-attention/final, q_norm, k_norm
                    param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
        model.save_pretrained(str(dst))
        for extra in ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"):
            if (Path(src) / extra).is_file():
                shutil.copy(Path(src) / extra, dst / extra)
    return str(dst)


@pytest.fixture(scope="session")
def next_dir(tiny, tmp_path_factory):
    return _randomise_degenerate_params(tiny(ARCH), tmp_path_factory.getbasetemp() / "qwen3-next-randomised")


@pytest.fixture(scope="session")
def next_hf(next_dir):
    return hf_model(next_dir)


@pytest.mark.parametrize("layout", [K_MAJOR, V_MAJOR])
def test_fp32_cpu_parity(next_dir, next_hf, monkeypatch, layout):
    monkeypatch.setattr(NativeHost, "linear_attention_layout", layout)
    runner = check_model(next_dir, next_hf, max_new_tokens=8 if layout == K_MAJOR else 4)
    pool = runner.host.state_pool
    assert pool.layout == layout and len(pool.ssm) == 2  # two linear-attention layers
    heads, k_dim, v_dim = 4, 32, 32
    assert pool.ssm[0].shape[1:] == ((heads, k_dim, v_dim) if layout == K_MAJOR else (heads, v_dim, k_dim))
    assert pool.conv[0].shape[1:] == (2 * 2 * 32 + 4 * 32, 3)


def _prefill_then_decode(runner: Runner, prompts: list[list[int]], steps: int) -> list[torch.Tensor]:
    """Logits of a batched prefill, then of ``steps`` greedy decode steps (every sequence one token each)."""
    runner._ensure_cache(sum(map(len, prompts)) + (steps + 1) * runner.block_size * len(prompts))
    seqs = runner._new_sequences(len(prompts))
    out = []
    try:
        with torch.inference_mode():
            logits = runner.model.compute_logits(runner._step(seqs, prompts, [PositionPlan()] * len(prompts))).float()
            out.append(logits)
            last = torch.tensor([len(p) for p in prompts]).cumsum(0) - 1
            for _ in range(steps):
                tokens = logits[last].argmax(-1).tolist()
                hidden = runner._step(seqs, [[t] for t in tokens], [PositionPlan()] * len(prompts))
                logits = runner.model.compute_logits(hidden).float()
                out.append(logits)
                last = torch.arange(len(prompts))
    finally:
        runner._release(seqs)
    return out


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs the Triton kernels on CPU tensors (interpreter)")
def test_gdn_triton_kernels_through_the_model(next_dir, monkeypatch):
    """The GDN ops on their Triton kernels (CPU interpreter) give the logits of their references, in a
    batched prefill (one prompt across a chunk boundary) and the decode steps after it."""
    prompts = [PROMPTS[0], list(range(30, 100))]
    want = _prefill_then_decode(Runner(next_dir), prompts, steps=2)
    monkeypatch.setenv("ATOM_KERNEL_BACKEND", ",".join(f"{op}=triton" for op in GDN_OPS))
    calls = dict.fromkeys(GDN_OPS, 0)
    for op in GDN_OPS:  # count the Triton calls: a silent fallback to the reference would make this test vacuous
        fn, unsupported = OPS[op].implementation("triton")

        def counted(*args, _fn=fn, _op=op, **kwargs):
            calls[_op] += 1
            return _fn(*args, **kwargs)

        monkeypatch.setitem(OPS[op]._impls, "triton", (counted, unsupported))
    got = _prefill_then_decode(Runner(next_dir), prompts, steps=2)
    for step, (g, w) in enumerate(zip(got, want)):
        assert (g - w).abs().max().item() <= FP32_LOGIT_ATOL, f"step {step}"
    layers = 2  # linear-attention layers
    assert calls == {"chunk_gated_delta_rule": layers, "causal_conv1d": layers, "fused_recurrent_gated_delta_rule": 2 * layers,
                     "causal_conv1d_update": 2 * layers, "rms_norm_gated": 3 * layers}


def test_prefill_in_two_steps_continues_the_state(next_dir, next_hf):
    """A prompt run as two prefill chunks (the second continuing from the first's conv/SSM state and KV)
    gives the logits of the prompt run at once."""
    runner = Runner(next_dir)
    prompt = PROMPTS[2]
    runner._ensure_cache(len(prompt) + runner.block_size)
    seqs = runner._new_sequences(1)
    try:
        with torch.inference_mode():
            first = runner.model.compute_logits(runner._step(seqs, [prompt[:37]], [PositionPlan()]))
            second = runner.model.compute_logits(runner._step(seqs, [prompt[37:]], [PositionPlan()]))
    finally:
        runner._release(seqs)
    want = reference_logits(next_hf, [prompt])[0]
    got = torch.cat([first, second]).float()
    assert (got - want).abs().max().item() <= FP32_LOGIT_ATOL


def test_loader_unpacks_grouped_projections(next_dir, next_hf):
    """Each rank's [q | k | v | z] and [b | a] rows equal transformers' per-head split of the packed tensors."""
    from atom_core.layers.gdn import GatedDeltaNet

    ref = next_hf.model.layers[0].linear_attn
    x = torch.randn(5, 256)
    q, k, v, z, b, a = ref.fix_query_key_value_ordering(ref.in_proj_qkvz(x)[None], ref.in_proj_ba(x)[None])
    conv = ref.conv1d.weight
    world = 2
    for rank in range(world):
        runner = Runner(next_dir, tp=_FakeTP(rank, world))
        layer = runner.model.model.layers[0].linear_attn
        assert isinstance(layer, GatedDeltaNet)
        with torch.no_grad():
            qkvz, ba = layer.in_proj_qkvz(x), layer.in_proj_ba(x)
        hk, hv = slice(rank, rank + 1), slice(2 * rank, 2 * rank + 2)  # this rank's key head and value heads
        want = torch.cat([q[0, :, hk].flatten(1), k[0, :, hk].flatten(1), v[0, :, hv].flatten(1), z[0, :, hv].flatten(1)], 1)
        torch.testing.assert_close(qkvz, want)
        torch.testing.assert_close(ba, torch.cat([b[0, :, hv], a[0, :, hv]], 1))
        channels = torch.cat([torch.arange(32) + 32 * rank, 64 + torch.arange(32) + 32 * rank, 128 + torch.arange(64) + 64 * rank])
        torch.testing.assert_close(layer.conv1d.weight.data, conv.data[channels])
        torch.testing.assert_close(layer.A_log.data, ref.A_log.data[hv])


class _FakeTP:
    """One rank's view of a tensor-parallel group, without communication (for checking the split)."""

    def __init__(self, rank: int, world_size: int):
        self.rank, self.world_size = rank, world_size

    def all_reduce(self, x):
        return x

    def all_gather(self, x, dim=-1):
        return x


# ------------------------------------------------------------------------------------- TP over gloo
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, port: int, model_dir: str, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        from atom_core.host import TorchDistributedTP
        from atom_core.runtime.sampler import SamplingParams

        torch.set_num_threads(1)
        runner = Runner(model_dir, tp=TorchDistributedTP())
        logits = runner.prompt_logits(PROMPTS)
        tokens = [o.token_ids for o in runner.generate(PROMPTS, SamplingParams(max_new_tokens=4, ignore_eos=True))]
        torch.save({"logits": logits, "tokens": tokens}, f"{out_path}.{rank}")
    finally:
        dist.destroy_process_group()


def test_tp2_matches_transformers(next_dir, next_hf, tmp_path):
    out = str(tmp_path / "tp")
    mp.spawn(_rank_main, args=(_free_port(), next_dir, out), nprocs=2, join=True)
    results = [torch.load(f"{out}.{r}") for r in range(2)]
    want = reference_logits(next_hf, PROMPTS)
    for rank, result in enumerate(results):
        for got, ref in zip(result["logits"], want):
            assert (got - ref).abs().max().item() <= FP32_LOGIT_ATOL, f"rank {rank}"
    assert results[0]["tokens"] == results[1]["tokens"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_bf16_cuda_parity(next_dir, next_hf):
    check_model(next_dir, next_hf, device="cuda", dtype=torch.bfloat16, atol=BF16_LOGIT_ATOL)


def test_layer_schedule_from_layer_types_or_full_attention_interval():
    """transformers' rule: ``layer_types`` when given, else every ``full_attention_interval``-th layer (default
    4) is full attention — SGLang's own Qwen3NextConfig keeps only the interval."""
    from types import SimpleNamespace

    from atom_core.config import hybrid_layer_types

    lin, full = "linear_attention", "full_attention"
    assert hybrid_layer_types(SimpleNamespace(num_hidden_layers=4, full_attention_interval=2)) == [lin, full, lin, full]
    assert hybrid_layer_types(SimpleNamespace(num_hidden_layers=5)) == [lin, lin, lin, full, lin]
    given = [full, lin, lin]
    assert hybrid_layer_types(SimpleNamespace(num_hidden_layers=3, layer_types=given, full_attention_interval=2)) == given
    from transformers import Qwen3NextConfig

    for interval in (2, 3, 4):
        hf = Qwen3NextConfig(num_hidden_layers=7, full_attention_interval=interval)
        assert hybrid_layer_types(SimpleNamespace(num_hidden_layers=7, full_attention_interval=interval)) == hf.layer_types
