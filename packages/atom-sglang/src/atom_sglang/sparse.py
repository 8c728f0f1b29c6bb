"""DeepSeek sparse attention (DeepSeek-V3.2, GLM-5) inside SGLang, for atom-core's sparse latent-attention models.

SGLang's ModelConfig lists both architectures as DSA (``is_deepseek_dsa``: MLA plus ``index_topk``), so its
ModelRunner builds a ``DSATokenToKVPool``: the latent pool of :mod:`atom_sglang.latent` plus, per layer, an indexer-key
buffer of pages of 64 tokens, each page one ``uint8`` row holding the 64 keys in FP8 e4m3 (``index_head_dim`` = 128
bytes each, token-major) and then their 64 fp32 scales (one per 128 elements).  :class:`SGLangSparseLatentAttention`
keeps its indexer keys there, quantized as SGLang's own DeepSeek-V3.2 quantizes them (a power-of-two scale per 128
elements, ``ue8m0``), and runs every step, prompt and decode alike, with atom-kernels' ops over SGLang's pools:

    latent row and FP8 indexer key of each new token -> the pools, at forward_batch.out_cache_loc
    scores    = indexer_scores(index_q, weights, the dequantized keys of each request's context)
    positions = topk_indices(scores, topk)                        (per query, positions 0 .. its own)
    out       = sparse_mla(absorbed q, SGLang's latent rows at req_to_token[request, positions])

Contexts are read through SGLang's ``req_to_token`` (one slot per position), whatever the pool's page size.  A
layer without its own indexer (GLM-5's shared layers) reuses the selection the last layer with one made for the
same ForwardBatch.  SGLang's attention backend is not called for these layers (its DSA backend's kernels are
GPU-only); the pools it holds are read through SGLang's forward context.  The scores are a ``[tokens, context]``
fp32 matrix per layer and the context's keys are dequantized per step: a reference path, no GPU kernel of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from atom_core.errors import UnsupportedConfigError
from atom_core.host import LatentAttentionSpec
from atom_core.runtime.sparse_attention import token_positions
from atom_kernels import indexer_scores, sparse_mla, topk_indices
from atom_sglang import compat
from atom_sglang.latent import SGLangLatentAttention

if TYPE_CHECKING:
    from atom_sglang.host import SGLangHost

QUANT_BLOCK = 128  # elements of an indexer key per fp32 scale in SGLang's pool
FP8_MAX = 448.0  # float8_e4m3fn
SCALE_BYTES = 4


def quantize_index_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``keys`` ``[T, D]`` -> (FP8 e4m3 ``[T, D]``, fp32 scales ``[T, D // 128]``): per block of 128 elements the
    power-of-two scale ``2^ceil(log2(amax / 448))`` (amax at least 1e-4), as SGLang's DeepSeek-V3.2 indexer
    quantizes the keys it caches."""
    tokens, dim = keys.shape
    blocks = keys.float().view(tokens, dim // QUANT_BLOCK, QUANT_BLOCK)
    amax = blocks.abs().amax(-1).clamp(min=1e-4)
    scale = torch.exp2(torch.ceil(torch.log2(amax / FP8_MAX)))
    fp8 = (blocks / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return fp8.view(tokens, dim), scale


def _page_views(buffer: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(FP8 keys ``[pages, page_size, D]``, scales ``[pages, page_size, D // 128]``, page_size) of one layer's
    ``uint8`` indexer-key buffer ``[pages, page_size * (D + D // 128 * 4)]``."""
    per_token = dim + dim // QUANT_BLOCK * SCALE_BYTES
    pages, row = buffer.shape
    page_size = row // per_token
    keys = buffer[:, : page_size * dim].view(torch.float8_e4m3fn).view(pages, page_size, dim)
    scales = buffer[:, page_size * dim :].view(torch.float32).view(pages, page_size, dim // QUANT_BLOCK)
    return keys, scales, page_size


def store_index_keys(buffer: torch.Tensor, loc: torch.Tensor, keys: torch.Tensor) -> None:
    """Write the keys ``[T, D]`` of tokens at pool slots ``loc`` ``[T]`` into one layer's indexer-key buffer."""
    fp8, scale = quantize_index_keys(keys)
    key_pages, scale_pages, page_size = _page_views(buffer, keys.shape[1])
    loc = loc.long()
    key_pages[loc // page_size, loc % page_size] = fp8
    scale_pages[loc // page_size, loc % page_size] = scale


def load_index_keys(buffer: torch.Tensor, slots: torch.Tensor, dim: int) -> torch.Tensor:
    """The dequantized fp32 keys ``[N, D]`` at pool slots ``slots`` ``[N]``."""
    key_pages, scale_pages, page_size = _page_views(buffer, dim)
    slots = slots.long()
    fp8 = key_pages[slots // page_size, slots % page_size].float()
    scale = scale_pages[slots // page_size, slots % page_size]
    return (fp8.view(-1, dim // QUANT_BLOCK, QUANT_BLOCK) * scale[..., None]).view(-1, dim)


def check_pool(pool: Any, layer_id: int, index_head_dim: int) -> None:
    """An :class:`UnsupportedConfigError` unless ``pool`` is SGLang's DSA pool in the layout read here."""
    name = type(pool).__name__
    if not hasattr(pool, "get_index_k_with_scale_buffer"):
        raise UnsupportedConfigError(
            f"sparse attention layer {layer_id}: SGLang's KV pool is {name}, which holds no "
            "indexer keys (SGLang builds its DSA pool for DeepseekV32/GlmMoeDsa configs)"
        )
    if getattr(pool, "index_kpool", 1) != 1 or getattr(pool, "dsa_kv_cache_store_fp8", False):
        raise UnsupportedConfigError(
            f"sparse attention layer {layer_id}: SGLang's {name} pools index keys or stores "
            "the latent in FP8; atom-sglang reads an unpooled index and a bf16/fp32 latent"
        )
    if pool.index_head_dim != index_head_dim:
        raise UnsupportedConfigError(
            f"sparse attention layer {layer_id}: SGLang's pool holds {pool.index_head_dim}-"
            f"wide indexer keys, the model's are {index_head_dim}"
        )


def capturing() -> bool:
    """Whether a CUDA graph is being captured on the current stream."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def query_start_loc(forward_batch: Any) -> torch.Tensor:
    """``[B + 1]`` offsets of each request's new tokens in the step (one each when decoding)."""
    if forward_batch.forward_mode.is_decode():
        return torch.arange(forward_batch.batch_size + 1, device=forward_batch.seq_lens.device)
    lens = forward_batch.extend_seq_lens
    return torch.cat([lens.new_zeros(1), torch.cumsum(lens, 0)])


class SGLangSparseLatentAttention(SGLangLatentAttention):
    """``forward(q, kv_c, k_pe, index) -> out`` (atom-core's sparse latent attention) over SGLang's DSA pool;
    ``index`` = the indexer's ``(q [T, H, D], k [T, D], weights [T, H])``, None for a layer without its own."""

    def __init__(self, host: SGLangHost, prefix: str, layer_id: int, num_heads: int, scale: float, mla: LatentAttentionSpec):
        super().__init__(host, prefix, layer_id, num_heads, scale, mla)
        self.sparse = mla.sparse

    def forward(
        self,
        q: torch.Tensor,
        kv_c: torch.Tensor,
        k_pe: torch.Tensor,
        index: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        host = self._host[0]
        batch = self._forward_batch()
        layer_id = self.attn.layer_id
        if capturing():  # the step reads context lengths on the host: a captured graph would replay stale ones
            raise UnsupportedConfigError(
                f"sparse attention layer {layer_id}: atom-sglang's DSA step cannot be captured "
                "in a CUDA graph; serve with --disable-cuda-graph (and without prefill CUDA "
                "graphs)"
            )
        if (index is not None) != self.sparse.own_indexer:
            raise RuntimeError("a sparse attention layer takes the indexer's (q, k, weights) exactly when it has its own indexer")
        if index is None and (host.sparse_selection is None or host.sparse_selection[0] is not batch):
            raise RuntimeError(f"shared sparse attention layer {layer_id} runs before any layer with its own indexer in this step")
        pool, req_to_token = compat.kv_pools()
        check_pool(pool, layer_id, self.sparse.index_head_dim)
        tokens = q.shape[0]
        loc = batch.out_cache_loc
        pool.set_kv_buffer(self.attn, loc, torch.cat([kv_c, k_pe], dim=-1).view(tokens, 1, -1), None)
        token_seq, token_pos = token_positions(query_start_loc(batch), batch.seq_lens, tokens)
        width = int(batch.seq_lens_cpu.max())
        context = req_to_token[batch.req_pool_indices.long(), :width].long()  # [B, L]: each position's slot
        if index is not None:
            index_q, index_k, weights = index
            buffer = pool.get_index_k_with_scale_buffer(layer_id)
            store_index_keys(buffer, loc, index_k)
            keys = load_index_keys(buffer, context.reshape(-1), index_k.shape[1]).view(context.numel(), 1, -1)
            table = torch.arange(context.numel(), dtype=torch.int32, device=context.device).view(context.shape)
            scores = indexer_scores(index_q.contiguous(), weights, keys, table, token_seq, token_pos, self.sparse.index_scale)
            host.sparse_selection = (batch, topk_indices(scores, self.sparse.topk))
        picked = host.sparse_selection[1].long()  # [T, topk] positions, -1 unused
        slots = context[token_seq.long()].gather(1, picked.clamp(min=0))
        slots = torch.where(picked >= 0, slots, -1).to(torch.int32)
        q_abs = self.absorb(q)
        out = sparse_mla(q_abs, pool.get_key_buffer(layer_id), slots, self.attn.scaling, self.kv_lora_rank)
        return self.expand(out)


def sparse_latent_attention(
    host: SGLangHost,
    prefix: str,
    layer_id: int,
    num_heads: int,
    scale: float,
    mla: LatentAttentionSpec,
    *,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,
) -> SGLangSparseLatentAttention:
    """The layer :meth:`atom_sglang.host.SGLangHost.attention` returns for a sparse ``mla`` (this rank's heads)."""
    if sliding_window is not None or sinks is not None:
        raise UnsupportedConfigError(f"{prefix}: sparse latent attention with a sliding window or sinks is not supported")
    reason = compat.unsupported_latent_attention()
    if reason is not None:
        raise UnsupportedConfigError(f"{prefix}: {reason}")
    algorithm = compat.speculative_algorithm()
    if algorithm is not None:  # verify / draft-extend steps carry several tokens per request in their own layout
        raise UnsupportedConfigError(
            f"{prefix}: speculative decoding ({algorithm}) with sparse latent attention is not "
            "supported; serve without --speculative-algorithm"
        )
    return SGLangSparseLatentAttention(host, prefix, layer_id, num_heads, scale, mla)
