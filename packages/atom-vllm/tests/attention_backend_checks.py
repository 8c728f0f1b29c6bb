"""What ``vllm_probe.py backend`` reports about ATOM's attention backend, in a fresh process with vLLM loaded:
where vLLM's CUSTOM slot points after the plugins load, what vLLM's capability checks answer for the
configurations models ask of it, and the impl's cache write + forward on vLLM's own ``CommonAttentionMetadata``
against plain dense attention (written here, independent of atom_kernels) on the same tokens."""

from __future__ import annotations

import math
import types

# name -> (heads, kv_heads, head_size, dtype, kv_cache_dtype, sliding_window, sinks, soft_cap)
FORWARD_CASES = {
    "gqa2-fp32": (4, 2, 32, "float32", "auto", None, False, None),
    "mha-bf16": (2, 2, 64, "bfloat16", "auto", None, False, None),
    "gqa8-window-sinks": (8, 1, 32, "float32", "auto", 6, True, None),
    "softcap-fp16": (4, 4, 16, "float16", "auto", None, False, 30.0),
    "fp8-cache": (4, 2, 32, "float32", "fp8", None, False, None),
}
BLOCK_SIZE, NUM_BLOCKS = 16, 12
# (cached tokens, new tokens) per request: a fresh prefill, a decode, a chunked prefill over cached context
REQUESTS = [(0, 5), (36, 1), (13, 7)]
PADDING_TOKENS = 2  # rows past the step's tokens, as in a batch padded to a CUDA-graph size

# vLLM's selector arguments of a plain decoder layer, and what each refused configuration changes
PLAIN = {"head_size": 128, "dtype": "bfloat16", "kv_cache_dtype": "auto", "block_size": None, "use_mla": False,
         "has_sink": False, "use_sparse": False, "use_mm_prefix": False, "use_per_head_quant_scales": False,
         "attn_type": "decoder"}
ACCEPTED = {"plain": {}, "fp32": {"dtype": "float32"}, "fp8 cache": {"kv_cache_dtype": "fp8"},
            "sinks": {"has_sink": True}, "head size 256": {"head_size": 256}, "head size 80": {"head_size": 80},
            "sliding window": {"has_sliding_window": True}, "block size 528": {"block_size": 528}}
REFUSED = {"MLA": {"use_mla": True}, "sparse": {"use_sparse": True}, "head size 512": {"head_size": 512},
           "fp8_e5m2 cache": {"kv_cache_dtype": "fp8_e5m2"}, "encoder-only": {"attn_type": "encoder_only"},
           "cross attention": {"attn_type": "encoder_decoder"}, "multimodal prefix": {"use_mm_prefix": True},
           "per-head scales": {"use_per_head_quant_scales": True}, "non-causal": {"use_non_causal": True},
           "KV connector": {"use_kv_connector": True}}


def _validate(cls, changes: dict) -> list[str] | None:
    """vLLM's reasons against the configuration (empty: accepted); None where this vLLM's selector does not ask
    about what ``changes`` sets."""
    import inspect

    import torch

    known = inspect.signature(cls.validate_configuration).parameters
    if any(k not in known for k in changes):
        return None
    args = {**PLAIN, **changes}
    args["dtype"] = getattr(torch, args["dtype"])
    return cls.validate_configuration(device_capability=None, **{k: v for k, v in args.items() if k in known})


def _dense_reference(q, k, v, context: int, n: int, scale, window, sinks, soft_cap):
    """One request's attention in fp32, keys 0..context-1, queries at the last ``n`` positions."""
    import torch

    heads, kv_heads = q.shape[1], k.shape[1]
    k, v = k.float().repeat_interleave(heads // kv_heads, 1), v.float().repeat_interleave(heads // kv_heads, 1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if soft_cap:
        s = soft_cap * torch.tanh(s / soft_cap)
    qpos = torch.arange(context - n, context)[:, None]
    kpos = torch.arange(context)[None, :]
    visible = kpos <= qpos
    if window:
        visible &= qpos - kpos < window
    s = s.masked_fill(~visible, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.float().view(heads, 1, 1).expand(heads, n, 1)], -1)
    return torch.einsum("hqk,khd->qhd", torch.softmax(s, -1)[..., :context], v)


def _forward_case(backend, heads, kv_heads, head_size, dtype_name, cache_dtype, window, with_sinks, soft_cap) -> dict:
    import torch
    from vllm.v1.attention.backend import CommonAttentionMetadata

    torch.manual_seed(0)
    dtype = getattr(torch, dtype_name)
    fp8 = cache_dtype == "fp8"
    # the layer's cache as vLLM lays it out: the backend's logical shape, stored in its stride order
    shape = backend.get_kv_cache_shape(NUM_BLOCKS, BLOCK_SIZE, kv_heads, head_size, cache_dtype_str=cache_dtype)
    order = backend.get_kv_cache_stride_order()
    stored = torch.zeros([shape[i] for i in order], dtype=torch.uint8 if fp8 else dtype)
    kv_cache = stored.permute([order.index(i) for i in range(len(order))])
    sinks = torch.randn(heads) if with_sinks else None
    impl = backend.get_impl_cls()(heads, head_size, 1 / math.sqrt(head_size), kv_heads, None, window, cache_dtype,
                                  soft_cap, "decoder", None, **({"sinks": sinks} if with_sinks else {}))
    layer = types.SimpleNamespace(_k_scale=torch.tensor([0.05]), _v_scale=torch.tensor([0.04]))
    # each request's blocks: a shuffled subset of the cache's blocks (holes and order as vLLM's allocator leaves them)
    free = torch.randperm(NUM_BLOCKS).tolist()
    tables, keys, values, queries = [], [], [], []
    for cached, new in REQUESTS:
        need = -(-(cached + new) // BLOCK_SIZE)
        tables.append([free.pop() for _ in range(need)])
        keys.append(torch.randn(cached + new, kv_heads, head_size).to(dtype))
        values.append(torch.randn(cached + new, kv_heads, head_size).to(dtype))
        queries.append(torch.randn(new, heads, head_size).to(dtype))
    width = max(map(len, tables))
    block_table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)

    def slots(b: int, positions) -> torch.Tensor:
        return torch.tensor([tables[b][p // BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE for p in positions])

    # earlier steps wrote the cached tokens
    for b, (cached, _) in enumerate(REQUESTS):
        if cached:
            impl.do_kv_cache_update(layer, keys[b][:cached], values[b][:cached], kv_cache, slots(b, range(cached)))
    # this step: every request's new tokens, plus padding rows the slot mapping does not cover
    pad = lambda x: torch.cat([x, torch.randn(PADDING_TOKENS, *x.shape[1:]).to(dtype)])  # noqa: E731
    q = pad(torch.cat(queries))
    k = pad(torch.cat([keys[b][c:] for b, (c, _) in enumerate(REQUESTS)]))
    v = pad(torch.cat([values[b][c:] for b, (c, _) in enumerate(REQUESTS)]))
    slot_mapping = torch.cat([slots(b, range(c, c + n)) for b, (c, n) in enumerate(REQUESTS)])
    query_lens = [n for _, n in REQUESTS]
    query_start_loc = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor([c + n for c, n in REQUESTS], dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=query_start_loc, query_start_loc_cpu=query_start_loc.clone(), seq_lens=seq_lens,
        num_reqs=len(REQUESTS), num_actual_tokens=int(query_start_loc[-1]), max_query_len=max(query_lens),
        max_seq_len=int(seq_lens.max()), block_table_tensor=block_table, slot_mapping=slot_mapping)
    builder = backend.get_builder_cls()(None, ["layer"], None, torch.device("cpu"))
    metadata = builder.build(0, common)
    impl.do_kv_cache_update(layer, k, v, kv_cache, metadata.slot_mapping)
    output = torch.full((q.shape[0], heads, head_size), float("nan"), dtype=dtype)
    impl.forward(layer, q, k, v, kv_cache, metadata, output=output)

    errors = []
    start = 0
    for b, (cached, new) in enumerate(REQUESTS):
        kb, vb = keys[b], values[b]
        if fp8:  # what the cache holds: x / scale in e4m3, read back times the scale
            kb = (kb.float() / 0.05).clamp(-448, 448).to(torch.float8_e4m3fn).float() * 0.05
            vb = (vb.float() / 0.04).clamp(-448, 448).to(torch.float8_e4m3fn).float() * 0.04
        want = _dense_reference(queries[b], kb, vb, cached + new, new, 1 / math.sqrt(head_size), window, sinks, soft_cap)
        errors.append((output[start:start + new].float() - want).abs().max().item())
        start += new
    tolerance = {"float32": 1e-5, "bfloat16": 2e-2, "float16": 2e-3}[dtype_name]
    return {"max_abs_error": max(errors), "tolerance": tolerance, "finite": bool(torch.isfinite(output[:start]).all())}


def check_backend() -> dict:
    from vllm.plugins import load_general_plugins
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    load_general_plugins()
    slot = AttentionBackendEnum.CUSTOM
    out: dict = {"custom_overridden": slot.is_overridden()}
    if not slot.is_overridden():
        return out
    out["custom_path"] = slot.get_path()
    backend = slot.get_class()
    out["name"] = backend.get_name()
    from vllm.config import AttentionConfig

    out["default_backend"] = str(AttentionConfig().backend)
    out["accepted"] = {name: _validate(backend, changes) for name, changes in ACCEPTED.items()}
    out["refused"] = {name: _validate(backend, changes) for name, changes in REFUSED.items()}
    out["cudagraph_support"] = backend.get_builder_cls()._cudagraph_support.name
    out["forward"] = {name: _forward_case(backend, *case) for name, case in FORWARD_CASES.items()}
    try:
        backend.get_impl_cls()(4, 32, 0.1, 4, [0.5] * 4, None, "auto")
        out["alibi"] = "accepted"
    except Exception as err:  # noqa: BLE001 - the message is what the test checks
        out["alibi"] = f"{type(err).__name__}: {err}"
    return out
