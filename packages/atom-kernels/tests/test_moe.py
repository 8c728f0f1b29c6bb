"""Mixture-of-experts ops: routing, alignment and the fused expert MLPs, Triton against the torch
references (and the references against transformers' routers and a per-token loop)."""

import itertools

import pytest
import torch
import torch.nn.functional as F
from conftest import INTERPRET
from helpers import assert_close, randn

from atom_kernels import ExpertQuant, MoeKernelConfig, fused_moe, moe_align_block_size, topk_routing
from atom_kernels.ops.fused_moe import GemmTile, register_expert_format
from atom_kernels.ops.fused_moe.configs import CONFIGS, SWEEP, shape_class
from atom_kernels.ops.moe_align import max_blocks

# Small tiles so the interpreter's work stays small while rows, columns and K each span several tiles.
TINY = MoeKernelConfig(16, GemmTile(32, 32), GemmTile(32, 32), group_m=2)
TINY_M32 = MoeKernelConfig(32, GemmTile(16, 64), GemmTile(64, 16), group_m=1)


def routing_pair(logits, top_k, **kw):
    return (topk_routing.call_backend(b, logits, top_k, **kw) for b in ("triton", "reference"))


def assert_same_choices(got, want):
    """Same experts and weights per token; the order of the k columns is not part of the contract."""
    (w, ids), (w_ref, ids_ref) = got, want
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    ids, order = ids.cpu().long().sort(dim=-1)
    ids_ref, order_ref = ids_ref.cpu().long().sort(dim=-1)
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(w.cpu().gather(1, order), w_ref.cpu().gather(1, order_ref), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------- routing
def distinct_logits(tokens, experts, dtype, device, gen):
    """Random logits without ties in any dtype (which expert wins a tie is not part of the contract)."""
    rows = [torch.randperm(experts, generator=gen) for _ in range(tokens)]
    return ((torch.stack(rows).float() - experts / 2) / 8).to(dtype=dtype, device=device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("experts,top_k,renormalize", [(8, 2, True), (60, 4, False), (6, 1, True), (128, 8, True)])
def test_softmax_routing(device, rng, dtype, experts, top_k, renormalize):
    logits = distinct_logits(5, experts, dtype, device, rng)
    got, want = routing_pair(logits, top_k, renormalize=renormalize)
    assert_same_choices(got, want)


@pytest.mark.parametrize("experts,n_group,topk_group,top_k,with_bias,renormalize",
                         [(16, 4, 2, 4, True, True), (12, 3, 1, 2, False, True), (64, 8, 4, 8, True, False),
                          (10, 1, 1, 3, True, True), (8, 1, 1, 2, False, False)])
def test_sigmoid_grouped_routing(device, rng, experts, n_group, topk_group, top_k, with_bias, renormalize):
    logits = randn(6, experts, device=device, gen=rng, scale=2.0)
    bias = randn(experts, device=device, gen=rng, scale=0.5) if with_bias else None
    got, want = routing_pair(logits, top_k, scoring="sigmoid", correction_bias=bias, n_group=n_group,
                             topk_group=topk_group, renormalize=renormalize, routed_scaling_factor=2.5)
    assert_same_choices(got, want)
    if n_group > 1:  # every chosen expert lies in one of the topk_group best groups
        ids = got[1].long().cpu()
        assert ((ids // (experts // n_group)).unique(dim=None).numel() <= n_group)
        for row in ids // (experts // n_group):
            assert row.unique().numel() <= topk_group


def test_routing_rejects_bad_groups():
    with pytest.raises(ValueError, match="do not split"):
        topk_routing.call_backend("reference", torch.randn(2, 10), 2, scoring="sigmoid", n_group=3)


def _hf_routers():
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeTopkRouter
    from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
    from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeTopKRouter
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    cfg = transformers.AutoConfig.for_model
    softmax = lambda c: dict(top_k=c.num_experts_per_tok, renormalize=getattr(c, "norm_topk_prob", True))
    sigmoid = lambda c: dict(top_k=c.num_experts_per_tok, scoring="sigmoid", renormalize=c.norm_topk_prob,
                             n_group=c.n_group, topk_group=c.topk_group, routed_scaling_factor=c.routed_scaling_factor)
    return [
        (Qwen3MoeTopKRouter, cfg("qwen3_moe", num_experts=24, num_experts_per_tok=4, hidden_size=32,
                                 norm_topk_prob=True), softmax),
        (Qwen3MoeTopKRouter, cfg("qwen3_moe", num_experts=24, num_experts_per_tok=4, hidden_size=32,
                                 norm_topk_prob=False), softmax),
        (MixtralTopKRouter, cfg("mixtral", num_local_experts=8, num_experts_per_tok=2, hidden_size=32), softmax),
        (Qwen2MoeTopKRouter, cfg("qwen2_moe", num_experts=20, num_experts_per_tok=4, hidden_size=32,
                                 norm_topk_prob=False), softmax),
        (Glm4MoeTopkRouter, cfg("glm4_moe", n_routed_experts=16, num_experts_per_tok=4, hidden_size=32, n_group=4,
                                topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True), sigmoid),
        (DeepseekV3TopkRouter, cfg("deepseek_v3", n_routed_experts=32, num_experts_per_tok=8, hidden_size=32, n_group=8,
                                   topk_group=4, routed_scaling_factor=2.5, norm_topk_prob=True), sigmoid),
        (DeepseekV3TopkRouter, cfg("deepseek_v3", n_routed_experts=8, num_experts_per_tok=2, hidden_size=32, n_group=1,
                                   topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=False), sigmoid),
    ]


@pytest.mark.parametrize("case", range(7))
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_routing_matches_transformers(device, rng, case, backend):
    router_cls, config, kwargs_of = _hf_routers()[case]
    router = router_cls(config)
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=rng))
        bias = getattr(router, "e_score_correction_bias", None)
        if bias is not None:
            bias.copy_(torch.randn(bias.shape, generator=rng) * 0.3)
        hidden = torch.randn(9, config.hidden_size, generator=rng)
        logits, hf_weights, hf_ids = router(hidden)
    kwargs = kwargs_of(config)
    top_k = kwargs.pop("top_k")
    bias = bias.to(device) if bias is not None else None
    got = topk_routing.call_backend(backend, logits.to(device), top_k, correction_bias=bias, **kwargs)
    assert_same_choices(got, (hf_weights.float(), hf_ids.to(torch.int32)))


# ----------------------------------------------------------------------------------------- alignment
def _expert_map(rng, global_experts, local_experts, device):
    """A map holding ``local_experts`` of ``global_experts`` (local ids ascending with global ids)."""
    held = torch.randperm(global_experts, generator=rng)[:local_experts].sort().values
    emap = torch.full((global_experts,), -1, dtype=torch.int32)
    emap[held] = torch.arange(local_experts, dtype=torch.int32)
    return emap.to(device), held


@pytest.mark.parametrize("tokens,top_k,experts,block_m", [(1, 1, 4, 16), (3, 2, 8, 16), (7, 4, 64, 16), (100, 2, 5, 32),
                                                          (300, 2, 20, 16), (400, 8, 128, 64), (1, 10, 512, 16),
                                                          (25, 10, 384, 16), (32, 8, 128, 16)])
@pytest.mark.parametrize("with_map", [False, True])
def test_moe_align(device, rng, tokens, top_k, experts, block_m, with_map):
    local = experts
    emap = None
    if with_map:
        emap, _ = _expert_map(rng, experts, max(1, experts // 2), device)
        local = max(1, experts // 2)
    ids = torch.randint(0, experts, (tokens, top_k), generator=rng, dtype=torch.int32).to(device)
    got = moe_align_block_size.call_backend("triton", ids, local, block_m, emap)
    want = moe_align_block_size.call_backend("reference", ids, local, block_m, emap)
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w.cpu())


def test_moe_align_reference_layout(rng):
    """The specification itself: every local pair exactly once, runs sorted by expert and padded."""
    ids = torch.randint(0, 6, (50, 3), generator=rng)
    emap = torch.tensor([0, -1, 1, 2, -1, 3], dtype=torch.int32)
    sorted_ids, block_experts, num_padded = moe_align_block_size.call_backend("reference", ids, 4, 16, emap)
    assert sorted_ids.numel() == max_blocks(150, 4, 16) * 16 and block_experts.numel() == max_blocks(150, 4, 16)
    rows = int(num_padded)
    assert rows % 16 == 0
    local = emap[ids.flatten()]
    real = sorted_ids[sorted_ids < 150].long()
    assert sorted(real.tolist()) == sorted((local >= 0).nonzero().flatten().tolist())
    assert (sorted_ids[rows:] == 150).all() and (block_experts[rows // 16 :] == -1).all()
    for block in range(rows // 16):
        pairs = sorted_ids[block * 16 : (block + 1) * 16]
        pairs = pairs[pairs < 150].long()
        assert pairs.numel() > 0 and (local[pairs] == block_experts[block]).all()
        assert torch.equal(pairs, pairs.sort().values)


# The sizes a host sends: vLLM profiles a model with one forward of max_num_batched_tokens (8192-32768) tokens.
HOST_TOKENS = [1, 7, 256, 4096, 8192, 16384, 32768, 65536]
HOST_TOP_K = [1, 2, 8, 10]
HOST_EXPERTS = [8, 60, 64, 128, 256, 384, 512]
HOST_BLOCK_M = [16, 32, 64, 128]
TILE_BOUND = 32768  # entries of any 2-D tile one program holds
SMEM_LIMIT = 227 * 1024  # shared memory per program on H100/H200


def test_moe_align_plan_tiles_are_bounded_at_every_size():
    """Every program's tiles stay under a bound independent of the token count, at every size a host can send.  (The
    old count kernel grew its one-hot tile with the pairs to cap the chunks at 256: 16384 tokens x top-8 x 128 experts
    asked for 256 KiB of shared memory on an H200, 512 experts failed from 2048 tokens, and the layout and scatter
    kernels held the whole [chunks, experts] count table.)"""
    from atom_kernels.ops.moe_align import triton as align

    worst, multi_shapes = {}, {}
    for tokens, top_k, experts, block_m in itertools.product(HOST_TOKENS, HOST_TOP_K, HOST_EXPERTS, HOST_BLOCK_M):
        pairs = tokens * top_k
        p = align.plan(pairs, experts, block_m)
        assert p.max_tile_entries <= TILE_BOUND, (tokens, top_k, experts, block_m, p.tile_entries)
        assert p.shared_memory_bound <= SMEM_LIMIT, (tokens, top_k, experts, block_m, p)
        assert p.pair_tile * p.experts_p2 <= align.MAX_TILE_ENTRIES
        # every pair is in exactly one program's tiles, every row in one layout program's
        assert p.chunks * p.chunk >= pairs > (p.chunks - 1) * p.chunk
        assert p.tiles * p.rows >= max_blocks(pairs, experts, block_m) * block_m
        assert p.rows % block_m == 0 and p.experts_p2 >= experts
        assert max(p.grid.values()) < 2**31 - 1
        if p.single:
            assert pairs <= align.SINGLE_CHUNK_PAIRS and p.chunk >= pairs
        else:
            assert p.chunks <= align.MAX_CHUNKS
            assert p.prefix_programs * p.expert_block == p.experts_p2
            # the constexprs and warps of the three kernels: the same at every token count
            shapes = (p.pair_tile, p.experts_p2, p.expert_block, p.chunk_step, p.rows, p.num_warps)
            assert multi_shapes.setdefault((experts, block_m), shapes) == shapes, (tokens, top_k, experts, block_m)
        key = (experts, block_m)
        worst[key] = max(worst.get(key, 0), p.max_tile_entries)
    # 16384 tokens x top-8 x 128 experts, the size that failed in vLLM's profile run
    p = align.plan(16384 * 8, 128, 64)
    assert (p.pair_tile, p.chunk_tiles, p.chunks, p.shared_memory_bound) == (128, 1, 1024, 65536), p
    assert max(worst.values()) <= align.MAX_TILE_ENTRIES


def _check_align(rng, device, tokens, top_k, experts, block_m, with_map):
    local, emap = experts, None
    if with_map:
        local = max(1, experts // 2)
        emap, _ = _expert_map(rng, experts, local, device)
    ids = torch.randint(0, experts, (tokens, top_k), generator=rng, dtype=torch.int32).to(device)
    got = moe_align_block_size.call_backend("triton", ids, local, block_m, emap)
    want = moe_align_block_size.call_backend("reference", ids, local, block_m, emap)
    for g, w in zip(got, want):
        assert torch.equal(g.cpu(), w.cpu())
    return ids, emap, local


@pytest.mark.parametrize("tokens,top_k,experts,block_m,with_map", [
    (1040, 8, 128, 16, False),  # 65 chunks: the prefix kernel's loop takes 2 steps, its grid 2 expert blocks
    (289, 8, 512, 32, False),  # 73 chunks of 32-pair tiles, 8 expert blocks
    (301, 8, 512, 64, True),  # 256 local experts of 512: a third of the pairs left out
    (33, 8, 128, 16, False),  # 264 pairs, just past the single launch: 3 chunks in one prefix step of 64
    (257, 1, 8, 16, True),  # one pair past the single launch: 1 chunk
    (16384, 8, 128, 16, False),  # vLLM's batched-token budget at top-8: 1024 chunks, 16 prefix steps
    (16384, 8, 512, 16, True),  # 256 local experts: 2 one-hot tiles per chunk
])
def test_moe_align_many_chunks(device, rng, tokens, top_k, experts, block_m, with_map):
    """The multi-chunk path with its real tiles at sizes the interpreter runs in seconds."""
    _check_align(rng, device, tokens, top_k, experts, block_m, with_map)


@pytest.mark.skipif(not INTERPRET, reason="enlarged tiles: interpreter-only (on a GPU they would not fit)")
@pytest.mark.parametrize("tokens,top_k,experts,block_m,with_map", [
    (8192, 8, 512, 16, True), (8191, 8, 512, 128, False), (4099, 8, 128, 16, False), (2053, 10, 60, 64, True),
    (3001, 8, 384, 32, False),
])
def test_moe_align_chunk_loops(rng, monkeypatch, tokens, top_k, experts, block_m, with_map):
    """Thousands of tokens with every loop of the multi-chunk path taken (a program over several one-hot tiles, the
    prefix sum over several steps of chunks, several layout programs): the constants that bound the tiles are
    changed so that the interpreter runs 8192 tokens x top-8 x 512 experts in seconds (its cost is per tile)."""
    from atom_kernels.ops.moe_align import triton as align

    for name, value in (("MAX_TILE_ENTRIES", 1 << 19), ("MAX_CHUNKS", 8), ("PREFIX_TILE_ENTRIES", 64),
                        ("ROWS_PER_PROGRAM", 2048)):
        monkeypatch.setattr(align, name, value)
    p = align.plan(tokens * top_k, experts // 2 if with_map else experts, block_m)
    assert p.chunk_tiles > 1 and p.prefix_steps > 1 and p.tiles > 1
    _check_align(rng, torch.device("cpu"), tokens, top_k, experts, block_m, with_map)


@pytest.mark.parametrize("experts", [128, 256, 512])
def test_moe_align_multi_chunk_compiles_once(monkeypatch, experts):
    """The multi-chunk path launches one variant of each kernel whatever the token count (per expert count, block_m
    and map): the chunk loop and the prefix sum's steps take their trip counts at run time, so a serving batch of a
    new size compiles nothing (qwen3-30b-a3b at batch 64 compiled ``_align_prefix_kernel`` mid-run on an H100)."""
    from atom_kernels.compile_keys import recording
    from atom_kernels.dispatch import ENV_OVERRIDE, triton_interpreting
    from atom_kernels.ops.moe_align import triton as align

    if not triton_interpreting():
        pytest.skip("records the launches Triton's interpreter runs (CPU)")
    monkeypatch.setenv(ENV_OVERRIDE, "triton")
    gen = torch.Generator().manual_seed(0)
    pairs = sorted({align.SINGLE_CHUNK_PAIRS + 1, 264, 300, 513, 1000, 4096, 8191, 8200, 33 * 1024, 65536 + 8,
                    16384 * 8 - 8, 16384 * 8, 16384 * 8 + 8, 32768 * 8, 65536 * 10})
    plans = {align.plan(n, experts, 16) for n in pairs}
    assert all(not p.single for p in plans)
    with recording(launch=False) as keys:
        for n in pairs:
            top_k = 8 if n % 8 == 0 else 1
            ids = torch.randint(0, experts, (n // top_k, top_k), generator=gen, dtype=torch.int32)
            moe_align_block_size(ids, experts, 16)
    kernels = ("_align_count_kernel", "_align_prefix_kernel", "_align_place_kernel")
    assert {k: len(keys[k]) for k in kernels} == dict.fromkeys(kernels, 1), {k: sorted(keys[k]) for k in kernels}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("tokens,top_k,experts", [(16384, 8, 128), (16384, 8, 512), (32768, 8, 128), (32768, 8, 512),
                                                  (65536, 10, 512)])
@pytest.mark.parametrize("block_m", [16, 64, 128])
def test_moe_align_host_size_cuda(rng, tokens, top_k, experts, block_m):
    """The sizes vLLM's profile run sends (max_num_batched_tokens 16384-32768, and 65536 x top-10 for 512 experts),
    with and without an expert map, and captured in a CUDA graph replayed on a new routing."""
    _check_align(rng, "cuda", tokens, top_k, experts, block_m, False)
    ids, emap, local = _check_align(rng, "cuda", tokens, top_k, experts, block_m, True)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: compiles the kernels outside the capture
        moe_align_block_size.call_backend("triton", ids, local, block_m, emap)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = moe_align_block_size.call_backend("triton", ids, local, block_m, emap)
    ids.copy_(torch.randint(0, experts, ids.shape, generator=rng, dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    want = moe_align_block_size.call_backend("reference", ids, local, block_m, emap)
    for g, w in zip(captured, want):
        assert torch.equal(g, w)


# ----------------------------------------------------------------------------------------- fused MoE
def make_moe(rng, device, dtype, tokens, top_k, experts, hidden, inter, *, global_experts=None):
    """Inputs of one fused-MoE call; with ``global_experts`` ids are global and an expert map holds ``experts``."""
    x = randn(tokens, hidden, dtype=dtype, device=device, gen=rng)
    w13 = randn(experts, 2 * inter, hidden, dtype=dtype, device=device, gen=rng, scale=hidden**-0.5)
    w2 = randn(experts, hidden, inter, dtype=dtype, device=device, gen=rng, scale=inter**-0.5)
    total = global_experts or experts
    logits = randn(tokens, total, device=device, gen=rng, scale=2.0)
    weights, ids = topk_routing.call_backend("reference", logits, top_k)
    emap = None
    if global_experts is not None:
        emap, _ = _expert_map(rng, global_experts, experts, device)
    return x, w13, w2, weights, ids, emap


def check_fused_moe(args, dtype, config=None):
    x, w13, w2, weights, ids, emap = args
    out = fused_moe.call_backend("triton", x, w13, w2, weights, ids, expert_map=emap, config=config)
    ref = fused_moe.call_backend("reference", x, w13, w2, weights, ids, expert_map=emap)
    assert out.dtype == x.dtype
    assert_close(out, ref, dtype)
    return out, ref


@pytest.mark.parametrize("dtype,tokens", [(torch.float32, 1), (torch.bfloat16, 1), (torch.float32, 16),
                                          (torch.bfloat16, 16), (torch.float16, 5)])
def test_fused_moe_decode(device, rng, dtype, tokens):
    """Decode batches: most experts receive no token; odd hidden and intermediate sizes."""
    check_fused_moe(make_moe(rng, device, dtype, tokens, 4, 16, 72, 40), dtype, TINY)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("top_k,config", [(1, TINY), (2, TINY_M32), (3, None)])
def test_fused_moe_prefill(device, rng, dtype, top_k, config):
    """More pairs than one alignment chunk (the multi-program path), several row blocks per expert."""
    check_fused_moe(make_moe(rng, device, dtype, 150, top_k, 6, 64, 48), dtype, config)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens,top_k", [(5, 2), (40, 1), (97, 3)])
def test_fused_moe_expert_map(device, rng, dtype, tokens, top_k):
    """Expert parallelism: this rank holds 5 of 12 experts; pairs routed elsewhere contribute zero."""
    args = make_moe(rng, device, dtype, tokens, top_k, 5, 48, 32, global_experts=12)
    check_fused_moe(args, dtype, TINY)
    # the held experts' outputs plus the others' add up to the full layer
    x, w13, w2, weights, ids, emap = args
    held = (emap >= 0).nonzero().flatten()
    full13 = torch.zeros(12, *w13.shape[1:], dtype=dtype, device=device)
    full2 = torch.zeros(12, *w2.shape[1:], dtype=dtype, device=device)
    full13[held], full2[held] = w13, w2
    whole = fused_moe.call_backend("reference", x, full13, full2, weights, ids)
    assert_close(fused_moe.call_backend("triton", x, w13, w2, weights, ids, expert_map=emap, config=TINY), whole, dtype)


def test_fused_moe_no_local_experts(device, rng):
    x, w13, w2, weights, ids, _ = make_moe(rng, device, torch.float32, 6, 2, 3, 32, 16, global_experts=8)
    emap = torch.full((8,), -1, dtype=torch.int32, device=device)
    out = fused_moe.call_backend("triton", x, w13, w2, weights, ids, expert_map=emap, config=TINY)
    assert torch.equal(out.cpu(), torch.zeros(6, 32))


def test_fused_moe_empty_batch(device, rng):
    x, w13, w2, weights, ids, _ = make_moe(rng, device, torch.float32, 0, 2, 4, 32, 16)
    assert fused_moe.call_backend("triton", x, w13, w2, weights, ids).shape == (0, 32)


def test_fused_moe_reference_is_a_per_token_mlp(rng):
    """The specification against the most literal reading of the formula: every token, every choice."""
    x, w13, w2, weights, ids, _ = make_moe(rng, "cpu", torch.float32, 7, 3, 5, 24, 10)
    want = torch.zeros_like(x)
    for t in range(7):
        for j in range(3):
            e = int(ids[t, j])
            gate, up = (w13[e] @ x[t]).chunk(2)
            want[t] += weights[t, j] * (w2[e] @ (F.silu(gate) * up))
    torch.testing.assert_close(fused_moe.call_backend("reference", x, w13, w2, weights, ids), want, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not INTERPRET, reason="imports kernels in interpreter mode: CPU-only check")
def test_quantized_formats_plug_into_the_reference(rng, monkeypatch):
    """The extension point for quantized experts: a registered format is dequantized by the reference,
    and the Triton backend declines formats it has no path for (dispatch falls back)."""
    from atom_kernels import dispatch

    def per_row_int8(weight, scale, quant):
        return weight.float() * scale.float()[:, None]

    register_expert_format("test_per_row_int8", per_row_int8)
    x, w13, w2, weights, ids, _ = make_moe(rng, "cpu", torch.float32, 5, 2, 4, 32, 16)
    q13, q2 = w13.mul(20).round().to(torch.int8), w2.mul(20).round().to(torch.int8)
    s13, s2 = torch.full(w13.shape[:2], 0.05), torch.full(w2.shape[:2], 0.05)
    quant = ExpertQuant("test_per_row_int8", w13_scale=s13, w2_scale=s2)
    got = fused_moe.call_backend("reference", x, q13, q2, weights, ids, quant=quant)
    want = fused_moe.call_backend("reference", x, q13.float() * 0.05, q2.float() * 0.05, weights, ids)
    torch.testing.assert_close(got, want)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv(dispatch.ENV_OVERRIDE, "triton")
    backend, _ = dispatch.OPS["fused_moe"].resolve(x, q13, q2, weights, ids, quant=quant)
    assert backend == "reference"
    backend, _ = dispatch.OPS["fused_moe"].resolve(x, w13, w2, weights, ids)
    assert backend == "triton"


def test_kernel_configs_are_valid():
    for name, candidates in SWEEP.items():
        assert candidates[0] == CONFIGS[name]
        for cfg in candidates:
            assert cfg.block_m >= 16 and cfg.block_m & (cfg.block_m - 1) == 0
            for tile in (cfg.up, cfg.down):
                assert min(tile.block_n, tile.block_k) >= 16
    assert [shape_class(t * 8, 128) for t in (1, 16, 256, 4096)] == ["decode", "decode", "medium", "large"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("tokens", [1, 16, 256, 2048])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_moe_cuda_real_sizes(rng, tokens, dtype):
    """Every shape class's default tiles at sizes the interpreter cannot reach (top-8 of 64 experts)."""
    args = make_moe(rng, "cuda", dtype, tokens, 8, 48, 1024, 384, global_experts=64)
    check_fused_moe(args, dtype)
    x, w13, w2, weights, ids, _ = make_moe(rng, "cuda", dtype, tokens, 8, 64, 1024, 384)
    check_fused_moe((x, w13, w2, weights, ids, None), dtype)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_fused_moe_cuda_graph(rng):
    """Routing, alignment and both GEMMs captured once, replayed on new routings and inputs."""
    x, w13, w2, weights, ids, _ = make_moe(rng, "cuda", torch.bfloat16, 8, 4, 16, 256, 128)
    logits = torch.randn(8, 16, device="cuda")

    def step():
        w, i = topk_routing(logits, 4)
        return fused_moe(x, w13, w2, w, i)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(3):
        logits.copy_(torch.randn(8, 16, device="cuda") * 2)
        x.copy_(torch.randn(8, 256, device="cuda"))
        graph.replay()
        w, i = topk_routing.call_backend("reference", logits, 4)
        assert_close(out, fused_moe.call_backend("reference", x, w13, w2, w, i), torch.bfloat16)


def test_fp32_tiles_fit_shared_memory():
    from atom_kernels.ops.fused_moe.configs import CONFIGS, SHARED_MEMORY_BUDGET, SWEEP, fit_shared_memory

    for cfg in [*CONFIGS.values(), *(c for configs in SWEEP.values() for c in configs)]:
        fitted = fit_shared_memory(cfg, 4)
        for tile, weight_tiles in ((fitted.up, 2), (fitted.down, 1)):
            per_stage = (fitted.block_m * tile.block_k + weight_tiles * tile.block_k * tile.block_n) * 4
            assert tile.num_stages == 1 or tile.num_stages * per_stage <= SHARED_MEMORY_BUDGET
        assert fit_shared_memory(cfg, 2).block_m == cfg.block_m
