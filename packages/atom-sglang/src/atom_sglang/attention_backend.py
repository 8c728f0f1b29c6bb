"""ATOM's paged attention as an SGLang attention backend: ``--attention-backend atom`` (opt in; the default is
SGLang's own choice, unchanged).

The plugin (:mod:`atom_sglang.plugin`) registers :func:`create_backend` in SGLang's attention-backend registry and
adds ``atom`` to the ``--attention-backend`` choices (SGLang's extension point for out-of-tree backends, read when
the arguments are parsed, after the plugins have loaded).

SGLang's KV pool onto ATOM's block-table contract (``atom_kernels.paged_attention``), without copying the cache:

* the pool keeps one K and one V buffer per layer, ``[slots, kv_heads, head_dim]`` with ``slots = size +
  page_size`` (NHD; slot 0 .. page_size - 1 is its padding page).  Viewed as ``[slots // page_size, page_size,
  kv_heads, head_dim]`` it is ATOM's cache with ``block_size = page_size``: slot ``s`` is block ``s // page_size``,
  offset ``s % page_size`` (page_size 1: every slot is a block);
* ``req_to_token_pool.req_to_token[req, pos]`` gives the slot of a request's token; SGLang's paged allocator keeps
  a page's tokens in one page, so the block table is ``req_to_token[req_pool_indices, ::page_size] // page_size``;
* ``seq_lens`` (prefix + new tokens) and ``query_start_loc`` (cumulative ``extend_seq_lens``; one token per request
  when decoding) are the rest: a step's queries are the last tokens of each context, as ATOM's op wants;
* this step's K/V go into the same buffers with ``atom_kernels.reshape_and_cache`` at ``forward_batch.out_cache_loc``
  (slot = block * page_size + offset: the same numbers).

Decode steps replay from SGLang's CUDA graphs: :meth:`AtomAttnBackend.init_cuda_graph_state` allocates a block
table as wide as the request pool's rows, ``seq_lens`` and ``query_start_loc`` once; capture and replay refill them
in place (:meth:`AtomAttnBackend.init_forward_metadata_out_graph`) and the kernel reads lengths on the device only.

What it does not do is refused when SGLang builds it (:func:`unsupported_runner`: latent attention (MLA),
encoder-decoder models, speculative decoding, diffusion LMs, decode context parallelism, SGLang's hybrid SWA and
unified pools, quantized or non-NHD KV layouts, fp8 e5m2) or when a layer first runs
(:func:`unsupported_layer`: cross / encoder attention, different K and V head dims, other logit-capping methods,
extra attention inputs), one line naming the cause.  Sliding windows, gpt-oss sinks, logit soft-capping (tanh),
GQA and an fp8 e4m3 KV cache are ATOM's op's own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from atom_core.errors import UnsupportedConfigError
from atom_kernels import paged_attention, reshape_and_cache
from atom_kernels.ops.paged_attention import warm_up
from atom_sglang import compat

logger = logging.getLogger(__name__)

NAME = "atom"
# ForwardMode names the backend runs (IDLE: SGLang's base class answers it; MIXED: extend + decode requests in one
# extend batch, the same metadata).
EXTEND_MODES = ("EXTEND", "MIXED")
DECODE_MODES = ("DECODE", "IDLE")
# RadixAttention.forward keyword arguments the backend understands (anything else is another backend's input).
KNOWN_KWARGS = ("sinks",)


@dataclass
class Metadata:
    """One step's view of SGLang's pools in ATOM's terms (every tensor int32, on the pool's device)."""

    block_table: torch.Tensor  # [B, max_blocks]
    seq_lens: torch.Tensor  # [B] context lengths, new tokens included
    query_start_loc: torch.Tensor  # [B + 1]


def _refuse(cause: str) -> UnsupportedConfigError:
    return UnsupportedConfigError(f"SGLang attention backend {NAME!r} (ATOM paged attention): {cause}")


def unsupported_runner(runner: Any) -> str | None:
    """Why SGLang's model runner needs what this backend lacks (None when it does not)."""
    model_config = getattr(runner, "model_config", None)
    if getattr(runner, "use_mla_backend", False):
        return ("latent attention (MLA) is not supported; serve MLA models with --attention-backend triton or "
                "torch_native")
    if getattr(model_config, "is_encoder_decoder", False):
        return "encoder-decoder models (cross attention) are not supported"
    algorithm = compat.speculative_algorithm()
    if algorithm is not None:
        return f"speculative decoding ({algorithm}) is not supported (no target-verify / draft-extend modes)"
    if compat.dllm_algorithm() is not None:
        return f"diffusion language models ({compat.dllm_algorithm()}) are not supported"
    dcp = compat.parallel().attn_dcp_size
    if dcp > 1:
        return f"decode context parallelism (--dcp-size {dcp}) is not supported"
    reason = unsupported_pool(runner.token_to_kv_pool, getattr(runner, "kv_index_translator", None))
    if reason is not None:
        return reason
    return None


def unsupported_pool(pool: Any, translator: Any = None) -> str | None:
    """Why SGLang's KV pool is not a plain NHD token pool this backend can read as ATOM's cache (None when it is):
    ``MHATokenToKVPool`` itself, or the one a ``HybridLinearKVPool`` keeps for a GDN model's full-attention layers."""
    if getattr(translator, "is_translating", False):
        return "SGLang's unified KV pool (virtual slot ids) is not supported"
    mha, hybrid, swa = compat.kv_pool_classes()
    kind = type(pool).__name__
    if isinstance(pool, swa):
        return (f"SGLang's hybrid sliding-window KV pool ({kind}) is not supported; start SGLang with "
                "--disable-hybrid-swa-memory")
    full = pool.full_kv_pool if type(pool) is hybrid else pool
    if type(full) is not mha:
        return f"KV pool {type(full).__name__} is not supported (SGLang's MHATokenToKVPool only)"
    if full.is_quantized_kv_cache:
        return f"quantized KV cache ({full.quant_method}) is not supported; use --kv-cache-dtype fp8_e4m3 or auto"
    if getattr(full, "use_hnd", False) or getattr(full, "kv_cache_layout", "nhd") != "nhd":
        return f"KV cache layout {getattr(full, 'kv_cache_layout', 'hnd')!r} is not supported (NHD only)"
    if full.dtype in (torch.float8_e5m2, torch.float8_e5m2fnuz):
        return f"KV cache dtype {full.dtype} is not supported; use --kv-cache-dtype fp8_e4m3 or auto"
    return None


def unsupported_layer(layer: Any, kwargs: dict) -> str | None:
    """Why one RadixAttention layer (and the arguments it passes) needs what this backend lacks."""
    if layer.is_cross_attention:
        return f"layer {layer.layer_id}: cross attention is not supported"
    attn_type = getattr(getattr(layer, "attn_type", None), "name", "DECODER")
    if attn_type != "DECODER":
        return f"layer {layer.layer_id}: {attn_type} attention (bidirectional) is not supported, causal decoder only"
    if layer.qk_head_dim != layer.v_head_dim:
        return (f"layer {layer.layer_id}: K head dim {layer.qk_head_dim} != V head dim {layer.v_head_dim} is not "
                "supported")
    if layer.logit_cap and layer.logit_cap > 0 and getattr(layer, "logit_capping_method", "tanh") != "tanh":
        return f"layer {layer.layer_id}: logit capping {layer.logit_capping_method!r} is not supported (tanh only)"
    if getattr(layer, "use_irope", False) or getattr(layer, "xai_temperature_len", -1) > 0:
        return f"layer {layer.layer_id}: chunked (iRoPE) attention / attention temperature is not supported"
    extra = sorted(k for k, v in kwargs.items() if v is not None and k not in KNOWN_KWARGS)
    if extra:
        return f"layer {layer.layer_id}: attention inputs {extra} are not supported (only {list(KNOWN_KWARGS)})"
    return None


def create_backend(runner: Any) -> AtomAttnBackend:
    """The factory SGLang's registry calls (``ATTENTION_BACKENDS['atom'](model_runner)``)."""
    return AtomAttnBackend(runner)


def register() -> None:
    """Offer the backend to SGLang (idempotent): its registry and the ``--attention-backend`` choices."""
    compat.register_attention_backend(NAME, create_backend)


class AtomAttnBackend(compat.attention_backend_base()):
    """SGLang ``AttentionBackend`` over ``atom_kernels.paged_attention`` / ``reshape_and_cache`` (see the module)."""

    def __init__(self, runner: Any):
        super().__init__()
        reason = unsupported_runner(runner)
        if reason is not None:
            logger.error("atom-sglang: %s", reason)
            raise _refuse(reason)
        self.device = torch.device(runner.device)
        self.req_to_token_pool = runner.req_to_token_pool
        self.token_to_kv_pool = runner.token_to_kv_pool
        pool = getattr(self.token_to_kv_pool, "full_kv_pool", self.token_to_kv_pool)
        self.page_size = int(getattr(runner, "page_size", None) or pool.page_size)
        if self.page_size != pool.page_size:
            raise _refuse(f"the runner's page size {self.page_size} != its KV pool's {pool.page_size}")
        self.forward_metadata: Metadata | None = None
        self._checked_layers: set[int] = set()
        self._warm_layers: set[int] = set()  # layers whose kernel variants are compiled (on their first eager step)
        self._graph: Metadata | None = None  # static buffers of CUDA-graph capture / replay

    # ------------------------------------------------------------------------------------------ metadata
    def _block_table(self, req_pool_indices: torch.Tensor, width: int | None = None) -> torch.Tensor:
        """``[B, blocks]`` int32: request b's j-th block is the page holding its tokens j * page_size ..."""
        req_to_token = self.req_to_token_pool.req_to_token
        stop = req_to_token.shape[1] if width is None else width * self.page_size
        slots = req_to_token[req_pool_indices.long(), :stop:self.page_size]
        return (slots // self.page_size if self.page_size > 1 else slots).to(torch.int32)

    def _check_mode(self, forward_batch: Any) -> str:
        mode = forward_batch.forward_mode.name
        if mode not in EXTEND_MODES + DECODE_MODES:
            raise _refuse(f"forward mode {mode} is not supported (extend, mixed and decode only)")
        if getattr(forward_batch, "encoder_lens", None) is not None:
            raise _refuse("encoder lengths in the batch: cross attention is not supported")
        return mode

    def init_forward_metadata(self, forward_batch: Any) -> None:
        """Eager steps: a block table as wide as this batch's longest context (read from ``seq_lens_cpu``)."""
        mode = self._check_mode(forward_batch)
        if mode == "IDLE":
            self.forward_metadata = None
            return
        bs = forward_batch.batch_size
        seq_lens_cpu = getattr(forward_batch, "seq_lens_cpu", None)
        width = None
        if seq_lens_cpu is not None and bs > 0:
            width = -(-int(seq_lens_cpu[:bs].max()) // self.page_size)
        device = forward_batch.seq_lens.device
        if mode in DECODE_MODES:
            query_start_loc = torch.arange(bs + 1, dtype=torch.int32, device=device)
        else:
            query_start_loc = torch.zeros(bs + 1, dtype=torch.int32, device=device)
            query_start_loc[1:] = torch.cumsum(forward_batch.extend_seq_lens[:bs], 0)
        self.forward_metadata = Metadata(
            block_table=self._block_table(forward_batch.req_pool_indices[:bs], width),
            seq_lens=forward_batch.seq_lens[:bs].to(torch.int32),
            query_start_loc=query_start_loc,
        )

    # ------------------------------------------------------------------------------------- CUDA graphs
    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int, *args: Any, **kwargs: Any) -> None:
        """Static buffers for decode graphs of up to ``max_bs`` requests (one token each)."""
        width = -(-self.req_to_token_pool.req_to_token.shape[1] // self.page_size)
        self._graph = Metadata(
            block_table=torch.zeros(max_bs, width, dtype=torch.int32, device=self.device),
            seq_lens=torch.ones(max_bs, dtype=torch.int32, device=self.device),
            query_start_loc=torch.arange(max_bs + 1, dtype=torch.int32, device=self.device),
        )

    def init_forward_metadata_out_graph(self, forward_batch: Any, in_capture: bool = False) -> None:
        """Capture and replay of a decode graph: refill the static buffers in place (device ops only) and point
        the metadata at their first ``bs`` rows (the same addresses at every replay)."""
        if self._graph is None:
            raise RuntimeError("init_cuda_graph_state was not called before a CUDA-graph step")
        mode = self._check_mode(forward_batch)
        if mode not in DECODE_MODES:
            raise _refuse(f"CUDA graphs of forward mode {mode} are not supported (decode graphs only)")
        bs = forward_batch.batch_size
        graph = self._graph
        graph.block_table[:bs].copy_(self._block_table(forward_batch.req_pool_indices[:bs]))
        graph.seq_lens[:bs].copy_(forward_batch.seq_lens[:bs])
        self.forward_metadata = Metadata(graph.block_table[:bs], graph.seq_lens[:bs], graph.query_start_loc[: bs + 1])

    def init_forward_metadata_in_graph(self, forward_batch: Any) -> None:
        """Nothing to record inside the graph: the kernels read the static buffers."""

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1  # padded requests attend to one token (their first slot): defined, never NaN

    # ------------------------------------------------------------------------------------------ forward
    def _check_layer(self, layer: Any, kwargs: dict) -> None:
        if layer.layer_id in self._checked_layers:
            return
        reason = unsupported_layer(layer, kwargs)
        if reason is not None:
            logger.error("atom-sglang: %s", reason)
            raise _refuse(reason)
        self._checked_layers.add(layer.layer_id)

    def _caches(self, layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's K and V buffers viewed as ``[num_blocks, page_size, kv_heads, head_dim]`` (no copy)."""
        k_buf = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_buf = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        for buf in (k_buf, v_buf):
            if buf.dim() != 3 or not buf.is_contiguous() or buf.shape[0] % self.page_size:
                raise _refuse(f"layer {layer.layer_id}: KV buffer {tuple(buf.shape)} is not a contiguous "
                              f"[slots, kv_heads, head_dim] buffer with slots a multiple of page size {self.page_size}")
        page = self.page_size
        return k_buf.view(-1, page, *k_buf.shape[1:]), v_buf.view(-1, page, *v_buf.shape[1:])

    def _check_kernel(self, layer: Any, args: tuple, kwargs: dict) -> None:
        """On a GPU the call must reach ATOM's kernel: the dispatcher's fallback, the torch reference, reads lengths
        on the host (no CUDA graph) and is the specification, not a serving path."""
        if args[0].device.type == "cpu":
            return
        backend, _ = paged_attention.resolve(*args, **kwargs)
        if backend == "reference":
            reasons = []
            for name in paged_attention.plan(args[0].device.type):
                check = paged_attention.implementation(name)[1]
                reason = check(*args, **kwargs) if check is not None and name != "reference" else None
                if reason is not None:
                    reasons.append(f"{name}: {reason}")
            raise _refuse(f"layer {layer.layer_id}: no GPU kernel of atom_kernels.paged_attention takes this layer "
                          f"({'; '.join(reasons) or 'none available'})")

    def _attend(self, q, k, v, layer, forward_batch, save_kv_cache: bool, kwargs: dict) -> torch.Tensor:
        first = layer.layer_id not in self._checked_layers
        self._check_layer(layer, kwargs)
        k_cache, v_cache = self._caches(layer)
        fp8 = k_cache.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
        k_scale = layer.k_scale if fp8 and isinstance(layer.k_scale, torch.Tensor) else None
        v_scale = layer.v_scale if fp8 and isinstance(layer.v_scale, torch.Tensor) else None
        if save_kv_cache and k is not None and v is not None:
            loc = forward_batch.out_cache_loc
            k = k.view(-1, layer.tp_k_head_num, layer.qk_head_dim)[: loc.shape[0]]
            v = v.view(-1, layer.tp_v_head_num, layer.v_head_dim)[: loc.shape[0]]
            reshape_and_cache(k, v, k_cache, v_cache, loc, k_scale, v_scale)
        md = self.forward_metadata
        sinks = kwargs.get("sinks")
        if sinks is not None and sinks.dtype != torch.float32:
            sinks = sinks.float()
        window = layer.sliding_window_size
        args = (q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim), k_cache, v_cache, md.block_table, md.seq_lens,
                md.query_start_loc, layer.scaling)
        options = dict(
            # SGLang's window excludes the query (key j visible when i - j <= w); ATOM's counts it (i - j < w + 1)
            sliding_window=window + 1 if window is not None and window > -1 else None,
            sinks=sinks, soft_cap=layer.logit_cap if layer.logit_cap and layer.logit_cap > 0 else None,
            k_scale=k_scale, v_scale=v_scale,
        )
        if first:
            self._check_kernel(layer, args, options)
        if layer.layer_id not in self._warm_layers and warm_up(args[0], k_cache, v_cache, layer.scaling, **options):
            self._warm_layers.add(layer.layer_id)
        out = paged_attention(*args, **options)
        return out.view(-1, layer.tp_q_head_num * layer.v_head_dim)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True, **kwargs):
        return self._attend(q, k, v, layer, forward_batch, save_kv_cache, kwargs)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache: bool = True, **kwargs):
        return self._attend(q, k, v, layer, forward_batch, save_kv_cache, kwargs)
