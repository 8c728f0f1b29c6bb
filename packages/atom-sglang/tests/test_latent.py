"""Latent attention (DeepSeek-V3) through SGLang's MLA path on the CPU (atom_sglang.latent).

The catalog's tiny DeepSeek-V3 (q LoRA, YaRN, interleaved rope; kv_lora_rank 64, qk_rope_head_dim 16) is
compared with transformers by test_forward like every served architecture; here: SGLang's latent pool holds one
``kv_lora_rank + qk_rope_head_dim`` row per token and nothing per head, a plain q_proj with NeoX rope matches
transformers too (same tolerance, test_forward.ATOL), ``W_UK``/``W_UV`` are views of an unquantized
``kv_b_proj`` and the dequantized split of a quantized one, and what is not handled is refused in one line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from _sglang_batch import SGLangCPUBatch
from _sglang_env import load_with_sglang
from test_forward import PROMPTS, check_against_transformers
from torch import nn

from atom_core.errors import UnsupportedConfigError
from atom_core.host import LatentAttentionSpec, SingleRank
from atom_core.tiny import make_tiny
from atom_sglang import compat, latent
from atom_sglang.host import SGLangHost
from atom_sglang.latent import SGLangLatentAttention

ARCH = "DeepseekV3ForCausalLM"


@pytest.fixture(scope="module")
def plain_q_checkpoint(tmp_path_factory):
    """The tiny DeepSeek-V3 with a plain q_proj (q_lora_rank null), NeoX rope and no YaRN."""
    out = tmp_path_factory.mktemp("dsv3-plain-q") / "ckpt"
    return str(make_tiny(ARCH, out, seed=2, q_lora_rank=None, rope_interleave=False, n_group=1, topk_group=1,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))


@pytest.mark.sglang
@torch.inference_mode()
def test_latent_rows_in_sglangs_mla_pool(cpu_runtime, tiny_checkpoints):
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    model = load_with_sglang(tiny_checkpoints[ARCH])
    layers = model.atom_host.attention_layers
    assert len(layers) == 3 and all(isinstance(m, SGLangLatentAttention) for m in layers)
    radix = layers[0].attn
    assert (radix.tp_q_head_num, radix.tp_k_head_num, radix.qk_head_dim, radix.v_head_dim) == (4, 1, 64 + 16, 64)
    for m in layers:  # unquantized: views of kv_b_proj's weight, no copy
        weight = m._kv_b_proj[0].weight
        assert m.w_uk.shape == (4, 32, 64) and m.w_uv.shape == (4, 48, 64)
        assert m.w_uk.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
    batch = SGLangCPUBatch(model, 2)
    batch.step({0: PROMPTS[0], 1: PROMPTS[1]})
    assert isinstance(batch.kv_pool, MLATokenToKVPool)
    rows = batch.kv_pool.get_key_buffer(0)
    assert rows.shape[1:] == (1, 64 + 16)
    used = torch.cat([batch.req_pool.req_to_token[row, :n] for row, n in zip(batch.rows, batch.lengths)]).long()
    assert rows[used].abs().amax(-1).min() > 0 and not rows[0].any()  # SGLang's padding slot 0 untouched


@pytest.mark.sglang
@torch.inference_mode()
def test_plain_q_projection_matches_transformers(cpu_runtime, plain_q_checkpoint):
    model = load_with_sglang(plain_q_checkpoint)
    assert not hasattr(model.model.layers[0].self_attn, "q_a_proj")
    check_against_transformers(ARCH, plain_q_checkpoint, model)


@pytest.mark.sglang
@torch.inference_mode()
def test_backends_planning_their_own_mla_prefill_are_refused(cpu_runtime, tiny_checkpoints):
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    class FlashInferMLAAttnBackend(TorchNativeAttnBackend):
        """Stands for a backend that chooses the expanded form for prompts itself."""

    model = load_with_sglang(tiny_checkpoints[ARCH])
    batch = SGLangCPUBatch(model, 1)
    batch.backend = FlashInferMLAAttnBackend(batch.runner)
    with pytest.raises(UnsupportedConfigError, match=r"layer 0: SGLang's FlashInferMLAAttnBackend .* "
                                                     r"--attention-backend torch_native or triton$"):
        batch.step({0: PROMPTS[0]})
    assert model.atom_host.forward_batch is None


class _Int8Rows:
    """A stand-in quantization scheme: int8 weight, one scale per output row."""

    def apply(self, layer, x, bias=None):
        return x @ (layer.weight.float() * layer.weight_scale).t()

    def process_weights_after_loading(self, layer):
        pass


class _QuantizedProjection(nn.Module):
    def __init__(self, weight: torch.Tensor):
        super().__init__()
        scale = weight.abs().amax(1, keepdim=True) / 127
        self.weight = nn.Parameter(torch.round(weight / scale).to(torch.int8), requires_grad=False)
        self.weight_scale = nn.Parameter(scale, requires_grad=False)
        self.bias = None
        self.quant_method = _Int8Rows()

    def forward(self, x):
        return self.quant_method.apply(self, x)


@pytest.mark.sglang
def test_quantized_kv_b_proj_is_dequantized_once_and_released(cpu_runtime):
    heads, nope, v, rank = 2, 8, 6, 16
    proj = _QuantizedProjection(torch.randn(heads * (nope + v), rank))
    dense = proj.weight.float() * proj.weight_scale
    layer = SGLangLatentAttention(SGLangHost(tp=SingleRank()), "l.attn", 0, heads, 0.1,
                                  LatentAttentionSpec(rank, nope, 4, v, proj))
    layer.finish_loading()
    per_head = dense.view(heads, nope + v, rank)
    torch.testing.assert_close(layer.w_uk, per_head[:, :nope], rtol=0, atol=1e-6)
    torch.testing.assert_close(layer.w_uv, per_head[:, nope:], rtol=0, atol=1e-6)
    assert proj.weight.numel() == 0 and proj.weight_scale.numel() == 0  # only the split is kept
    kept = layer.w_uk
    layer.finish_loading()  # a later weight update without kv_b_proj keeps the split
    assert layer.w_uk is kept


def test_decode_context_parallelism_is_refused(monkeypatch):
    monkeypatch.setattr(compat, "parallel", lambda: SimpleNamespace(attn_dcp_size=2))
    host = SGLangHost(tp=SingleRank())
    spec = LatentAttentionSpec(64, 32, 16, 48, nn.Linear(64, 4 * 80))
    with pytest.raises(UnsupportedConfigError, match=r"^model.layers.0.self_attn.attn: decode context parallelism "
                                                     r"\(--dcp-size 2\)"):
        host.attention("model.layers.0.self_attn.attn", 0, 4, 1, 48, 0.1, mla=spec)
    assert compat.unsupported_latent_attention().startswith("decode context parallelism")
    with pytest.raises(UnsupportedConfigError, match="sliding window or sinks"):
        latent.latent_attention(host, "p", 0, 4, 0.1, spec, sliding_window=8)
