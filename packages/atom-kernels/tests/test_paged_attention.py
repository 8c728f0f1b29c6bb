"""``paged_attention`` and ``reshape_and_cache``: the Triton kernels against the torch references on random paged
caches, and a chunked prefill plus decode steps against one dense causal pass.

Cases: ragged contexts (1 token, block-crossing, a few hundred, 2k), block tables whose blocks are scattered over
the cache with unused entries -1, a sequence with no queries; decode (one query per sequence) with one split,
several splits, more splits than a short context has tokens and the launch's own choice; prefill chunks (several
queries continuing a cached context) with a sliding window, gpt-oss sinks and a soft cap; GQA ratios 1, 4 and 8;
head dims 64, 128 and 256; an fp8 e4m3 cache with per-tensor scales; bf16 and fp32.  The interpreter runs few cases
to stay well under a minute on a CPU.

Tolerances (``helpers.REL_TOL``, ‖out - ref‖ / ‖ref‖): fp32 1e-5 (summation order only); bf16 2e-2 (the output is
rounded to bf16 once, and on the GPU the dots take bf16 operands, p rounded to bf16 before ``p·V``).  The fp8 case
compares against the reference on the same fp8 cache (the kernel must dequantize exactly as the reference does), so
bf16's bound applies.  The chunked run against SDPA is fp32 at 1e-5.  Cache writes are exact (fp8: bit for bit).
"""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_close, assert_graph_capturable, rel_err

from atom_kernels import paged_attention, reshape_and_cache
from atom_kernels.compile_keys import recording, size_specializations
from atom_kernels.dispatch import triton_interpreting
from atom_kernels.ops.paged_attention import triton as pa_triton

BF16, FP32, FP8 = torch.bfloat16, torch.float32, torch.float8_e4m3fn


def block_table(lens, page, gen, spare_blocks=5, extra_columns=2):
    """Each sequence's blocks drawn at random from a cache with ``spare_blocks`` blocks nobody owns; unused entries
    -1.  Returns (table, num_blocks)."""
    used = [max(1, -(-n // page)) for n in lens]
    num_blocks = sum(used) + spare_blocks
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.full((len(lens), max(used) + extra_columns), -1, dtype=torch.int32)
    start = 0
    for b, n in enumerate(used):
        table[b, :n] = perm[start : start + n].int()
        start += n
    return table, num_blocks


def paged_case(q_lens, lens, heads, kv_heads, dim, page, dtype, device, gen, cache_dtype=None):
    """q, caches filled with random values (fp8: stored with scale 1/4), table, lengths, query_start_loc."""
    table, num_blocks = block_table(lens, page, gen)
    q = torch.randn(sum(q_lens), heads, dim, generator=gen).to(dtype=dtype, device=device)
    k_cache, v_cache = (torch.randn(num_blocks, page, kv_heads, dim, generator=gen) for _ in range(2))
    scales = {}
    if cache_dtype == FP8:
        k_cache, v_cache = (4 * c for c in (k_cache, v_cache))
        scales = dict(k_scale=torch.tensor([0.25], device=device), v_scale=torch.tensor([0.25], device=device))
    k_cache, v_cache = (c.to(dtype=cache_dtype or dtype, device=device) for c in (k_cache, v_cache))
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    return (q, k_cache, v_cache, table.to(device), seq_lens, qsl, dim**-0.5), scales


# name: (q_lens, context lens, heads, kv_heads, dim, page, dtype, cache dtype, options, splits)
CASES = {
    "decode-gqa1-d64-fp32-3splits": ([1] * 4, [1, 16, 17, 300], 4, 4, 64, 16, FP32, None, {}, 3),
    "decode-gqa8-d128-bf16-default": ([1] * 3, [1, 33, 700], 8, 1, 128, 16, BF16, None, {}, None),
    "decode-more-splits-than-tokens": ([1] * 3, [1, 3, 40], 4, 1, 64, 16, FP32, None, {}, 8),
    "decode-window-sinks-4splits": ([1] * 3, [2, 40, 300], 8, 2, 64, 16, FP32, None,
                                    {"sliding_window": 32, "sinks": True}, 4),
    "prefill-gqa4-d128-window-sinks-cap": ([5, 1, 20], [5, 17, 300], 8, 2, 128, 16, FP32, None,
                                           {"sliding_window": 7, "sinks": True, "soft_cap": 5.0}, 1),
    "prefill-gqa4-d128-window-sinks-cap-split": ([5, 1, 20], [5, 17, 300], 8, 2, 128, 16, FP32, None,
                                                 {"sliding_window": 7, "sinks": True, "soft_cap": 5.0}, 4),
    "prefill-d256-bf16-page64": ([3, 1, 18], [40, 90, 18], 4, 4, 256, 64, BF16, None, {}, 2),
    "decode-long-gqa4-fp32-default": ([1] * 2, [2048, 3], 8, 2, 128, 16, FP32, None, {}, None),
    "fp8-kv-gqa4-bf16-empty-row": ([3, 1, 0, 1], [40, 90, 0, 129], 8, 2, 64, 16, BF16, FP8, {"soft_cap": 30.0}, 2),
    # more sequences than a program reads per step while finding its own (SEQ_BLOCK): decodes then two prefills
    "mixed-70-seqs-3splits": ([1] * 68 + [6, 3], [1 + 7 * i % 50 for i in range(68)] + [30, 3], 4, 2, 64, 16, FP32,
                              None, {}, 3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_triton_matches_reference(name, device, rng):
    q_lens, lens, heads, kv_heads, dim, page, dtype, cache_dtype, options, splits = CASES[name]
    args, kwargs = paged_case(q_lens, lens, heads, kv_heads, dim, page, dtype, device, rng, cache_dtype)
    kwargs.update(options)
    if kwargs.get("sinks"):
        kwargs["sinks"] = torch.randn(heads, generator=rng).to(device)
    out = pa_triton.paged_attention(*args, **kwargs, config=pa_triton.Config(splits=splits))
    ref = paged_attention.call_backend("reference", *args, **kwargs)
    assert out.shape == args[0].shape and out.dtype == dtype
    assert_close(out, ref, dtype)
    print(f"{name}: rel err {rel_err(out, ref):.2e}, max abs {(out.float() - ref.float()).abs().max().item():.2e}")


@pytest.mark.skipif(not triton_interpreting(), reason="records the launches Triton's interpreter runs (CPU)")
def test_new_batch_compositions_compile_nothing_new(rng):
    """The sequence count, the split count and the strides that follow it are runtime arguments: serving steps of
    1-300 sequences, decode and prefill, short and long contexts compile one variant per tile class (decode /
    prefill) and output path (one split written directly / split and combined), whatever the step."""
    compositions = [([1], [5]), ([1] * 3, [1, 40, 700]), ([1] * 17, [300] * 17), ([1] * 300, [9] * 300),
                    ([7], [7]), ([1, 1, 12], [50, 2, 900]), ([33] * 5, [40] * 5), ([1] * 64 + [9], [3000] * 65)]
    with recording(launch=False) as keys:
        for q_lens, lens in compositions:
            args, _ = paged_case(q_lens, lens, 8, 2, 64, 16, FP32, "cpu", rng)
            pa_triton.paged_attention(*args)
    assert size_specializations(keys) == {}
    split_variants = {tuple(k for k in key if k[1] == "const") for key in keys["_split_kernel"]}
    assert len(split_variants) <= 4, split_variants
    assert len(keys["_combine_kernel"]) == 1, keys["_combine_kernel"]
    # warm_up compiles exactly those variants (a host calls it on its first eager step): one dummy step each
    q, k_cache, v_cache, *_, scale = paged_case([1], [5], 8, 2, 64, 16, FP32, "cpu", rng)[0]
    warm_key = (q.dtype, *q.shape[1:], k_cache.dtype, *k_cache.shape[1:], q.device) + (False,) * 5
    pa_triton._WARM.discard(warm_key)
    with recording(launch=False) as warmed:
        pa_triton.warm_up(q, k_cache, v_cache, scale)
    assert warmed == keys
    with recording(launch=False) as again:
        pa_triton.warm_up(q, k_cache, v_cache, scale)
    assert not again  # once per kind of call


def dense_causal(q, k, v, scale, window=None):
    """SDPA over one dense sequence: q [H, S, D], k/v [kv_heads, S, D]."""
    pos = torch.arange(q.shape[1])
    mask = pos[None, :] <= pos[:, None]
    if window is not None:
        mask &= pos[:, None] - pos[None, :] < window
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


@pytest.mark.parametrize("window", [None, 9])
def test_chunked_prefill_then_decode_equals_one_causal_pass(window, device, rng):
    """Two sequences (31 and 19 tokens) run as a 16-token chunk each, then a 13-token chunk of the first beside a
    decode row of the second, then two decode steps, a padding token closing every step; each step writes its K/V
    with reshape_and_cache first.  The outputs, put back in order, equal SDPA's causal pass over the whole
    sequences."""
    heads, kv_heads, dim, page = 4, 1, 64, 8
    steps = [[16, 16], [13, 1], [1, 1], [1, 1]]  # queries per sequence per step
    full = [sum(s[b] for s in steps) for b in range(2)]
    q_all = [torch.randn(n, heads, dim, generator=rng) for n in full]
    k_all = [torch.randn(n, kv_heads, dim, generator=rng) for n in full]
    v_all = [torch.randn(n, kv_heads, dim, generator=rng) for n in full]
    table, num_blocks = block_table(full, page, rng)
    k_cache = torch.zeros(num_blocks, page, kv_heads, dim, device=device)
    v_cache = torch.zeros_like(k_cache)
    table = table.to(device)
    done, outs = [0, 0], [[], []]
    for step in steps:
        pieces = [slice(done[b], done[b] + n) for b, n in enumerate(step)]
        slots = torch.cat([table[b, torch.arange(p.start, p.stop) // page].long().cpu() * page
                           + torch.arange(p.start, p.stop) % page for b, p in enumerate(pieces)])
        slots = torch.cat([slots, torch.tensor([-1])])  # a padding token: not written
        pad = torch.full((1, kv_heads, dim), float("nan"))
        k = torch.cat([*(k_all[b][p] for b, p in enumerate(pieces)), pad]).to(device)
        v = torch.cat([*(v_all[b][p] for b, p in enumerate(pieces)), pad]).to(device)
        reshape_and_cache.call_backend("triton", k, v, k_cache, v_cache, slots.to(device))
        q = torch.cat([torch.cat([q_all[b][p] for b, p in enumerate(pieces)]), torch.zeros(1, heads, dim)]).to(device)
        done = [d + n for d, n in zip(done, step)]
        qsl = torch.tensor([0, step[0], step[0] + step[1]], dtype=torch.int32, device=device)
        out = pa_triton.paged_attention(q, k_cache, v_cache, table, torch.tensor(done, dtype=torch.int32,
                                        device=device), qsl, dim**-0.5, sliding_window=window)
        outs[0].append(out[: step[0]].cpu())
        outs[1].append(out[step[0] : step[0] + step[1]].cpu())
    assert done == full
    for b in range(2):
        want = dense_causal(q_all[b].transpose(0, 1), k_all[b].transpose(0, 1), v_all[b].transpose(0, 1),
                            dim**-0.5, window).transpose(0, 1)
        got = torch.cat(outs[b])
        assert_close(got, want, FP32)
        print(f"window={window} seq {b}: max abs {(got - want).abs().max().item():.2e}")


@pytest.mark.parametrize("cache_dtype", [BF16, FP8])
def test_reshape_and_cache_matches_reference(cache_dtype, device, rng):
    """Scattered slots with padding tokens (-1); bf16 stores exactly, fp8 with a per-tensor scale bit for bit."""
    tokens, kv_heads, dim, page, blocks = 11, 2, 64, 4, 6
    k = torch.randn(tokens, kv_heads, dim, generator=rng).to(device=device, dtype=BF16)
    v = torch.randn(tokens, kv_heads, dim, generator=rng).to(device=device, dtype=BF16)
    slots = torch.randperm(blocks * page, generator=rng)[:tokens]
    slots[[2, 7]] = -1
    slots = slots.to(device)
    scales = (torch.tensor([0.05], device=device),) * 2 if cache_dtype == FP8 else (None, None)
    caches = [torch.zeros(blocks, page, kv_heads, dim, device=device).to(cache_dtype) for _ in range(4)]
    reshape_and_cache.call_backend("triton", k, v, caches[0], caches[1], slots, *scales)
    reshape_and_cache.call_backend("reference", k, v, caches[2], caches[3], slots, *scales)
    for got, want in ((caches[0], caches[2]), (caches[1], caches[3])):
        assert torch.equal(got.view(torch.uint8) if cache_dtype == FP8 else got,
                           want.view(torch.uint8) if cache_dtype == FP8 else want)
    flat = caches[2].view(-1, kv_heads, dim).float()
    written = slots.cpu() >= 0
    assert (flat[slots[written].long()] != 0).any() and flat.abs().sum() > 0
    assert flat.abs().sum(dim=(1, 2))[[s for s in range(blocks * page) if s not in slots.tolist()]].eq(0).all()


def test_reshape_and_cache_latent_only(device, rng):
    """A K-only cache (latent attention: one "head" of kv_lora_rank + rope, V of width 0): both backends write the
    latents into their slots and leave the rest zero."""
    tokens, width, page, blocks = 7, 576, 16, 3
    latent = torch.randn(tokens, 1, width, generator=rng).to(device=device, dtype=BF16)
    slots = torch.tensor([5, -1, 40, 17, 0, -1, 33], device=device)
    caches = [torch.zeros(blocks, page, 1, w, device=device, dtype=BF16) for _ in range(2) for w in (width, 0)]
    for backend, (k_cache, v_cache) in zip(("triton", "reference"), (caches[:2], caches[2:])):
        reshape_and_cache.call_backend(backend, latent, latent[..., :0], k_cache, v_cache, slots)
        flat = k_cache.flatten(0, 1)
        written = slots >= 0
        assert torch.equal(flat[slots[written]], latent[written]), backend
        untouched = torch.ones(blocks * page, dtype=torch.bool, device=device)
        untouched[slots[written]] = False
        assert not flat[untouched].any(), backend


def test_reference_rejects_bad_shapes(rng):
    (q, k_cache, v_cache, table, seq_lens, qsl, scale), _ = paged_case([2], [5], 4, 2, 16, 4, FP32, "cpu", rng)
    assert pa_triton.unsupported(q, k_cache, v_cache, table, seq_lens, qsl, scale) is None
    strided = q.transpose(1, 2).contiguous().transpose(1, 2)
    assert "contiguous" in pa_triton.unsupported(strided, k_cache, v_cache, table, seq_lens, qsl, scale)
    with pytest.raises(ValueError, match="kv_heads"):
        paged_attention.call_backend("reference", q[:, :3], k_cache, v_cache, table, seq_lens, qsl, scale)
    with pytest.raises(ValueError, match="queries but a context"):
        paged_attention.call_backend("reference", q, k_cache, v_cache, table, seq_lens - 4, qsl, scale)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graph_replays_new_lengths_and_tables():
    """Decode captured once, replayed after lengths and the block table change on the device (no host reads)."""
    gen = torch.Generator().manual_seed(0)
    args, _ = paged_case([1] * 4, [700, 5, 64, 1], 8, 1, 128, 16, BF16, "cuda", gen)
    q, k_cache, v_cache, table, seq_lens, qsl, scale = args

    def run():
        return paged_attention.call_backend("triton", *args, sinks=None)

    assert_graph_capturable(run, q)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    seq_lens.copy_(torch.tensor([1, 60, 5, 690], dtype=torch.int32))  # within each flipped row's blocks
    table.copy_(table.flip(0))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(captured, paged_attention.call_backend("reference", *args), BF16)


def test_reshape_and_cache_reference_writes_strided_caches(rng):
    """K and V as strided views of one packed cache whose blocks are padded (a host's page size larger than the
    tokens it holds): the reference writes through the views (no copy that would drop the write)."""
    tokens, kv_heads, dim, page, blocks = 5, 2, 8, 4, 3
    packed = torch.zeros(blocks, page * kv_heads * 2 * dim + 7)  # 7 pad elements after each block
    view = packed[:, : page * kv_heads * 2 * dim].view(blocks, page, kv_heads, 2 * dim)
    k_cache, v_cache = view[..., :dim], view[..., dim:]
    k, v = (torch.randn(tokens, kv_heads, dim, generator=rng) for _ in range(2))
    slots = torch.tensor([0, 5, -1, 11, 6])
    reshape_and_cache.call_backend("reference", k, v, k_cache, v_cache, slots)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(k_cache[slot // page, slot % page], k[t]) and torch.equal(v_cache[slot // page, slot % page], v[t])
    assert packed[:, -7:].eq(0).all() and packed.ne(0).sum() == 4 * kv_heads * 2 * dim
