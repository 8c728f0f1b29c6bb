"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) inside SGLang, for atom-core's latent-attention models.

SGLang sizes its latent KV pool from the config (``ModelConfig`` lists ``DeepseekV3ForCausalLM`` as MLA:
``MLATokenToKVPool``, one ``kv_lora_rank + qk_rope_head_dim`` row per token; its value buffer is the first
``kv_lora_rank`` columns of that row).  :class:`SGLangLatentAttention` attends over that pool in the absorbed
form, the one SGLang's own DeepseekV2 sends its ``attn_mqa`` layer: a :class:`RadixAttention` of ``H`` query
heads over one kv head of ``kv_lora_rank + qk_rope_head_dim`` with ``v_head_dim = kv_lora_rank``,

    q_h = [q_nope,h W_UK,h | q_pe,h]      k = [kv_c | k_pe]  (the cached row)      v = kv_c
    o_h = softmax(q_h · kᵀ · scale) v · W_UV,hᵀ

for every step, prompt and decode alike (exact: the same scores and values as the expanded form).  The
backend writes ``k`` into the pool itself.  ``W_UK`` / ``W_UV`` come from atom-core's ``kv_b_proj`` once its
weights are loaded (:meth:`SGLangLatentAttention.finish_loading`): views of its weight when unquantized, else
its dequantization (atom-core's GEMM of that scheme on the identity), the quantized tensors then released.

The expanded form (``kv_b_proj`` applied to the cached latents) is not provided, so backends that choose it
themselves for some steps are refused (:func:`check_backend`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from atom_core.errors import UnsupportedConfigError
from atom_core.host import LatentAttentionSpec
from atom_core.quant.base import UnquantizedLinearMethod
from atom_core.runtime.latent_attention import dense_weight
from atom_sglang import compat
from atom_sglang.radix_view import RadixAttentionView

if TYPE_CHECKING:
    from atom_sglang.host import SGLangHost

# SGLang attention backends (by class name) that attend whatever form the layer sends, reading K/V from the
# latent pool: torch_native (CPU, tested), triton (what SGLang's own DeepseekV2 sends its absorbed form to for
# decode and prefix extends).  The others plan MLA prefill in the expanded form, or with the rope part apart.
ABSORBED_BACKENDS = {"TorchNativeAttnBackend": "torch_native", "TritonAttnBackend": "triton"}


def check_backend(backend: Any, layer_id: int) -> None:
    """An :class:`UnsupportedConfigError` unless SGLang's attention ``backend`` runs the absorbed form on
    every step (:data:`ABSORBED_BACKENDS`)."""
    name = type(backend).__name__
    if name not in ABSORBED_BACKENDS:
        raise UnsupportedConfigError(
            f"latent attention layer {layer_id}: SGLang's {name} is not one atom-sglang's absorbed MLA runs on; "
            f"serve with --attention-backend {' or '.join(sorted(ABSORBED_BACKENDS.values()))}"
        )


class SGLangLatentAttention(RadixAttentionView, nn.Module):
    """``forward(q, kv_c, k_pe) -> out`` (atom-core's latent attention) over SGLang's latent KV pool.

    ``q`` ``[T, H * (nope + rope)]`` (rope applied), ``kv_c`` ``[T, kv_lora_rank]`` (normalised), ``k_pe``
    ``[T, rope]`` (rotated) -> ``[T, H * v_head_dim]``; ``H`` is this rank's heads."""

    def __init__(self, host: SGLangHost, prefix: str, layer_id: int, num_heads: int, scale: float,
                 mla: LatentAttentionSpec):
        super().__init__()
        self._host = [host]  # lists keep the host and the model's kv_b_proj out of this module's tree
        self._kv_b_proj = [mla.kv_b_proj]
        self.num_heads = num_heads
        self.kv_lora_rank, self.rope_dim = mla.kv_lora_rank, mla.qk_rope_head_dim
        self.nope_dim, self.v_dim = mla.qk_nope_head_dim, mla.v_head_dim
        self.dtype = torch.get_default_dtype()  # the model's activation dtype (it is built under it)
        self.attn = compat.radix_attention_class()(  # a child, so SGLang finds every RadixAttention in the model
            num_heads, self.kv_lora_rank + self.rope_dim, scale,
            num_kv_heads=1,
            layer_id=layer_id,
            v_head_dim=self.kv_lora_rank,
            quant_config=None,
            prefix=prefix,
        )
        # [heads, nope, kv_lora_rank] and [heads, v, kv_lora_rank]; buffers follow the model's device moves
        self.register_buffer("w_uk", None, persistent=False)
        self.register_buffer("w_uv", None, persistent=False)

    def finish_loading(self) -> None:
        """Split the loaded ``kv_b_proj`` into per-head ``W_UK`` / ``W_UV`` (atom-core's loader calls this after
        every load).  A quantized projection already released keeps the split made from it."""
        proj = self._kv_b_proj[0]
        quantized = not isinstance(proj.quant_method, UnquantizedLinearMethod)
        if quantized and self.w_uk is not None and proj.weight.numel() == 0:
            return
        weight = dense_weight(proj, self.kv_lora_rank, self.dtype)
        heads = weight.view(self.num_heads, self.nope_dim + self.v_dim, self.kv_lora_rank)
        self.w_uk, self.w_uv = heads[:, : self.nope_dim], heads[:, self.nope_dim :]
        if quantized:  # the absorbed form never runs kv_b_proj: keep only its dequantized split
            for name, param in list(proj.named_parameters(recurse=False)):
                setattr(proj, name, nn.Parameter(param.data.new_empty(0), requires_grad=False))

    def _forward_batch(self) -> Any:
        """The step's ForwardBatch, with the absorbed weights ready (else a RuntimeError saying which)."""
        forward_batch = self._host[0].forward_batch
        layer_id = self.attn.layer_id
        if forward_batch is None:
            raise RuntimeError(f"latent attention layer {layer_id} ran without a ForwardBatch: call the model "
                               "through its SGLang wrapper's forward, which publishes it")
        if self.w_uk is None:
            raise RuntimeError(f"latent attention layer {layer_id} used before its weights were loaded")
        return forward_batch

    def absorb(self, q: torch.Tensor) -> torch.Tensor:
        """``[T, H * (nope + rope)]`` -> ``[T, H, kv_lora_rank + rope]``: ``q_nope W_UK`` then ``q_pe``."""
        tokens, heads = q.shape[0], self.num_heads
        q_nope, q_pe = q.view(tokens, heads, -1).split([self.nope_dim, self.rope_dim], dim=-1)
        q_latent = torch.bmm(q_nope.transpose(0, 1), self.w_uk.to(q.dtype)).transpose(0, 1)  # [T, H, kv_lora_rank]
        return torch.cat([q_latent, q_pe], dim=-1)

    def expand(self, out: torch.Tensor) -> torch.Tensor:
        """``[T, H, kv_lora_rank]`` attention over the latents -> ``[T, H * v_head_dim]`` (``W_UV`` applied)."""
        tokens, heads = out.shape[0], self.num_heads
        out = torch.bmm(out.transpose(0, 1), self.w_uv.to(out.dtype).transpose(1, 2))  # [H, T, v]
        return out.transpose(0, 1).reshape(tokens, heads * self.v_dim)

    def forward(self, q: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
        forward_batch = self._forward_batch()
        check_backend(compat.attention_backend(), self.attn.layer_id)
        tokens, heads = q.shape[0], self.num_heads
        q_abs = self.absorb(q)  # [T, H, kv_lora_rank + rope]
        latent = torch.cat([kv_c, k_pe], dim=-1)  # [T, kv_lora_rank + rope]: the pool's row
        out = self.attn(q_abs.reshape(tokens, -1), latent, kv_c.contiguous(), forward_batch)
        return self.expand(out.view(tokens, heads, self.kv_lora_rank))

def latent_attention(host: SGLangHost, prefix: str, layer_id: int, num_heads: int, scale: float,
                     mla: LatentAttentionSpec, *, sliding_window: int | None = None,
                     sinks: torch.Tensor | None = None) -> SGLangLatentAttention:
    """The layer :meth:`atom_sglang.host.SGLangHost.attention` returns for ``mla`` (this rank's ``num_heads``)."""
    if sliding_window is not None or sinks is not None:
        raise UnsupportedConfigError(f"{prefix}: latent attention with a sliding window or sinks is not supported")
    reason = compat.unsupported_latent_attention()
    if reason is not None:
        raise UnsupportedConfigError(f"{prefix}: {reason}")
    return SGLangLatentAttention(host, prefix, layer_id, num_heads, scale, mla)
