"""The forward path on the CPU: SGLang's own torch-native attention backend, its KV-cache pools and its
LogitsProcessor around each served ATOM model, prefill then greedy decode, against transformers.

This is as far as SGLang runs here: the scheduler, CUDA graphs and the GPU attention backends are not
exercised (no GPU).  The batch is laid out as SGLang's ModelRunner lays it out: a ReqToTokenPool row per
request mapping positions to KV slots, ``out_cache_loc`` for the new tokens, the backend's metadata
prepared before the forward and published in SGLang's forward context."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from _sglang_env import load_with_sglang
from torch import nn

from atom_core import catalog
from atom_core.loader import WeightMapper
from atom_core.models.base import CausalLM
from atom_sglang import compat

pytestmark = pytest.mark.sglang

# Prompts of different lengths in one batch; the longest passes Mistral's tiny sliding window (32).
PROMPTS = [[5, 17, 99, 3, 200, 41, 7], [11, 300], list(range(40, 90))]
NEW_TOKENS = 4
MAX_CONTEXT = 128
ATOL = 1e-4  # fp32 on CPU; measured differences are ~1e-6


class SGLangCPUBatch:
    """KV slots for a few requests and the ForwardBatches of their prefill and decode steps."""

    def __init__(self, model):
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

        radix = compat.radix_attention_class()
        layers = [m for m in model.modules() if isinstance(m, radix)]
        self.req_pool = ReqToTokenPool(size=len(PROMPTS), max_context_len=MAX_CONTEXT, device="cpu", enable_memory_saver=False)
        self.kv_pool = MHATokenToKVPool(
            size=len(PROMPTS) * MAX_CONTEXT + 1, page_size=1, dtype=torch.float32, head_num=layers[0].tp_k_head_num,
            head_dim=layers[0].head_dim, layer_num=len(layers), device="cpu", enable_memory_saver=False,
        )
        runner = SimpleNamespace(device="cpu", req_to_token_pool=self.req_pool, token_to_kv_pool=self.kv_pool)
        self.backend = TorchNativeAttnBackend(runner)
        for b in range(len(PROMPTS)):  # slot 0 is SGLang's padding slot
            self.req_pool.req_to_token[b] = torch.arange(MAX_CONTEXT) + 1 + b * MAX_CONTEXT
        self.lengths = [0] * len(PROMPTS)

    def step(self, model, new_tokens: list[list[int]]) -> torch.Tensor:
        """Run the model over each request's new tokens; the next-token logits of each request."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        starts = list(self.lengths)
        self.lengths = [s + len(t) for s, t in zip(starts, new_tokens)]
        decode = all(len(t) == 1 for t in new_tokens) and all(starts)
        ids = torch.tensor([t for toks in new_tokens for t in toks])
        positions = torch.tensor([p for s, toks in zip(starts, new_tokens) for p in range(s, s + len(toks))])
        slots = torch.cat([self.req_pool.req_to_token[b, s:e] for b, (s, e) in enumerate(zip(starts, self.lengths))])
        extend = {} if decode else dict(
            extend_prefix_lens=torch.tensor(starts), extend_seq_lens=torch.tensor([len(t) for t in new_tokens]),
            extend_prefix_lens_cpu=starts, extend_seq_lens_cpu=[len(t) for t in new_tokens],
        )
        batch = ForwardBatch(
            forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND, batch_size=len(new_tokens),
            input_ids=ids, req_pool_indices=torch.arange(len(new_tokens)), seq_lens=torch.tensor(self.lengths),
            out_cache_loc=slots, seq_lens_sum=sum(self.lengths), positions=positions,
            capture_hidden_mode=CaptureHiddenMode.NULL, **extend,
        )
        with forward_context(ForwardContext(attn_backend=self.backend)):
            self.backend.init_forward_metadata(batch)
            out = model.forward(ids, positions, batch)
        return out.next_token_logits


@torch.inference_mode()
def reference(path: str):
    """transformers' greedy continuation of each prompt and its logits at every generated position."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokens, logits = [], []
    for prompt in PROMPTS:
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
        tokens.append(out[0, len(prompt):].tolist())
        logits.append(hf(out[:, :-1]).logits[0, len(prompt) - 1:].float())
    return tokens, logits


@pytest.mark.parametrize("arch", sorted(catalog.ARCHITECTURES))
@torch.inference_mode()
def test_prefill_and_decode_match_transformers(arch, cpu_runtime, tiny_checkpoints):
    if arch not in tiny_checkpoints:
        pytest.skip(f"atom-sglang does not serve {arch} (see atom_sglang.capabilities)")
    path = tiny_checkpoints[arch]
    model = load_with_sglang(path)
    ref_tokens, ref_logits = reference(path)

    batch = SGLangCPUBatch(model)
    logits = batch.step(model, PROMPTS)
    generated: list[list[int]] = [[] for _ in PROMPTS]
    for step in range(NEW_TOKENS):
        for b in range(len(PROMPTS)):
            err = (logits[b] - ref_logits[b][step]).abs().max().item()
            assert err < ATOL, f"{arch}: request {b}, step {step}: max |logit - transformers| = {err:.3g}"
        next_tokens = logits.argmax(-1).tolist()
        for b, token in enumerate(next_tokens):
            generated[b].append(token)
        if step + 1 < NEW_TOKENS:
            logits = batch.step(model, [[t] for t in next_tokens])
    assert generated == ref_tokens
    assert model.atom_host.forward_batch is None, "the ForwardBatch must not outlive the forward"


class RecordingLM(CausalLM):
    """A stand-in ATOM model recording what the wrapper hands it."""

    weight_mapper = WeightMapper()

    def __init__(self, hf_config, host, prefix=""):
        super().__init__()
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
