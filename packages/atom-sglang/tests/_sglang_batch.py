"""SGLang's forward path on the CPU, laid out as its ModelRunner lays it out.

:class:`SGLangCPUBatch` holds the KV slots (and, for hybrid models, the mamba state slots) of a few
requests and runs the model over ForwardBatches of their extend and decode steps:

* every model: a ``ReqToTokenPool`` row per request mapping positions to KV slots, ``out_cache_loc`` for the
  new tokens, SGLang's torch-native attention backend with its metadata prepared before the forward and
  published in SGLang's forward context, SGLang's ``LogitsProcessor``;
* hybrid linear attention (the model's host holds linear-attention states): what SGLang's ModelRunner builds
  when its config is hybrid GDN — a ``HybridReqToTokenPool`` whose mamba pool is sized by the config's
  ``mamba2_cache_params``, a ``HybridLinearKVPool`` for the full-attention layers and a
  ``HybridLinearAttnBackend`` (torch-native full attention + SGLang's ``GDNAttnBackend``, whose metadata the
  ATOM layers read);
* latent-attention models (DeepSeek-V3): SGLang's ``MLATokenToKVPool`` (one ``kv_lora_rank + qk_rope_head_dim``
  row per token), as its ModelRunner builds for an architecture its ModelConfig lists as MLA;
* MRoPE models: ``forward_batch.mrope_positions`` filled by SGLang's own ``_compute_mrope_positions`` from
  each request's ``MultimodalInputs`` (text-only requests: none).

Requests get rows 1.. of the pools (row 0 is SGLang's padding row) and mamba slots in reverse order, so a
mix-up of request rows and state slots shows.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from atom_sglang import compat
from atom_sglang.latent import SGLangLatentAttention

MAX_CONTEXT = 160


class SGLangCPUBatch:
    def __init__(self, model, num_requests: int, dtype: torch.dtype = torch.float32):
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

        self.model = model
        self.num_requests = num_requests
        self.rows = list(range(1, num_requests + 1))
        radix = compat.radix_attention_class()
        layers = [m for m in model.modules() if isinstance(m, radix)]
        kv = dict(size=num_requests * MAX_CONTEXT + 1, page_size=1, dtype=dtype, head_num=layers[0].tp_k_head_num,
                  head_dim=layers[0].head_dim, device="cpu", enable_memory_saver=False)
        self.hybrid = bool(model.atom_host.linear_attention_states)
        latent = [m for m in model.atom_host.attention_layers if isinstance(m, SGLangLatentAttention)]
        if self.hybrid:
            self._hybrid_pools(model, kv, [m.layer_id for m in layers])
        elif latent:  # what SGLang's ModelRunner builds for an MLA architecture: one latent row per token
            from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool, ReqToTokenPool

            self.req_pool = ReqToTokenPool(size=num_requests, max_context_len=MAX_CONTEXT, device="cpu",
                                           enable_memory_saver=False)
            self.kv_pool = MLATokenToKVPool(
                size=kv["size"], page_size=1, dtype=dtype, kv_lora_rank=latent[0].kv_lora_rank,
                qk_rope_head_dim=latent[0].rope_dim, layer_num=len(layers), device="cpu", enable_memory_saver=False,
            )
        else:
            from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

            self.req_pool = ReqToTokenPool(size=num_requests, max_context_len=MAX_CONTEXT, device="cpu",
                                           enable_memory_saver=False)
            self.kv_pool = MHATokenToKVPool(layer_num=len(layers), **kv)
        self.runner = SimpleNamespace(device="cpu", req_to_token_pool=self.req_pool, token_to_kv_pool=self.kv_pool)
        self.backend = TorchNativeAttnBackend(self.runner)
        if self.hybrid:
            self.backend = self._hybrid_backend(model, [m.layer_id for m in layers])
        for b, row in enumerate(self.rows):  # KV slot 0 is SGLang's padding slot
            self.req_pool.req_to_token[row] = torch.arange(MAX_CONTEXT, dtype=torch.int32) + 1 + b * MAX_CONTEXT
        self.lengths = [0] * num_requests
        self.mm_inputs: list = [None] * num_requests
        if hasattr(model, "get_image_feature"):  # the multimodal embedding cache SGLang's KV-cache builder sets up
            from sglang.srt.managers.mm_schedule import init_mm_embedding_cache

            init_mm_embedding_cache(64 * 1024 * 1024)

    def _hybrid_pools(self, model, kv: dict, full_layers: list[int]) -> None:
        from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool

        params = model.config.get_text_config().mamba2_cache_params
        n = self.num_requests
        self.req_pool = HybridReqToTokenPool(
            size=n, mamba_size=n, mamba_spec_state_size=n, max_context_len=MAX_CONTEXT, device="cpu",
            enable_memory_saver=False, cache_params=params, mamba_layer_ids=params.layers,
            enable_mamba_extra_buffer=False,
        )
        self.kv_pool = HybridLinearKVPool(full_attention_layer_ids=full_layers, mamba_pool=self.req_pool.mamba_pool, **kv)
        # request row r -> mamba slot n + 1 - r (slot 0 is the padding slot)
        self.mamba_slots = [n + 1 - row for row in self.rows]
        self.req_pool.req_index_to_mamba_index_mapping[self.rows] = torch.tensor(self.mamba_slots, dtype=torch.int32)

    def _hybrid_backend(self, model, full_layers: list[int]):
        from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend
        from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
        from sglang.srt.layers.attention.linear.utils import resolve_linear_attn_backends
        from sglang.srt.runtime_context import get_server_args

        runner = SimpleNamespace(**vars(self.runner), server_args=get_server_args(), is_draft_worker=False,
                                 linear_attn_backends=resolve_linear_attn_backends(), model_config=None)
        return HybridLinearAttnBackend(self.backend, GDNAttnBackend(runner), full_layers)

    def step(self, new_tokens: dict[int, list[int]]) -> torch.Tensor:
        """Run the model over the new tokens of some requests (``{request: tokens}``, in request order);
        the next-token logits of each of them, in that order."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        reqs = sorted(new_tokens)
        toks = [new_tokens[r] for r in reqs]
        starts = [self.lengths[r] for r in reqs]
        ends = [s + len(t) for s, t in zip(starts, toks)]
        for r, e in zip(reqs, ends):
            self.lengths[r] = e
        decode = all(len(t) == 1 for t in toks) and all(starts)
        ids = torch.tensor([t for ts in toks for t in ts])
        positions = torch.tensor([p for s, ts in zip(starts, toks) for p in range(s, s + len(ts))])
        rows = [self.rows[r] for r in reqs]
        slots = torch.cat([self.req_pool.req_to_token[row, s:e] for row, s, e in zip(rows, starts, ends)]).long()
        lens = [len(t) for t in toks]
        extend = {} if decode else dict(
            extend_num_tokens=sum(lens), extend_prefix_lens=torch.tensor(starts), extend_seq_lens=torch.tensor(lens),
            extend_start_loc=torch.tensor([sum(lens[:i]) for i in range(len(lens))], dtype=torch.int32),
            extend_prefix_lens_cpu=starts, extend_seq_lens_cpu=lens,
        )
        mm_inputs = [self.mm_inputs[r] for r in reqs]
        batch = ForwardBatch(
            forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND, batch_size=len(reqs),
            input_ids=ids, req_pool_indices=torch.tensor(rows), seq_lens=torch.tensor(ends), seq_lens_cpu=torch.tensor(ends),
            out_cache_loc=slots, seq_lens_sum=sum(ends), positions=positions,
            capture_hidden_mode=CaptureHiddenMode.NULL,
            mm_inputs=None if decode or not any(mm_inputs) else mm_inputs, **extend,
        )
        if self.model.uses_mrope:  # SGLang's own computation, from each request's MultimodalInputs
            schedule = SimpleNamespace(multimodal_inputs=mm_inputs, extend_lens=lens, prefix_lens=starts,
                                       reqs=[SimpleNamespace(session=None) for _ in reqs])
            batch._compute_mrope_positions(SimpleNamespace(device="cpu"), schedule)
        with forward_context(ForwardContext(attn_backend=self.backend)):
            self.backend.init_forward_metadata(batch)
            out = self.model.forward(ids, positions, batch)
        self.last_batch = batch
        return out.next_token_logits
