"""The forward path on the CPU: SGLang's own torch-native attention backend, its KV-cache pools and its
LogitsProcessor around each served ATOM model (gpt-oss, whose attention sinks that backend does not apply: the
host's one-line refusal) — for hybrid models also its mamba state pool and its hybrid
linear-attention backend, for MRoPE models its own MRoPE positions — chunked prefill then greedy decode,
against transformers.

The batches are laid out as SGLang's ModelRunner lays them out (_sglang_batch); SGLang's scheduler and
ModelRunner themselves drive ATOM's class in test_engine.  CUDA graphs and the GPU attention backends are not
exercised (no GPU)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from _sglang_batch import SGLangCPUBatch
from _sglang_env import load_with_sglang
from conftest import checkpoint_or_skip, reference_unfaithful
from torch import nn

from atom_core import catalog
from atom_core.errors import UnsupportedConfigError
from atom_core.loader import WeightMapper
from atom_core.models.base import CausalLM

pytestmark = pytest.mark.sglang

# Prompts of different lengths in one batch; the longest passes Mistral's tiny sliding window (32) and is
# prefilled in two chunks (the second continues from the first's KV cache, and linear-attention state).
PROMPTS = [[5, 17, 99, 3, 200, 41, 7], [11, 300], list(range(40, 90))]
FIRST_CHUNK = 30
NEW_TOKENS = 4
ATOL = 1e-4  # fp32 on CPU; measured differences are ~1e-6
# Architectures with attention sinks: SGLang applies them in its triton / fa3 backends (GPU), not torch-native.
NEEDS_SINKS = {"GptOssForCausalLM"}


def fp8_indexer_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' DSA indexer caching its keys as SGLang's DSA pool stores them: FP8 e4m3 with a power-of-two
    scale per 128 elements (atom_sglang.sparse.quantize_index_keys, checked against SGLang's own quantizer in
    test_sparse)."""
    from transformers.cache_utils import Cache

    from atom_sglang.sparse import quantize_index_keys

    update = Cache.update_indexer

    def quantized(self, keys, layer_idx):
        fp8, scale = quantize_index_keys(keys.reshape(-1, keys.shape[-1]))
        blocks = fp8.float().view(*scale.shape, -1) * scale[..., None]
        return update(self, blocks.view(keys.shape).to(keys.dtype), layer_idx)

    monkeypatch.setattr(Cache, "update_indexer", quantized)


@torch.inference_mode()
def reference(arch: str, path: str):
    """transformers' greedy continuation of each prompt and its logits at every generated position (a DSA model's
    indexer keys FP8 as in SGLang's pool: :func:`fp8_indexer_keys`)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        if catalog.SPARSE_ATTENTION in catalog.get(arch).capabilities:
            fp8_indexer_keys(monkeypatch)
        return _reference(arch, path)


def _reference(arch: str, path: str):
    hf = catalog.get(arch).hf_model_class().from_pretrained(path, dtype=torch.float32).eval()
    tokens, logits = [], []
    for prompt in PROMPTS:
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
        tokens.append(out[0, len(prompt):].tolist())
        logits.append(hf(input_ids=out[:, :-1]).logits[0, len(prompt) - 1:].float())
    return tokens, logits


@pytest.mark.parametrize("arch", sorted(catalog.ARCHITECTURES))
@torch.inference_mode()
def test_prefill_and_decode_match_transformers(arch, cpu_runtime, tiny_checkpoints):
    path = checkpoint_or_skip(arch, tiny_checkpoints)
    model = load_with_sglang(path)
    if why := reference_unfaithful(arch, path):
        pytest.skip(why)
    if arch in NEEDS_SINKS:  # the torch-native backend applies no attention sinks: the host refuses, one line
        with pytest.raises(UnsupportedConfigError, match=r"attention sinks .* TorchNativeAttnBackend does not apply"):
            SGLangCPUBatch(model, len(PROMPTS)).step({0: PROMPTS[0]})
        return
    batch = check_against_transformers(arch, path, model)
    if batch.hybrid:  # each request's state lives in its own slot; SGLang's padding slot 0 is untouched
        for state in model.atom_host.linear_attention_states:
            ssm = batch.req_pool.mamba2_layer_cache(state.layer_id).temporal
            assert not ssm[0].any() and all(ssm[slot].any() for slot in batch.mamba_slots)


def check_against_transformers(arch: str, path: str, model, prefill_run=None, **batch_options) -> SGLangCPUBatch:
    """Chunked prefill of :data:`PROMPTS`, then greedy decode, through SGLang's CPU forward path: next-token
    logits within :data:`ATOL` of transformers at every step and the same tokens.  The batch is returned.
    ``prefill_run``: how the prefill steps call the model (SGLangCPUBatch.step's ``run``); ``batch_options``:
    :class:`SGLangCPUBatch`'s (attention backend, page size)."""
    ref_tokens, ref_logits = reference(arch, path)
    batch = SGLangCPUBatch(model, len(PROMPTS), **batch_options)
    first = batch.step({0: PROMPTS[0], 1: PROMPTS[1], 2: PROMPTS[2][:FIRST_CHUNK]}, run=prefill_run)
    rest = batch.step({2: PROMPTS[2][FIRST_CHUNK:]}, run=prefill_run)  # extend_prefix_lens > 0
    logits = torch.stack([first[0], first[1], rest[0]])
    generated: list[list[int]] = [[] for _ in PROMPTS]
    for step in range(NEW_TOKENS):
        for b in range(len(PROMPTS)):
            err = (logits[b] - ref_logits[b][step]).abs().max().item()
            assert err < ATOL, f"{arch}: request {b}, step {step}: max |logit - transformers| = {err:.3g}"
        next_tokens = logits.argmax(-1).tolist()
        for b, token in enumerate(next_tokens):
            generated[b].append(token)
        if step + 1 < NEW_TOKENS:
            logits = batch.step({b: [t] for b, t in enumerate(next_tokens)})
    assert generated == ref_tokens
    assert model.atom_host.forward_batch is None, "the ForwardBatch must not outlive the forward"
    return batch


@contextlib.contextmanager
def unified_op_on_cpu():
    """SGLang 0.5.17's unified attention op (RadixAttention's call under its piecewise forward context: the backend
    gets the layer SGLang's layer setup found for the layer id) is registered for CUDA only: on the CPU its Python
    body stands in for it.  0.5.23's RadixAttention calls the backend with itself there, and has no such op."""
    from sglang.srt.layers import radix_attention

    impl = getattr(radix_attention, "_unified_attention_with_output_impl", None)
    if impl is None:
        yield
        return

    def op(query, key, value, output, save_kv_cache, layer_id, *, use_mha_companion=False, **kwargs):
        return impl(query, key, value, output, save_kv_cache, layer_id, use_mha_companion, False, **kwargs)

    original = radix_attention.unified_attention_with_output
    radix_attention.unified_attention_with_output = op
    try:
        yield
    finally:
        radix_attention.unified_attention_with_output = original


def prefill_graph_runner(model, ids, positions, batch):
    """SGLang's prefill CUDA-graph runner (breakable / full backends, on by default on CUDA) on one prefill step: the
    body it resolves, called alone inside SGLang's piecewise forward context (the capture: its hidden states stand for
    the graph's output; RadixAttention then calls the backend through SGLang's unified attention op with the layer
    SGLang's layer setup found for that layer id), then the wrapper's forward with that output in place of the body's
    forward (the replay, the logits tail eager around it)."""
    from sglang.srt.model_executor.model_runner_components.layer_setup import compute_attention_and_moe_layers
    from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import _resolve_transformer_layer_model
    from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph.context_manager import (
        set_tc_piecewise_forward_context,
    )

    body = _resolve_transformer_layer_model(model)
    layers = compute_attention_and_moe_layers(body)
    with set_tc_piecewise_forward_context(batch, layers.attention_layers, None, layers.moe_layers, layers.moe_fusions,
                                          dsa_indexers=layers.dsa_indexers,
                                          mha_companion_layers=layers.mha_companion_layers), unified_op_on_cpu():
        captured = body.forward(ids, positions, batch, batch.input_embeds)
    replays = []
    original = body.forward
    body.forward = lambda *args, **kwargs: replays.append(args) or captured
    try:
        out = model.forward(ids, positions, batch)
    finally:
        body.forward = original
    assert len(replays) == 1, "the wrapper's forward must reach the body through its forward attribute"
    return out


@pytest.mark.parametrize("arch", ["Qwen3ForCausalLM", "Qwen3NextForCausalLM", "DeepseekV3ForCausalLM"])
@torch.inference_mode()
def test_prefill_graph_runner_calls_the_body(arch, cpu_runtime, tiny_checkpoints):
    """Prefill as SGLang's prefill CUDA graphs run it (the body called by SGLang with its batch, then replayed inside
    the wrapper's forward), decode as before: transformers' logits and tokens."""
    model = load_with_sglang(checkpoint_or_skip(arch, tiny_checkpoints))
    check_against_transformers(arch, checkpoint_or_skip(arch, tiny_checkpoints), model, prefill_run=prefill_graph_runner)


@torch.inference_mode()
def test_gdn_layers_warm_up_once_on_sglangs_pools(cpu_runtime, tiny_checkpoints, monkeypatch):
    """SGLang runs no step without tokens: on its first step each GDN layer is handed an empty one over SGLang's own
    pools (the layer compiles its kernels then; its torch references on the CPU need none), never again."""
    from atom_core.layers.gdn import GatedDeltaNet

    arch = "Qwen3NextForCausalLM"
    model = load_with_sglang(checkpoint_or_skip(arch, tiny_checkpoints))
    warmed = []
    monkeypatch.setattr(GatedDeltaNet, "_warm_up", lambda self, qkv, ba, step: warmed.append((qkv.shape[0], step)))
    batch = SGLangCPUBatch(model, 2)
    batch.step({0: PROMPTS[0], 1: PROMPTS[1]})
    states = model.atom_host.linear_attention_states
    assert [rows for rows, _ in warmed] == [0] * len(states)
    for state, (_, step) in zip(states, warmed):
        cache = batch.req_pool.mamba2_layer_cache(state.layer_id)
        for pool, sglangs in ((step.conv_state, cache.conv[0]), (step.ssm_state, cache.temporal)):
            assert (pool.data_ptr(), pool.shape, pool.stride()) == (sglangs.data_ptr(), sglangs.shape, sglangs.stride())
        assert step.ssm_layout == "v_major"
    batch.step({0: [3], 1: [4]})
    assert len(warmed) == len(states)


class RecordingLM(CausalLM):
    """A stand-in ATOM model recording what the wrapper hands it."""

    weight_mapper = WeightMapper()

    def __init__(self, hf_config, host, prefix=""):
        nn.Module.__init__(self)  # a stand-in: none of CausalLM's config checks
        self.config = hf_config
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(hf_config.vocab_size, hf_config.hidden_size)
        self.lm_head = nn.Linear(hf_config.hidden_size, hf_config.vocab_size, bias=False)
        self.seen: list = []

    def forward(self, input_ids, positions, inputs_embeds=None):
        self.seen.append((positions, self.atom_host.forward_batch, inputs_embeds))
        return torch.zeros(positions.shape[-1], self.config.hidden_size)


class PassThroughLogits(nn.Module):
    def forward(self, input_ids, hidden, lm_head, batch):
        return hidden, lm_head


@pytest.mark.parametrize("mrope", [True, False])
def test_wrapper_hands_over_positions_and_publishes_the_batch(mrope, cpu_runtime):
    from transformers import Qwen2Config

    from atom_sglang.wrapper import wrapper_class

    rope = {"rope_type": "default", "rope_theta": 10000.0, **({"mrope_section": [2, 1, 1]} if mrope else {})}
    config = Qwen2Config(vocab_size=16, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, rope_parameters=rope)
    spec = catalog.ArchSpec("RecordingForCausalLM", f"{__name__}:RecordingLM", "test", "transformers:Qwen2ForCausalLM", "qwen2")
    model = wrapper_class(spec, __name__)(config=config)
    assert model.uses_mrope is mrope
    model.logits_processor = PassThroughLogits()

    ids, positions = torch.tensor([3, 4, 5]), torch.tensor([0, 1, 2])
    batch = SimpleNamespace(mrope_positions=torch.arange(9).view(3, 3))
    embeds = torch.ones(3, 8, dtype=torch.bfloat16)  # SGLang hands over bf16
    hidden, head = model.forward(ids, positions, batch, input_embeds=embeds)
    (seen_positions, seen_batch, seen_embeds), = model.seen
    assert torch.equal(seen_positions, batch.mrope_positions if mrope else positions)
    assert seen_batch is batch and model.atom_host.forward_batch is None
    assert seen_embeds.dtype == model.model.embed_tokens.weight.dtype
    assert head is model.lm_head and hidden.shape == (3, 8)

    text_only = SimpleNamespace(mrope_positions=None)  # SGLang serving the checkpoint text-only
    model.forward(ids, positions, text_only)
    assert torch.equal(model.seen[-1][0], positions)
    with pytest.raises(ValueError, match="pipeline parallelism"):
        model.forward(ids, positions, batch, pp_proxy_tensors=object())
