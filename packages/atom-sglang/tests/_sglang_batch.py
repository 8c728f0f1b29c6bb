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
* sparse latent attention (DeepSeek-V3.2, GLM-5): SGLang's ``DSATokenToKVPool`` (the latent rows and an FP8
  indexer-key page buffer per layer with an indexer), pages of :data:`DSA_PAGE_SIZE` tokens, as its ModelRunner
  builds for an architecture its ModelConfig lists as DSA;
* MRoPE models: ``forward_batch.mrope_positions`` filled by SGLang's own ``_compute_mrope_positions`` from
  each request's ``MultimodalInputs`` (text-only requests: none).

Requests get rows 1.. of the pools (row 0 is SGLang's padding row) and mamba slots in reverse order, so a
mix-up of request rows and state slots shows.  KV pages are interleaved across requests (request b's k-th page of
``page_size`` slots is page ``1 + k * num_requests + b``; page 0 is SGLang's padding page), so a request's
context is never one contiguous run of slots.

The attention backend is SGLang's torch-native one, or ``backend="atom"``: ATOM's, built through SGLang's
attention-backend registry as its ModelRunner builds it (the plugin registers it).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from atom_sglang import compat, contract
from atom_sglang.compat import ByRelease
from atom_sglang.latent import SGLangLatentAttention
from atom_sglang.sparse import SGLangSparseLatentAttention

MAX_CONTEXT = 192
DSA_PAGE_SIZE = 64  # SGLang's DSA pool asserts 64-token pages on CUDA and CPU

# Where SGLang keeps the multimodal embedding cache's initialiser (_sglang_env.HARNESS has both).
MM_EMBEDDING_CACHE: ByRelease = ByRelease("the multimodal embedding cache", {
    "<0.5.18": "sglang.srt.managers.mm_utils:init_mm_embedding_cache",
    ">=0.5.18": "sglang.srt.managers.mm_schedule:init_mm_embedding_cache",
})


def _linear_attn_backends():
    from sglang.srt.layers.attention.linear.utils import resolve_linear_attn_backends

    return resolve_linear_attn_backends()


# The kernel choice SGLang's ModelRunner hands its GDN backend (0.5.18+; before, the backend read it itself).
LINEAR_ATTN_BACKENDS: ByRelease = ByRelease("the ModelRunner's linear-attention kernel choice", {
    "<0.5.18": lambda: None,
    ">=0.5.18": _linear_attn_backends,
})


class SGLangCPUBatch:
    def __init__(self, model, num_requests: int, dtype: torch.dtype = torch.float32, *, backend: str = "torch_native",
                 page_size: int | None = None, latent: tuple[int, int] | None = None):
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

        host = getattr(model, "atom_host", None)  # None: one of SGLang's own classes
        sparse = [m for m in host.attention_layers if isinstance(m, SGLangSparseLatentAttention)] if host else []
        page_size = page_size or (DSA_PAGE_SIZE if sparse else 1)
        assert MAX_CONTEXT % page_size == 0
        self.model = model
        self.num_requests = num_requests
        self.page_size = page_size
        self.rows = list(range(1, num_requests + 1))
        radix = compat.radix_attention_class()
        layers = [m for m in model.modules() if isinstance(m, radix)]
        kv = dict(size=num_requests * MAX_CONTEXT, page_size=page_size, dtype=dtype, head_num=layers[0].tp_k_head_num,
                  head_dim=layers[0].head_dim, device="cpu", enable_memory_saver=False)
        self.hybrid = bool(host and host.linear_attention_states)
        if host is not None:
            latent = [(m.kv_lora_rank, m.rope_dim) for m in host.attention_layers if isinstance(m, SGLangLatentAttention)]
        else:  # one of SGLang's own classes: (kv_lora_rank, qk_rope_head_dim) of its latent attention, if it has one
            latent = [latent] if latent is not None else []
        if self.hybrid:
            self._hybrid_pools(model, kv, [m.layer_id for m in layers])
        elif sparse:  # what SGLang's ModelRunner builds for a DSA architecture: latent rows + FP8 indexer keys
            from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, ReqToTokenPool

            self.req_pool = ReqToTokenPool(size=num_requests, max_context_len=MAX_CONTEXT, device="cpu",
                                           enable_memory_saver=False)
            row = sparse[0].kv_lora_rank + sparse[0].rope_dim
            self.kv_pool = DSATokenToKVPool(
                size=kv["size"], page_size=page_size, kv_lora_rank=sparse[0].kv_lora_rank, dtype=dtype,
                qk_rope_head_dim=sparse[0].rope_dim, layer_num=len(layers), device="cpu",
                index_head_dim=sparse[0].sparse.index_head_dim, enable_memory_saver=False, kv_cache_dim=row,
            )
        elif latent:  # what SGLang's ModelRunner builds for an MLA architecture: one latent row per token
            from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool, ReqToTokenPool

            self.req_pool = ReqToTokenPool(size=num_requests, max_context_len=MAX_CONTEXT, device="cpu",
                                           enable_memory_saver=False)
            self.kv_pool = MLATokenToKVPool(
                size=kv["size"], page_size=page_size, dtype=dtype, kv_lora_rank=latent[0][0],
                qk_rope_head_dim=latent[0][1], layer_num=len(layers), device="cpu", enable_memory_saver=False,
            )
        else:
            from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

            self.req_pool = ReqToTokenPool(size=num_requests, max_context_len=MAX_CONTEXT, device="cpu",
                                           enable_memory_saver=False)
            self.kv_pool = MHATokenToKVPool(layer_num=len(layers), **kv)
        self.runner = SimpleNamespace(device="cpu", req_to_token_pool=self.req_pool, token_to_kv_pool=self.kv_pool,
                                      page_size=page_size, use_mla_backend=bool(latent), kv_index_translator=None)
        if backend == "torch_native":
            self.backend = TorchNativeAttnBackend(self.runner)
        else:  # as SGLang's ModelRunner builds the backend --attention-backend names
            from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

            self.backend = ATTENTION_BACKENDS[backend](self.runner)
        if self.hybrid:
            self.backend = self._hybrid_backend(model, [m.layer_id for m in layers])
        pos = torch.arange(MAX_CONTEXT, dtype=torch.int32)
        for b, row in enumerate(self.rows):  # page 0 is SGLang's padding page
            self.req_pool.req_to_token[row] = (1 + pos // page_size * num_requests + b) * page_size + pos % page_size
        self.lengths = [0] * num_requests
        self.graph_sizes: set[int] = set()  # decode graph sizes "captured" (graph_bs)
        self.mm_inputs: list = [None] * num_requests
        if hasattr(model, "get_image_feature"):  # the multimodal embedding cache SGLang's KV-cache builder sets up
            contract.Symbol(MM_EMBEDDING_CACHE.get()).resolve()(64 * 1024 * 1024)

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
        from sglang.srt.runtime_context import get_server_args

        runner = SimpleNamespace(**vars(self.runner), server_args=get_server_args(), is_draft_worker=False,
                                 linear_attn_backends=LINEAR_ATTN_BACKENDS.get()(), model_config=None)
        return HybridLinearAttnBackend(self.backend, GDNAttnBackend(runner), full_layers)

    def step(self, new_tokens: dict[int, list[int]], *, graph_bs: int | None = None, run=None,
             spec_hidden: torch.Tensor | None = None, capture: bool = False) -> torch.Tensor:
        """Run the model over the new tokens of some requests (``{request: tokens}``, in request order);
        the next-token logits of each of them, in that order.

        ``graph_bs`` (decode steps): the batch as SGLang's decode CUDA-graph runner lays it out for a graph of that
        many requests (padding requests on row 0 with the backend's fill length, writing to the padding slot), its
        metadata prepared by the backend's capture / replay hook (the first such step captures) instead of the
        eager one.  No graph is captured on the CPU: this checks the hooks' static buffers, not CUDA.

        ``run(model, ids, positions, batch)``: how the step calls the model (default: its forward, as the ModelRunner
        does eagerly).

        ``spec_hidden``: a draft model's step: the hidden states SGLang's EAGLE worker hands the draft (one row per new
        token, in ``forward_batch.spec_info.hidden_states``); every token's hidden states are captured
        (``CaptureHiddenMode.FULL``, also with ``capture``).  The LogitsProcessorOutput is kept in :attr:`last_output`."""
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
        if graph_bs is not None:
            assert decode and graph_bs >= len(reqs)
            pad = graph_bs - len(reqs)
            ids = torch.cat([ids, torch.zeros(pad, dtype=ids.dtype)])
            positions = torch.cat([positions, torch.zeros(pad, dtype=positions.dtype)])
            rows, ends = rows + [0] * pad, ends + [self.backend.get_cuda_graph_seq_len_fill_value()] * pad
            slots = torch.cat([slots, torch.zeros(pad, dtype=slots.dtype)])
        extend = {} if decode else dict(
            extend_num_tokens=sum(lens), extend_prefix_lens=torch.tensor(starts), extend_seq_lens=torch.tensor(lens),
            extend_start_loc=torch.tensor([sum(lens[:i]) for i in range(len(lens))], dtype=torch.int32),
            extend_prefix_lens_cpu=starts, extend_seq_lens_cpu=lens,
        )
        mm_inputs = [self.mm_inputs[r] for r in reqs]
        batch = ForwardBatch(
            forward_mode=ForwardMode.DECODE if decode else ForwardMode.EXTEND, batch_size=len(rows),
            input_ids=ids, req_pool_indices=torch.tensor(rows), seq_lens=torch.tensor(ends), seq_lens_cpu=torch.tensor(ends),
            out_cache_loc=slots, seq_lens_sum=sum(ends), positions=positions,
            capture_hidden_mode=CaptureHiddenMode.FULL if capture or spec_hidden is not None else CaptureHiddenMode.NULL,
            # the EAGLE draft input's fields the drafts read (0.5.17's own DeepSeek NextN also its DSA top-k seed)
            spec_info=None if spec_hidden is None else SimpleNamespace(hidden_states=spec_hidden,
                                                                       dsa_seed_topk_capture=None),
            mm_inputs=None if decode or not any(mm_inputs) else mm_inputs, **extend,
        )
        if getattr(self.model, "uses_mrope", False):  # SGLang's own computation, from each request's MultimodalInputs
            schedule = SimpleNamespace(multimodal_inputs=mm_inputs, extend_lens=lens, prefix_lens=starts,
                                       reqs=[SimpleNamespace(session=None) for _ in reqs])
            batch._compute_mrope_positions(SimpleNamespace(device="cpu"), schedule)
        with forward_context(ForwardContext(attn_backend=self.backend)):
            if graph_bs is None:
                self.backend.init_forward_metadata(batch)
            else:
                if not self.graph_sizes:
                    self.backend.init_cuda_graph_state(max(self.num_requests, graph_bs), graph_bs)
                self.backend.init_forward_metadata_out_graph(batch, in_capture=graph_bs not in self.graph_sizes)
                self.graph_sizes.add(graph_bs)
            out = self.model.forward(ids, positions, batch) if run is None else run(self.model, ids, positions, batch)
        self.last_batch = batch
        self.last_output = out
        return out.next_token_logits[: len(reqs)]
