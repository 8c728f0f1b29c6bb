"""The ops of a forward at the token counts a host sends (GPU only; select them with ``-k host_size``).

vLLM profiles a model by running one forward of ``max_num_batched_tokens`` tokens (8192-32768; 16384 by default)
with up to ``max_num_seqs`` sequences, and chunked prefill sends the same sizes.  Each test runs one op at 16384 and
32768 tokens (and some at 65536) against its torch reference: grids whose programs grow with the tokens must stay on
axis 0 (axes 1 and 2 stop at 65535), offsets that pass 2**31 elements must be int64 (the ``past_2gi`` cases are
sized so that they do), and per-program tiles must not grow with the tokens (``moe_align``'s did: see test_moe.py's
``test_moe_align_host_size_cuda``).  Hidden sizes are the models' where the reference stays fast, smaller where it
would not (the per-token GDN recurrence), and the real Qwen3-30B-A3B MoE shape (E=128, k=8, H=2048, I=768, bf16)
runs at 16384 tokens.
"""

import pytest
import torch
from helpers import REL_TOL

from atom_kernels import (
    causal_conv1d,
    chunk_gated_delta_rule,
    formats,
    fp8_block_mm,
    fp8_scaled_mm,
    fused_moe,
    mla_decode,
    mrope,
    mxfp4_mm,
    paged_attention,
    quant_fp8,
    rms_norm,
    rms_norm_gated,
    rotary_embedding,
    silu_and_mul,
    topk_routing,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="host-size tests need a GPU")
DEV = "cuda"
BF16 = torch.bfloat16
HOST_TOKENS = [16384, 32768]
TWO_GI = 2**31


@pytest.fixture(autouse=True)
def _free_memory():
    yield
    torch.cuda.empty_cache()


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def assert_close(out, ref, dtype=None, tol=None):
    """``helpers.assert_close`` computed on the GPU in slices (that one copies both tensors to the CPU in float64:
    tens of GB here)."""
    assert out.shape == ref.shape, (out.shape, ref.shape)
    bound = tol if tol is not None else REL_TOL[dtype or ref.dtype]
    o, r = out.reshape(-1), ref.reshape(-1)
    diff = norm = torch.zeros((), dtype=torch.float64, device=o.device)
    step = 1 << 26
    for i in range(0, o.numel(), step):
        oi, ri = o[i : i + step].double(), r[i : i + step].double()
        assert torch.isfinite(oi).all(), "non-finite output"
        diff = diff + (oi - ri).square().sum()
        norm = norm + ri.square().sum()
    err = (diff.sqrt() / norm.sqrt().clamp_min(1e-30)).item()
    assert err <= bound, f"relative error {err:.3e} > {bound:.1e}"


def cuda_randn(*shape, dtype=torch.float32, scale=1.0, seed=0):
    """Random normal values drawn on the GPU (CPU draws of gigabytes are slow)."""
    g = torch.Generator(device=DEV).manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=DEV, dtype=torch.float32) * scale).to(dtype)


# ------------------------------------------------------------------------------------ dense per-token ops
@pytest.mark.parametrize("tokens,hidden", [(16384, 4096), (32768, 7168), (65536, 32800)],
                         ids=["16k", "32k", "64k-past_2gi"])
def test_rms_norm_host_size(tokens, hidden):
    x = cuda_randn(tokens, hidden, dtype=BF16)
    res = cuda_randn(tokens, hidden, dtype=BF16, seed=1) if x.numel() < TWO_GI else None
    w = cuda_randn(hidden, dtype=BF16, seed=2)
    out = rms_norm.call_backend("triton", x, w, 1e-6, res)
    ref = rms_norm.call_backend("reference", x, w, 1e-6, res)
    for o, r in zip(out if res is not None else (out,), ref if res is not None else (ref,)):
        assert_close(o, r, BF16)
    if x.numel() >= TWO_GI:  # the rows past 2**31 elements: compared apart (assert_close's norm hides a few rows)
        assert_close(out[-8:], ref[-8:], BF16)


@pytest.mark.parametrize("tokens,inter", [(16384, 6144), (32768, 12288), (65536, 18944)],
                         ids=["16k", "32k", "64k-past_2gi"])
def test_silu_and_mul_host_size(tokens, inter):
    x = cuda_randn(tokens, 2 * inter, dtype=BF16)
    out = silu_and_mul.call_backend("triton", x)
    ref = silu_and_mul.call_backend("reference", x)
    assert_close(out, ref, BF16)
    assert_close(out[-8:], ref[-8:], BF16)


@pytest.mark.parametrize("tokens", HOST_TOKENS)
@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_embedding_host_size(tokens, is_neox):
    heads, kv_heads, head_size, max_pos = 32, 8, 128, 40960
    cache = cuda_randn(max_pos, head_size)
    positions = torch.randint(0, max_pos, (tokens,), generator=gen(), dtype=torch.int64).to(DEV)
    qkv = cuda_randn(tokens, (heads + 2 * kv_heads) * head_size, dtype=BF16, seed=1)
    outs = {}
    for backend in ("reference", "triton"):
        buf = qkv.clone()
        q, k, _ = buf.split([heads * head_size, kv_heads * head_size, kv_heads * head_size], dim=-1)
        rotary_embedding.call_backend(backend, positions, q, k, cache, head_size, is_neox)
        outs[backend] = buf
    assert_close(outs["triton"], outs["reference"], BF16)


@pytest.mark.parametrize("tokens", HOST_TOKENS)
@pytest.mark.parametrize("fused_norm", [False, True])
def test_mrope_host_size(tokens, fused_norm):
    """Qwen3-VL's heads (32 q, 4 kv of 128, interleaved [24, 20, 20]); with the fused q/k RMSNorm."""
    heads, kv_heads, head_size, max_pos = 32, 4, 128, 65536
    cache = cuda_randn(max_pos, head_size)
    positions = torch.randint(0, max_pos, (3, tokens), generator=gen(), dtype=torch.int64).to(DEV)
    qkv = cuda_randn(tokens, (heads + 2 * kv_heads) * head_size, dtype=BF16, seed=1)
    norm = dict(q_weight=cuda_randn(head_size, dtype=BF16, seed=2), k_weight=cuda_randn(head_size, dtype=BF16, seed=3),
                eps=1e-6) if fused_norm else {}
    outs = {}
    for backend in ("reference", "triton"):
        buf = qkv.clone()
        q, k, _ = buf.split([heads * head_size, kv_heads * head_size, kv_heads * head_size], dim=-1)
        mrope.call_backend(backend, positions, q, k, cache, head_size, (24, 20, 20), True, **norm)
        outs[backend] = buf
    assert_close(outs["triton"], outs["reference"], BF16)


@pytest.mark.parametrize("tokens", HOST_TOKENS)
@pytest.mark.parametrize("shape", ["softmax-128-top8", "softmax-512-top10", "grouped-256-top8"])
def test_topk_routing_host_size(tokens, shape):
    if shape == "grouped-256-top8":  # DeepSeek-V3: sigmoid, correction bias, 8 groups, 4 kept, scaled
        experts, top_k = 256, 8
        kw = dict(scoring="sigmoid", correction_bias=cuda_randn(experts, scale=0.1, seed=1), n_group=8, topk_group=4,
                  routed_scaling_factor=2.5)
    else:
        experts, top_k = (128, 8) if shape == "softmax-128-top8" else (512, 10)
        kw = {}
    # distinct logits per token (which expert wins a tie is not part of the contract)
    logits = (torch.rand(tokens, experts, device=DEV).argsort(-1).float() - experts / 2) / 8
    w, ids = topk_routing.call_backend("triton", logits, top_k, **kw)
    w_ref, ids_ref = topk_routing.call_backend("reference", logits, top_k, **kw)
    ids, order = ids.long().sort(-1)
    ids_ref, order_ref = ids_ref.long().sort(-1)
    assert torch.equal(ids, ids_ref)
    torch.testing.assert_close(w.gather(1, order), w_ref.gather(1, order_ref), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------ MoE
def _moe_inputs(tokens, top_k, experts, hidden, inter, *, global_experts=None, seed=0):
    x = cuda_randn(tokens, hidden, dtype=BF16, seed=seed)
    w13 = cuda_randn(experts, 2 * inter, hidden, dtype=BF16, scale=hidden**-0.5, seed=seed + 1)
    w2 = cuda_randn(experts, hidden, inter, dtype=BF16, scale=inter**-0.5, seed=seed + 2)
    logits = cuda_randn(tokens, global_experts or experts, scale=2.0, seed=seed + 3)
    weights, ids = topk_routing.call_backend("triton", logits, top_k)
    emap = None
    if global_experts is not None:  # expert parallelism: hold `experts` of them, local ids ascending
        held = torch.randperm(global_experts, generator=gen(seed))[:experts].sort().values
        emap = torch.full((global_experts,), -1, dtype=torch.int32)
        emap[held] = torch.arange(experts, dtype=torch.int32)
        emap = emap.to(DEV)
    return x, w13, w2, weights, ids, emap


def _check_moe(args, quant=None, tol=None):
    x, w13, w2, weights, ids, emap = args
    out = fused_moe.call_backend("triton", x, w13, w2, weights, ids, expert_map=emap, quant=quant)
    ref = fused_moe.call_backend("reference", x, w13, w2, weights, ids, expert_map=emap, quant=quant)
    assert out.dtype == x.dtype and out.shape == x.shape
    assert_close(out, ref, BF16, tol=tol)
    assert_close(out[-16:], ref[-16:], BF16, tol=tol)


@pytest.mark.parametrize("tokens", HOST_TOKENS)
def test_fused_moe_qwen3_30b_a3b_host_size(tokens):
    """Qwen3-30B-A3B's MoE layer: 128 experts, top-8, hidden 2048, intermediate 768, bf16 (the shape whose
    16384-token profile run failed in moe_align)."""
    _check_moe(_moe_inputs(tokens, 8, 128, 2048, 768))


@pytest.mark.parametrize("tokens", HOST_TOKENS)
def test_fused_moe_512_experts_host_size(tokens):
    """Qwen3-Next / Qwen3.5-MoE proportions: 512 experts, top-10, hidden 2048, intermediate 512; and with an
    expert map holding 128 of them (expert parallelism)."""
    _check_moe(_moe_inputs(tokens, 10, 512, 2048, 512))
    _check_moe(_moe_inputs(tokens, 10, 128, 2048, 512, global_experts=512, seed=10))


def test_fused_moe_past_2gi_host_size():
    """65536 tokens x top-8 x hidden 7168 (DeepSeek-V3's): the per-pair output rows reach 3.8e9 elements, past 2**31
    (int64 offsets in the down GEMM and the sum over k)."""
    tokens, top_k, hidden = 65536, 8, 7168
    assert tokens * top_k * hidden > TWO_GI
    _check_moe(_moe_inputs(tokens, top_k, 64, hidden, 256))


def _quantize_experts(w13, w2, fmt):
    from atom_kernels import ExpertQuant

    if fmt == "fp8-block":
        experts, two_inter, hidden = w13.shape
        inter = two_inter // 2
        q13, s13 = zip(*(formats.quantize_fp8_blocks(w.float()) for w in w13.reshape(-1, inter, hidden)))
        q2, s2 = zip(*(formats.quantize_fp8_blocks(w.float()) for w in w2))
        q13 = torch.stack(q13).reshape(experts, two_inter, hidden)
        s13 = torch.stack(s13).reshape(experts, -1, s13[0].shape[1])
        return q13, torch.stack(q2), ExpertQuant("fp8-block", s13, torch.stack(s2), (128, 128), torch.float8_e4m3fn)
    p13, e13 = formats.quantize_mxfp4(w13.float())
    p2, e2 = formats.quantize_mxfp4(w2.float())
    return p13, p2, ExpertQuant("mxfp4", e13, e2)


@pytest.mark.parametrize("tokens", HOST_TOKENS)
@pytest.mark.parametrize("fmt", ["fp8-block", "mxfp4"])
def test_fused_moe_quantized_host_size(tokens, fmt):
    """The quantized expert kernels (``triton_quant``) at Qwen3-30B-A3B's shape (I = 768 = 6 x 128)."""
    x, w13, w2, weights, ids, emap = _moe_inputs(tokens, 8, 128, 2048, 768)
    q13, q2, quant = _quantize_experts(w13, w2, fmt)
    _check_moe((x, q13, q2, weights, ids, emap), quant=quant, tol=4e-2 if fmt == "fp8-block" else 2e-2)


# ------------------------------------------------------------------------------------ quantization and GEMMs
@pytest.mark.parametrize("tokens", HOST_TOKENS)
@pytest.mark.parametrize("group", [None, 128])
def test_quant_fp8_host_size(tokens, group):
    x = cuda_randn(tokens, 7168, dtype=BF16, scale=4.0)
    q, s = quant_fp8.call_backend("triton", x, group)
    rq, rs = quant_fp8.call_backend("reference", x.cpu(), group)  # bit-exact, as test_quant_ops checks it
    assert torch.equal(s.cpu(), rs)
    assert torch.equal(q.view(torch.uint8).cpu(), rq.view(torch.uint8))


@pytest.mark.parametrize("tokens", HOST_TOKENS)
@pytest.mark.parametrize("blockwise", [False, True], ids=["rowwise", "block"])
def test_fp8_mm_host_size(tokens, blockwise):
    n, k = 4096, 2048
    a, b = cuda_randn(tokens, k, scale=3.0), cuda_randn(n, k, scale=0.05, seed=1)
    if blockwise:
        aq, asc = formats.quantize_fp8_per_group(a, 128)
        bq, bsc = formats.quantize_fp8_blocks(b, (128, 128))
        out = fp8_block_mm.call_backend("triton", aq, asc, bq, bsc, (128, 128), None, BF16)
        ref = fp8_block_mm.call_backend("reference", aq, asc, bq, bsc, (128, 128), None, BF16)
    else:
        aq, asc = formats.quantize_fp8_per_row(a)
        bq, bsc = formats.quantize_fp8_per_row(b)
        out = fp8_scaled_mm.call_backend("triton", aq, asc, bq, bsc, None, BF16)
        ref = fp8_scaled_mm.call_backend("reference", aq, asc, bq, bsc, None, BF16)
    assert_close(out, ref, BF16)


def test_fp8_scaled_mm_past_2gi_host_size():
    """A [65536, 33024] output: 2.16e9 elements, past 2**31 (int64 output offsets)."""
    m, n, k = 65536, 33024, 256
    assert m * n > TWO_GI
    aq, asc = formats.quantize_fp8_per_row(cuda_randn(m, k, scale=3.0))
    bq, bsc = formats.quantize_fp8_per_row(cuda_randn(n, k, scale=0.05, seed=1))
    out = fp8_scaled_mm.call_backend("triton", aq, asc, bq, bsc, None, BF16)
    ref = fp8_scaled_mm.call_backend("reference", aq, asc, bq, bsc, None, BF16)
    assert_close(out[-64:], ref[-64:], BF16)
    assert_close(out[:64], ref[:64], BF16)
    del ref
    torch.cuda.empty_cache()


@pytest.mark.parametrize("tokens", HOST_TOKENS)
def test_mxfp4_mm_host_size(tokens):
    n, k = 2048, 2048
    w, s = formats.quantize_mxfp4(cuda_randn(n, k, scale=0.05))
    x = cuda_randn(tokens, k, dtype=BF16, seed=1)
    out = mxfp4_mm.call_backend("triton", x, w, s)
    ref = mxfp4_mm.call_backend("reference", x, w, s)
    assert_close(out, ref, BF16)


# ------------------------------------------------------------------------------------ GDN layers
def _packed(lens):
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    return cu, int(cu[-1])


@pytest.mark.parametrize("tokens", HOST_TOKENS)
@pytest.mark.parametrize("num_seqs", [3, 1024])
def test_causal_conv1d_host_size(tokens, num_seqs):
    """Qwen3-Next's conv (8192 channels, width 4), over a few long sequences and over vLLM's 1024 profile ones."""
    dim, width = 8192, 4
    lens = [tokens // num_seqs] * num_seqs
    lens[0] += tokens - sum(lens)
    cu, T = _packed(lens)
    x = cuda_randn(T, dim, dtype=BF16)
    weight = cuda_randn(dim, width, dtype=BF16, seed=1)
    bias = cuda_randn(dim, dtype=BF16, seed=2)
    pool = cuda_randn(num_seqs + 1, width - 1, dim, dtype=BF16, seed=3).transpose(1, 2)
    slots = torch.arange(1, num_seqs + 1, device=DEV)
    init = torch.arange(num_seqs, device=DEV) % 2 == 0
    outs = []
    for backend in ("reference", "triton"):
        state = pool.clone()
        outs.append((causal_conv1d.call_backend(backend, x, weight, bias, state, cu, slots, init), state))
    (o_ref, s_ref), (o, s) = outs
    assert_close(o, o_ref, BF16)
    assert_close(s, s_ref, BF16)


def _gdn_case(lens, H, HV, K, V, seed=0):
    from atom_kernels.gdn import V_MAJOR, ssm_state_shape

    cu, T = _packed(lens)
    packed = cuda_randn(T, 2 * H * K + HV * V, dtype=BF16, seed=seed)
    q = packed[:, : H * K].view(T, H, K)
    k = packed[:, H * K : 2 * H * K].view(T, H, K)
    v = packed[:, 2 * H * K :].view(T, HV, V)
    ab = cuda_randn(T, 2 * HV, dtype=BF16, seed=seed + 1)
    b, a = ab[:, :HV], ab[:, HV:] - 1.0
    A_log = torch.empty(HV).uniform_(0.05, 0.6, generator=gen(seed)).log().to(DEV)
    dt_bias = cuda_randn(HV, scale=0.5, seed=seed + 2)
    n = len(lens)
    pool = cuda_randn(n + 1, *ssm_state_shape(V_MAJOR, HV, K, V), scale=0.3, seed=seed + 3)
    slots = torch.arange(1, n + 1, device=DEV)
    init = torch.arange(n, device=DEV) % 2 == 0
    return (q, k, v, a, b, A_log, dt_bias), pool, cu, slots, init


def _check_gdn(lens, H, HV, K, V):
    from atom_kernels.gdn import V_MAJOR

    inputs, pool, cu, slots, init = _gdn_case(lens, H, HV, K, V)
    outs = []
    for backend in ("reference", "triton"):
        state = pool.clone()
        outs.append((chunk_gated_delta_rule.call_backend(backend, *inputs, state, cu, slots, init, state_layout=V_MAJOR),
                     state))
    (o_ref, s_ref), (o, s) = outs
    assert_close(o, o_ref, BF16)
    assert_close(s, s_ref, tol=2e-2)


@pytest.mark.parametrize("tokens", HOST_TOKENS)
def test_chunk_gated_delta_rule_host_size(tokens):
    """Head dims of Qwen3-Next (K=V=128, HV=2H) with fewer heads (the reference steps token by token), over two
    sequences of host size."""
    _check_gdn([tokens - 1000, 1000], 2, 4, 128, 128)


def test_chunk_gated_delta_rule_many_sequences_host_size():
    """2048 sequences x 32 value heads (Qwen3-Next's): 65536 (sequence, head) programs of the sequential state pass,
    past the 65535 a grid's axis 1 can hold (the kernel keeps them on axis 0)."""
    _check_gdn([8] * 2048, 16, 32, 128, 128)


@pytest.mark.parametrize("tokens", HOST_TOKENS)
def test_rms_norm_gated_host_size(tokens):
    """GDN's output norm over Qwen3-Next's 32 value heads of 128."""
    x = cuda_randn(tokens, 32, 128, dtype=BF16)
    z = cuda_randn(tokens, 32, 256, dtype=BF16, seed=1)[..., :128]  # strided, as the layer passes z
    w = cuda_randn(128, dtype=BF16, seed=2)
    assert_close(rms_norm_gated.call_backend("triton", x, z, w, 1e-6),
                 rms_norm_gated.call_backend("reference", x, z, w, 1e-6), BF16)


# ------------------------------------------------------------------------------------ attention decode
@pytest.mark.parametrize("heads", [16, 128])
def test_mla_decode_host_size(heads):
    """DeepSeek-V3's latent decode at vLLM's max_num_seqs (256 rows) with ragged contexts up to 8k, 48 padding rows,
    page 64 with scattered blocks and -1 past each sequence: grid axis 0 holds 256 x head groups programs."""
    batch, page, dim, latent = 256, 64, 576, 512
    lens = torch.randint(1, 8192, (batch,), generator=gen(0))
    lens[-48:] = 0
    pages = (lens + page - 1) // page
    num_blocks = int(pages.sum()) + 16
    ids = torch.randperm(num_blocks, generator=gen(1)).split([*pages.tolist(), 16])  # 16 blocks nobody owns
    table = torch.full((batch, 8192 // page), -1, dtype=torch.int32)
    for b, blocks in enumerate(ids[:batch]):
        table[b, : len(blocks)] = blocks.int()
    q = cuda_randn(batch, heads, dim, dtype=BF16)
    cache = cuda_randn(num_blocks, page, dim, dtype=BF16, seed=1)
    args = (q, cache, table.to(DEV), lens.int().to(DEV), (128 + 64) ** -0.5, latent)
    out = mla_decode.call_backend("triton", *args)
    assert (out[-48:] == 0).all()
    assert_close(out, mla_decode.call_backend("reference", *args), BF16)


@pytest.mark.parametrize("tokens", HOST_TOKENS)
def test_paged_attention_host_size(tokens):
    """A chunked-prefill step of ``tokens`` queries: sequences of 2048 new tokens after 1024 cached ones, gpt-oss's
    64 heads over 8 kv heads of 64 with sinks and a 128-token window, page 16 with scattered blocks: grid axis 0 holds
    one program per 64-row tile (8 queries x 8 heads), ``tokens / 8 + B`` of them."""
    page, new, context = 16, 2048, 3072
    batch = tokens // new
    blocks = context // page
    table = torch.randperm(batch * blocks, generator=gen(0)).view(batch, blocks).int().to(DEV)
    k_cache = cuda_randn(batch * blocks, page, 8, 64, dtype=BF16)
    v_cache = cuda_randn(batch * blocks, page, 8, 64, dtype=BF16, seed=1)
    q = cuda_randn(tokens, 64, 64, dtype=BF16, seed=2)
    qsl = torch.arange(0, tokens + 1, new, dtype=torch.int32, device=DEV)
    lens = torch.full((batch,), context, dtype=torch.int32, device=DEV)
    args = (q, k_cache, v_cache, table, lens, qsl, 0.125)
    kwargs = dict(sliding_window=128, sinks=cuda_randn(64, seed=3))
    out = paged_attention.call_backend("triton", *args, **kwargs)
    assert_close(out, paged_attention.call_backend("reference", *args, **kwargs), BF16)
