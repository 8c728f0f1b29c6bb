"""The native host's multi-head latent attention (DeepSeek-V2/V3): the paged cache holds each token's
latent ``kv_c | k_pe`` (one "head" of ``kv_lora_rank + qk_rope_head_dim``), never per-head keys/values.

Steps with prompt tokens attend in the expanded form (per-head keys and values made from the cached
latents); decode steps (one query per sequence) in the absorbed form, where ``W_UK`` moves into the query
and ``W_UV`` after the softmax, so attention runs over the latent itself:

    expanded:  o_h = softmax(q_h · [c W_UK,hᵀ | k_pe]ᵀ · s) (c W_UV,hᵀ)
    absorbed:  o_h = (softmax([q_nope,h W_UK,h | q_pe,h] · [c | k_pe]ᵀ · s) c) W_UV,hᵀ

The absorbed attention is ``atom_kernels.mla_decode``, which reads the paged cache in place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from atom_core.host import LatentAttentionSpec
from atom_core.quant.base import UnquantizedLinearMethod
from atom_kernels import mla_decode, reshape_and_cache

if TYPE_CHECKING:
    from atom_core.runtime.host import NativeHost


def dense_weight(linear: nn.Module, in_features: int, dtype: torch.dtype) -> torch.Tensor:
    """``linear``'s weight ``[out, in]`` in ``dtype``, whatever its quantization: the weight itself when
    unquantized, else the layer applied to the identity (each row of the identity has one nonzero value,
    which every activation quantization keeps exactly)."""
    if isinstance(linear.quant_method, UnquantizedLinearMethod):
        return linear.weight.data
    eye = torch.eye(in_features, dtype=dtype, device=linear.weight.device)
    out = linear(eye)
    if linear.bias is not None:
        out = out - linear.bias
    return out.t().contiguous()


class LatentAttention(nn.Module):
    def __init__(self, host: NativeHost, cache_index: int, num_heads: int, scale: float, mla: LatentAttentionSpec):
        super().__init__()
        self._host = [host]  # lists keep the host and the model's kv_b_proj out of this module's tree
        self._kv_b_proj = [mla.kv_b_proj]
        self.cache_index = cache_index
        self.num_heads = num_heads
        self.scale = scale
        self.kv_lora_rank, self.rope_dim = mla.kv_lora_rank, mla.qk_rope_head_dim
        self.nope_dim, self.v_dim = mla.qk_nope_head_dim, mla.v_head_dim
        self.kv_shapes = ((1, self.kv_lora_rank + self.rope_dim), (1, 0))  # the latent as K; no V cache
        self.dtype = torch.get_default_dtype()  # the model's activation dtype (it is built under it)
        self.w_uk: torch.Tensor | None = None  # [heads, nope, kv_lora_rank]
        self.w_uv: torch.Tensor | None = None  # [heads, v, kv_lora_rank]

    def finish_loading(self) -> None:
        """Split the loaded ``kv_b_proj`` into per-head ``W_UK`` / ``W_UV`` (views of its weight when
        unquantized; a quantized projection is dequantized once and its quantized tensors released)."""
        proj = self._kv_b_proj[0]
        weight = dense_weight(proj, self.kv_lora_rank, self.dtype)
        heads = weight.view(self.num_heads, self.nope_dim + self.v_dim, self.kv_lora_rank)
        self.w_uk, self.w_uv = heads[:, : self.nope_dim], heads[:, self.nope_dim :]
        if not isinstance(proj.quant_method, UnquantizedLinearMethod):
            for name, param in list(proj.named_parameters(recurse=False)):
                setattr(proj, name, nn.Parameter(param.data.new_empty(0), requires_grad=False))

    def _step_context(self):
        """The runner step this call belongs to, with the absorbed weights ready (else a RuntimeError saying which)."""
        ctx = self._host[0].context
        if ctx is None:
            raise RuntimeError("native attention called outside a runner step (no StepContext set)")
        if self.w_uk is None:
            raise RuntimeError("latent attention used before its weights were loaded (finish_loading)")
        return ctx

    def forward(self, q: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
        host = self._host[0]
        ctx = self._step_context()
        k_cache, v_cache = host.kv_cache.layers[self.cache_index]  # [blocks, block_size, 1, latent] and [.., 1, 0]
        num_tokens, heads = q.shape[0], self.num_heads
        latent = torch.cat([kv_c, k_pe], dim=-1).view(num_tokens, 1, -1)
        reshape_and_cache(latent, latent[..., :0], k_cache, v_cache, ctx.slot_mapping)
        if ctx.max_query_len == 1:
            return self._absorbed(q.view(num_tokens, heads, -1), k_cache, ctx)
        return self._expanded(q, k_cache, ctx)

    def _absorbed(self, q: torch.Tensor, cache: torch.Tensor, ctx) -> torch.Tensor:
        """One query per sequence (``q [B, H, nope + rope]``): attention over the cached latents themselves, read
        in place through the block table; nothing here reads the host, so a decode graph can capture it."""
        q_nope, q_pe = q.split([self.nope_dim, self.rope_dim], dim=-1)
        q_latent = torch.einsum("bhn,hnl->bhl", q_nope, self.w_uk.to(q.dtype))
        q_abs = torch.cat([q_latent, q_pe], dim=-1)  # [B, H, kv_lora_rank + rope]
        block_table, seq_lens = ctx.paged(cache.shape[1])
        out_latent = mla_decode(q_abs, cache[:, :, 0], block_table, seq_lens, self.scale, self.kv_lora_rank)
        out = torch.einsum("bhl,hvl->bhv", out_latent, self.w_uv.to(q.dtype))
        return out.reshape(q.shape[0], self.num_heads * self.v_dim)

    def _expanded(self, q: torch.Tensor, cache: torch.Tensor, ctx) -> torch.Tensor:
        """Steps with prompt tokens: per-head keys and values made from each sequence's cached latents."""
        batch, width, heads = ctx.batch_size, ctx.max_query_len, self.num_heads
        q_pad = q.new_zeros(batch * width, heads, self.nope_dim + self.rope_dim)
        q_pad[ctx.token_index()] = q.view(q.shape[0], heads, -1)
        q_pad = q_pad.view(batch, width, heads, -1).transpose(1, 2)  # [B, H, W, nope + rope]
        context = cache.view(-1, cache.shape[-1])[ctx.slot_table].to(q.dtype)  # [B, S, kv_lora_rank + rope]
        c, pe = context.split([self.kv_lora_rank, self.rope_dim], dim=-1)
        k_nope = torch.einsum("bsl,hnl->bhsn", c, self.w_uk.to(q.dtype))
        keys = torch.cat([k_nope, pe[:, None].expand(-1, heads, -1, -1)], dim=-1)
        values = torch.einsum("bsl,hvl->bhsv", c, self.w_uv.to(q.dtype))
        out = F.scaled_dot_product_attention(q_pad, keys, values, attn_mask=ctx.mask(None), scale=self.scale)
        return out.transpose(1, 2).reshape(batch * width, heads * self.v_dim)[ctx.token_index()]
