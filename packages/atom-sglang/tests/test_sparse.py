"""DeepSeek sparse attention (DeepSeek-V3.2, GLM-5) through SGLang's DSA pool on the CPU (atom_sglang.sparse).

test_forward compares both tiny models with transformers (chunked prefill + greedy decode; their indexer keeps 6
tokens, so the 7- and 50-token prompts and every decode step attend sparsely) and test_construct checks their loaded
weights; here: SGLang's ModelConfig makes them DSA models, the latent rows and FP8 indexer keys land in SGLang's
``DSATokenToKVPool`` in the layout and quantization SGLang's own kernels write and read, the selection matters (the
same run with every token kept differs from transformers), and what is not handled is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _sglang_batch import SGLangCPUBatch
from _sglang_env import load_with_sglang, run_fresh
from conftest import checkpoint_or_skip, reference_unfaithful
from test_forward import PROMPTS, check_against_transformers
from torch import nn

from atom_core.errors import UnsupportedConfigError
from atom_core.host import LatentAttentionSpec, SingleRank, SparseSelectionSpec
from atom_sglang import sparse
from atom_sglang.host import SGLangHost
from atom_sglang.sparse import SGLangSparseLatentAttention

ARCHS = ["DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM"]


@pytest.mark.sglang
@pytest.mark.parametrize("arch", ARCHS)
@torch.inference_mode()
def test_latent_rows_and_fp8_index_keys_in_sglangs_dsa_pool(arch, cpu_runtime, tiny_checkpoints):
    from sglang.srt.configs.model_config import is_deepseek_dsa
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool

    model = load_with_sglang(checkpoint_or_skip(arch, tiny_checkpoints))
    assert is_deepseek_dsa(model.config)  # SGLang's ModelRunner builds its DSA pool for this config
    layers = model.atom_host.attention_layers
    assert len(layers) == 3 and all(isinstance(m, SGLangSparseLatentAttention) for m in layers)
    own = [m.sparse.own_indexer for m in layers]
    assert own == ([True, False, True] if arch == "GlmMoeDsaForCausalLM" else [True] * 3)
    batch = SGLangCPUBatch(model, 2)
    batch.step({0: PROMPTS[0], 1: PROMPTS[2]})
    pool = batch.kv_pool
    assert isinstance(pool, DSATokenToKVPool) and batch.page_size == 64
    used = torch.cat([batch.req_pool.req_to_token[row, :n] for row, n in zip(batch.rows, batch.lengths)]).long()
    for layer_id, has_indexer in enumerate(own):
        rows = pool.get_key_buffer(layer_id)
        assert rows[used].abs().amax(-1).min() > 0 and not rows[0].any()  # SGLang's padding slot 0 untouched
        keys = sparse.load_index_keys(pool.get_index_k_with_scale_buffer(layer_id), used, 128)
        assert bool(keys.abs().amax(-1).min() > 0) is has_indexer  # a shared layer writes no indexer key
        assert not sparse.load_index_keys(pool.get_index_k_with_scale_buffer(layer_id), torch.tensor([0]), 128).any()


@pytest.mark.sglang
@pytest.mark.parametrize("arch", ARCHS)
@torch.inference_mode()
def test_the_selection_matters(arch, cpu_runtime, tiny_checkpoints, monkeypatch):
    """With every cached token selected (dense latent attention) the comparison with transformers fails."""
    model = load_with_sglang(checkpoint_or_skip(arch, tiny_checkpoints))
    if why := reference_unfaithful(arch, tiny_checkpoints[arch]):
        pytest.skip(why)
    for layer in model.atom_host.attention_layers:
        layer.sparse = SparseSelectionSpec(layer.sparse.index_head_dim, 1000, layer.sparse.index_scale, layer.sparse.own_indexer)
    with pytest.raises(AssertionError, match="max \\|logit - transformers\\|"):
        check_against_transformers(arch, tiny_checkpoints[arch], model)


SGLANG_KERNELS = """
import json, sys, torch
sys.path.insert(0, %r)
from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool
try:  # SGLang 0.5.23
    from sglang.kernels.ops.kvcache.dsa_index_k_cache import SetKAndS
    from sglang.kernels.ops.quantization.act_quant_triton import act_quant
except ModuleNotFoundError:  # 0.5.17
    from sglang.kernels.ops.attention.dsa.index_buf_accessor import SetKAndS
    from sglang.kernels.ops.attention.dsa.triton_kernel import act_quant
from atom_sglang import sparse
from _sglang_env import start_cpu_runtime
start_cpu_runtime(%r)

torch.manual_seed(0)
keys = torch.randn(70, 128) * torch.logspace(-3, 2, 70)[:, None]
fp8, scale = act_quant(keys.contiguous(), 128, "ue8m0")  # SGLang's DeepSeek-V3.2 indexer quantizer
ours_fp8, ours_scale = sparse.quantize_index_keys(keys)
pool = DSATokenToKVPool(size=256, page_size=64, kv_lora_rank=64, dtype=torch.float32, qk_rope_head_dim=16, layer_num=1,
                        device="cpu", index_head_dim=128, enable_memory_saver=False, kv_cache_dim=80)
loc = torch.randperm(256)[:70] + 64
buffer = pool.get_index_k_with_scale_buffer(0)
SetKAndS.execute(pool=pool, buf=buffer, loc=loc, index_k=fp8, index_k_scale=scale)
differ = fp8.view(torch.uint8) != ours_fp8.view(torch.uint8)
print(json.dumps({
    "scale_equal": bool(torch.equal(scale, ours_scale)),
    "fp8_equal_but_carries": bool(torch.equal(ours_fp8[differ].float(), 2 * fp8[differ].float())),
    "carries": int(differ.sum()),
    "read_back": (sparse.load_index_keys(buffer, loc, 128)
                  - fp8.float() * scale).abs().max().item(),
    "written": bool(torch.equal(sparse.load_index_keys(buffer, loc, 128), fp8.float() * scale)),
}))
"""


@pytest.mark.sglang
def test_quantization_and_layout_are_sglangs(tiny_checkpoints):
    """SGLang's own Triton quantizer and index-key writer (run by Triton's interpreter on the CPU): ATOM's scales are
    bit-equal and its FP8 values too, except where the interpreter's fp32 -> e4m3 cast drops the carry of a value
    rounding up to the next power of two (124.03 at scale 1 becomes 64, where round-to-nearest-even, the GPU's
    ``cvt.rn.satfinite`` and torch's cast give 128: ATOM's value is twice the interpreter's there); ATOM reads back
    exactly what SGLang's writer stored."""
    # published with a dense checkpoint: SGLang's argument resolution for a DSA one asks CUDA for the device capability
    code = SGLANG_KERNELS % (str(Path(__file__).parent), tiny_checkpoints["DeepseekV3ForCausalLM"])
    out = run_fresh(code, env={"TRITON_INTERPRET": "1"})
    carries = out.pop("carries")
    assert out == {"scale_equal": True, "fp8_equal_but_carries": True, "read_back": 0.0, "written": True}, out
    assert carries < 0.05 * 70 * 128


def test_store_then_load_round_trips_through_the_page_layout():
    page, dim = 64, 128
    buffer = torch.zeros(3, page * (dim + 4), dtype=torch.uint8)
    keys = torch.randn(5, dim)
    loc = torch.tensor([1, 63, 64, 130, 191])
    sparse.store_index_keys(buffer, loc, keys)
    fp8, scale = sparse.quantize_index_keys(keys)
    torch.testing.assert_close(sparse.load_index_keys(buffer, loc, dim), fp8.float() * scale, rtol=0, atol=0)
    assert (sparse.load_index_keys(buffer, loc, dim) - keys).abs().max() <= keys.abs().max() / 16  # e4m3: 3 bits
    keys_bytes = buffer[:, : page * dim].view(3, page, dim)
    assert keys_bytes[2, 2].any() and not keys_bytes[2, 3].any()  # token 130: page 2, offset 2
    assert buffer[1, page * dim :].view(torch.float32)[0] == scale[2, 0]  # token 64's scale: page 1's first


def _spec(own_indexer: bool = True) -> LatentAttentionSpec:
    return LatentAttentionSpec(64, 32, 16, 48, nn.Linear(64, 4 * 80), sparse=SparseSelectionSpec(128, 6, 128**-0.5, own_indexer))


@pytest.mark.sglang
@torch.inference_mode()
def test_a_pool_without_indexer_keys_is_refused(cpu_runtime, tiny_checkpoints):
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    pool = MLATokenToKVPool(
        size=64,
        page_size=1,
        dtype=torch.float32,
        kv_lora_rank=64,
        qk_rope_head_dim=16,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    with pytest.raises(
        UnsupportedConfigError,
        match=r"^sparse attention layer 0: SGLang's KV pool is "
        r"MLATokenToKVPool, which holds no indexer keys",
    ):
        sparse.check_pool(pool, 0, 128)


def test_other_pool_layouts_are_refused():
    from types import SimpleNamespace

    pooled = SimpleNamespace(get_index_k_with_scale_buffer=None, index_kpool=4, index_head_dim=128)
    with pytest.raises(UnsupportedConfigError, match="pools index keys or stores the latent in FP8"):
        sparse.check_pool(pooled, 3, 128)
    narrow = SimpleNamespace(get_index_k_with_scale_buffer=None, index_head_dim=128)
    with pytest.raises(UnsupportedConfigError, match="holds 128-wide indexer keys, the model's are 64"):
        sparse.check_pool(narrow, 3, 64)


def test_speculative_decoding_is_refused(monkeypatch):
    from atom_sglang import compat

    monkeypatch.setattr(compat, "unsupported_latent_attention", lambda: None)
    monkeypatch.setattr(compat, "speculative_algorithm", lambda: "EAGLE")
    with pytest.raises(UnsupportedConfigError, match=r"^p: speculative decoding \(EAGLE\) with sparse latent attention"):
        SGLangHost(tp=SingleRank()).attention("p", 0, 4, 1, 48, 0.1, mla=_spec())


def test_sliding_window_and_sinks_are_refused():
    host = SGLangHost(tp=SingleRank())
    with pytest.raises(UnsupportedConfigError, match=r"^p: sparse latent attention with a sliding window or sinks"):
        host.attention("p", 0, 4, 1, 48, 0.1, mla=_spec(), sliding_window=8)


@pytest.mark.sglang
@torch.inference_mode()
def test_a_shared_layer_before_any_indexer_is_an_error(cpu_runtime, tiny_checkpoints):
    model = load_with_sglang(checkpoint_or_skip("GlmMoeDsaForCausalLM", tiny_checkpoints))
    batch = SGLangCPUBatch(model, 1)
    batch.step({0: PROMPTS[0]})
    model.atom_host.sparse_selection = None  # as if layer 1 (shared) ran first in a step
    layer = model.atom_host.attention_layers[1]
    model.atom_host.forward_batch = batch.last_batch
    try:
        with pytest.raises(RuntimeError, match="shared sparse attention layer 1 runs before any layer with its own"):
            from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

            with forward_context(ForwardContext(attn_backend=batch.backend)):
                layer(torch.zeros(1, 4 * 48), torch.zeros(1, 64), torch.zeros(1, 16))
    finally:
        model.atom_host.forward_batch = None


@pytest.mark.sglang
@torch.inference_mode()
def test_cuda_graph_capture_is_refused(cpu_runtime, tiny_checkpoints, monkeypatch):
    model = load_with_sglang(checkpoint_or_skip(ARCHS[0], tiny_checkpoints))
    batch = SGLangCPUBatch(model, 1)
    monkeypatch.setattr(sparse, "capturing", lambda: True)
    with pytest.raises(
        UnsupportedConfigError,
        match=r"^sparse attention layer 0: .* CUDA graph; serve with "
        r"--disable-cuda-graph",
    ):
        batch.step({0: PROMPTS[0]})
    assert model.atom_host.forward_batch is None
