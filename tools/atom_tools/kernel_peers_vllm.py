"""vLLM's kernels as peers of ATOM's in ``python -m atom_tools.kernels --peers atom_tools.kernel_peers_vllm ...``: each
called as vLLM's own backends and routers call it (vLLM 0.26's signatures).  vLLM is imported when a maker runs,
so a missing vLLM or kernel is one row (or cell) saying why, not a failed run.
"""

from __future__ import annotations

import torch

from atom_tools.kernels import attention, mla, routing


def fa3(case: attention.Case):
    """vLLM's FlashAttention-3 over the paged cache (``block_table`` + ``seqused_k``)."""
    try:
        from vllm.vllm_flash_attn import flash_attn_varlen_func
    except ImportError as err:
        return f"unavailable: {err}"

    def call():
        i = case.next()
        k, v = case.caches[i]
        return flash_attn_varlen_func(q=case.q, k=k, v=v, max_seqlen_q=case.new, cu_seqlens_q=case.qsl,
                                      max_seqlen_k=case.context, seqused_k=case.seq_lens, softmax_scale=case.scale,
                                      causal=True, block_table=case.tables[i], fa_version=3)
    return call


def vllm_triton_attention(case: attention.Case):
    """vLLM's Triton ``unified_attention`` over the paged cache; decode steps of up to 16 sequences (128 programs /
    KV heads, what vLLM's Triton backend passes) take its split (3D) kernel, with 16 segments."""
    try:
        from vllm.v1.attention.ops.triton_unified_attention import unified_attention
    except ImportError:
        try:
            from vllm.attention.ops.triton_unified_attention import unified_attention
        except ImportError as err:
            return f"unavailable: {err}"
    device = case.q.device
    tokens, heads, dim = case.q.shape
    out = torch.empty_like(case.q)
    descale = torch.ones(1, dtype=torch.float32, device=device)
    segments = 16
    split = dict(seq_threshold_3D=128 // attention.KV_HEADS, num_par_softmax_segments=segments,
                 softmax_segm_output=torch.empty(tokens, heads, segments, attention.triton_next_pow2(dim),
                                                 dtype=torch.float32, device=device),
                 softmax_segm_max=torch.empty(tokens, heads, segments, dtype=torch.float32, device=device),
                 softmax_segm_expsum=torch.empty(tokens, heads, segments, dtype=torch.float32, device=device))

    def call():
        i = case.next()
        k, v = case.caches[i]
        unified_attention(case.q, k, v, out, case.qsl, case.new, case.seq_lens, case.context, case.scale, True,
                          (-1, -1), case.tables[i], 0.0, None, descale, descale, **split)
        return out
    return call


def triton_mla(inputs: mla.Inputs):
    """vLLM's Triton MLA decode with the split count and scratch its TRITON_MLA backend uses."""
    import triton
    from vllm.v1.attention.ops.triton_decode_attention import decode_attention_fwd

    batch, heads, _ = inputs.q.shape
    page = inputs.caches[0].shape[1]
    max_context = inputs.tables[0].shape[1] * page
    sms = torch.cuda.get_device_properties(inputs.q.device).multi_processor_count
    splits = min(triton.next_power_of_2(max(1, max_context // 512)), 2 * sms)
    logits = torch.empty(batch, heads, splits, mla.LATENT + 1, dtype=torch.float32, device=inputs.q.device)

    def run(q, cache, table, seq_lens, scale, latent):
        out = torch.zeros(batch, heads, latent, dtype=q.dtype, device=q.device)
        lse = torch.zeros(batch, heads, dtype=q.dtype, device=q.device)
        kv = cache.unsqueeze(2)
        decode_attention_fwd(q, kv, kv[..., :latent], out, lse, table, seq_lens, logits, splits, scale, page,
                             is_mla=True)
        return out

    return run


def flashmla(inputs: mla.Inputs):
    """FlashMLA (as carried by vLLM) over the same cache: one query token per sequence, causal."""
    from vllm.v1.attention.ops.flashmla import flash_mla_with_kvcache, get_mla_metadata, is_flashmla_dense_supported

    supported, why = is_flashmla_dense_supported()
    if not supported:
        raise RuntimeError(f"FlashMLA unavailable: {why}")
    heads = inputs.q.shape[1]
    metadata, _ = get_mla_metadata(inputs.seq_lens, heads, 1, is_fp8_kvcache=False)

    def run(q, cache, table, seq_lens, scale, latent):
        out, _ = flash_mla_with_kvcache(q=q.unsqueeze(1), k_cache=cache.unsqueeze(2), block_table=table,
                                        cache_seqlens=seq_lens, head_dim_v=latent, tile_scheduler_metadata=metadata,
                                        softmax_scale=scale, causal=True, is_fp8_kvcache=False)
        return out.squeeze(1)

    return run


def routing_topk(case: str, bias: torch.Tensor | None):
    """vLLM's fused CUDA routing kernels (``_moe_C``), the one its router picks for the case: ``grouped_topk``
    for grouped routing (sigmoid fused), else ``topk_sigmoid`` / ``topk_softmax``."""
    from vllm import _custom_ops as ops

    experts, top_k, scoring, n_group, topk_group, scale, _ = routing.CASES[case]

    def grouped(logits):
        return ops.grouped_topk(logits, n_group, topk_group, top_k, True, scale, bias, 1)

    def ungrouped(logits):
        weights = torch.empty(logits.shape[0], top_k, dtype=torch.float32, device=logits.device)
        ids = torch.empty(logits.shape[0], top_k, dtype=torch.int32, device=logits.device)
        token_expert = torch.empty_like(ids)
        if scoring == "sigmoid":
            ops.topk_sigmoid(weights, ids, token_expert, logits, True, bias, scale)
        else:
            ops.topk_softmax(weights, ids, token_expert, logits, True)
        return weights, ids

    return grouped if n_group > 1 else ungrouped


PEERS = {
    "attention": {"fa3": fa3, "vllm_triton": vllm_triton_attention},
    "mla": {"vllm-triton-mla": triton_mla, "vllm-flashmla": flashmla},
    "routing": {"vllm": routing_topk},
}
