"""The small-M (decode) MXFP4 GEMM kernel (``ops/mxfp4_mm/triton_small_m.py``) against the reference:
its PTX decode algorithm code by code, every code and scale of the supported range at every K position,
both MMA arrangements and K orders (C = 1, 2, 4 groups per run), odd N / K tails, M = 1, 3, 16, split-K
with both reductions, poisoned outputs and workspaces, and CUDA-graph capture on a GPU."""

import gc
import weakref

import pytest
import torch
from helpers import assert_close, assert_graph_capturable, every_code_pair_word, randn

from atom_kernels import formats, mxfp4_mm
from atom_kernels.ops.mxfp4_mm import decode, planner
from atom_kernels.ops.mxfp4_mm import triton_small_m as small

CUDA = torch.cuda.is_available()


def _weight(n, k, gen):
    w = randn(n, k, gen=gen, scale=0.05) * torch.rand(n, 1, generator=gen) * 4
    return formats.quantize_mxfp4(w)


def _dtypes(device):
    return [torch.bfloat16] if device.type == "cuda" else [torch.float32, torch.bfloat16]


# ------------------------------------------------------------------------------ the PTX algorithm
def test_decode_pair_bits_every_code_pair():
    """``DECODE_ASM``'s prmt / shift / mask steps (emulated bit by bit) turn codes 2i, 2i+1 of a word into
    the bf16 patterns of ``code * 2**-126`` in the low and high halves, for all 256 code pairs at all 4
    positions (the other codes of the word random)."""
    for pair, byte, word, lo, hi in every_code_pair_word():
        bits = decode.decode_pair_bits(word, pair)
        assert bits & 0xFFFF == lo and bits >> 16 == hi, (pair, byte)


@pytest.mark.parametrize("e", [34, 100, 127, 140, 160])
def test_scale_multiplier_bits(e):
    """The bf16x2 multiplier ``(e + 127 - SHIFT - 1) * 0x00800080`` is ``2**(e - 1 - SHIFT)`` in both halves,
    so a decoded ``code * 2**-126`` times it is ``code * 2**(e - 127) * 2**-SHIFT``, a normal bf16 for every
    nonzero code over the supported scale range 2**-93 .. 2**33 (e = 34 .. 160)."""
    mult = (e + 127 - decode._SHIFT - 1) * 0x00800080
    half = torch.tensor([mult & 0xFFFF], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float().item()
    assert mult >> 16 == mult & 0xFFFF and half == 2.0 ** (e - 1 - decode._SHIFT)
    products = (formats.E2M1_VALUES[1:8] * 2.0**-126 * half).to(torch.bfloat16).float()
    assert torch.equal(products, formats.E2M1_VALUES[1:8] * 2.0 ** (e - 127 - decode._SHIFT))
    assert products.min() >= 2.0**-126 and products.max() < 2.0**127


def test_chunk_groups_and_plan():
    assert [decode.chunk_groups(k) for k in (32, 64, 96, 128, 2880, 8192)] == [1, 2, 1, 4, 2, 4]
    assert decode.chunk_groups(8192, 64) == 2 and decode.chunk_groups(2880, 256) == 2
    p = planner.plan(1, 8192, 8192, torch.device("cpu"), {"block_n": 128, "block_k": 256})
    assert p["split"] * p["k_split"] >= 8192 and p["k_split"] % 256 == 0 and p["c"] == 4
    assert planner.plan(1, 64, 256, torch.device("cpu"), {"block_k": 64})["c"] == 2
    with pytest.raises(ValueError, match="power of two"):
        planner.plan(1, 64, 256, torch.device("cpu"), {"block_k": 96})


# --------------------------------------------------------------------------------- the kernel
CASES = [  # (m, n, k, config override): C = 1 (K 96, 160), 2 (K 320, 2880-like 576), 4 (K 512, 1024)
    (1, 64, 256, {}),
    (1, 100, 96, {"mma": "wgmma", "block_n": 64}),
    (3, 130, 320, {"split_k": 2, "block_k": 128}),
    (3, 72, 576, {"mma": "wgmma", "block_n": 64, "block_k": 128, "split_k": 3}),
    (16, 130, 512, {"split_k": 2, "reduce": "pass"}),
    (16, 64, 1024, {"mma": "wgmma", "block_n": 64, "split_k": 4}),
    (5, 40, 160, {"block_n": 64}),
    (2, 96, 1024, {"block_n": 32, "num_warps": 1, "split_k": 4, "block_k": 128}),
    (1, 64, 512, {"block_k": 64, "mma": "wgmma", "block_n": 64}),  # C = 2 from block_k although K allows 4
    (2, 200, 384, {"block_n": 128, "block_k": 128}),  # two 64-row repeats in mma_rows, ragged N
]


@pytest.mark.parametrize("m,n,k,config", CASES)
def test_small_m_kernel(device, rng, m, n, k, config):
    w, s = _weight(n, k, rng)
    bias = randn(n, gen=rng) if m % 2 else None
    for dtype in _dtypes(device):
        x = randn(m, k, gen=rng, dtype=dtype)
        ref = mxfp4_mm.call_backend("reference", x, w, s, bias)
        out = small.mxfp4_mm_small_m(x.to(device), w.to(device), s.to(device),
                                     bias.to(device) if bias is not None else None, config)
        assert out.shape == (m, n) and out.dtype == dtype
        assert_close(out.cpu(), ref, dtype)


def test_strided_activations(device, rng):
    """Activations whose K is not contiguous (every other column of a wider tensor) and whose rows are
    strided give the same result as a contiguous copy: the small-M kernel directly, and the op's Triton
    backend at 3 and 20 tokens (the warpgroup-MMA kernel above 16)."""
    n, k = 64, 512
    w, s = _weight(n, k, rng)
    for m in (3, 20):
        wide = randn(m, 2 * k + 8, gen=rng, dtype=_dtypes(device)[0])
        for x in (wide[:, : 2 * k : 2], wide[:, 8:k + 8]):
            ref = mxfp4_mm.call_backend("reference", x.contiguous(), w, s)
            out = mxfp4_mm.call_backend("triton", x.to(device), w.to(device), s.to(device))
            assert_close(out.cpu(), ref, x.dtype)
            if m <= planner.SMALL_M_MAX:
                assert_close(small.mxfp4_mm_small_m(x.to(device), w.to(device), s.to(device)).cpu(), ref, x.dtype)


@pytest.mark.parametrize("mma", ["sync", "wgmma"])
@pytest.mark.parametrize("k", [64, 128])  # C = 2 and C = 4 orders
def test_every_code_and_scale_at_every_k(device, rng, mma, k):
    """All 16 codes at every position of a group and scales 2**-93 .. 2**33, read back one K position
    at a time through identity activations: exact (one nonzero product per output)."""
    n = 64
    codes = torch.randint(0, 16, (n, k), generator=rng, dtype=torch.uint8)
    codes[:16, :] = (torch.arange(k)[None, :] + torch.arange(16)[:, None]) % 16  # each code at each k
    w = formats.pack_e2m1(codes)
    s = torch.randint(34, 161, (n, k // 32), generator=rng, dtype=torch.uint8)
    s[0, 0], s[1, -1] = 34, 160
    dense = formats.dequantize_mxfp4(w, s)  # [n, k]
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = {"mma": mma, "block_n": 64, "block_k": 128, "split_k": 1}
    for first in range(0, k, 16):
        x = torch.eye(k, dtype=dtype)[first:first + 16]
        out = small.mxfp4_mm_small_m(x.to(device), w.to(device), s.to(device), None, config)
        want = dense[:, first:first + 16].t().to(dtype)
        torch.testing.assert_close(out.cpu(), want, rtol=0, atol=0)


@pytest.mark.parametrize("reduce", ["in_kernel", "pass"])
def test_poisoned_output_and_workspace(device, rng, reduce):
    """Every output element is written and no stale workspace value is read (both start as NaN)."""
    m, n, k = 3, 100, 512
    w, s = _weight(n, k, rng)
    x = randn(m, k, gen=rng, dtype=_dtypes(device)[0])
    bias = randn(n, gen=rng)
    ref = mxfp4_mm.call_backend("reference", x, w, s, bias)
    config = {"split_k": 4, "block_k": 128, "block_n": 64, "reduce": reduce}
    out = torch.full((m, n), float("nan"), dtype=x.dtype, device=device)
    ws = torch.full((4, m, n), float("nan"), dtype=torch.float32, device=device)
    small.mxfp4_mm_small_m(x.to(device), w.to(device), s.to(device), bias.to(device), config, out=out, workspace=ws)
    assert_close(out.cpu(), ref, x.dtype)


def test_in_kernel_reduction_resets_its_counters(device, rng):
    """Two calls in a row (the second reuses the arrival counters) are both right, and the counters are
    zero afterwards."""
    m, n, k = 2, 130, 1024
    w, s = (t.to(device) for t in _weight(n, k, rng))
    config = {"split_k": 4, "block_k": 128, "block_n": 64, "reduce": "in_kernel"}
    for _ in range(2):
        x = randn(m, k, gen=rng, dtype=_dtypes(device)[0], device=device)
        out = small.mxfp4_mm_small_m(x, w, s, None, config)
        assert_close(out.cpu(), mxfp4_mm.call_backend("reference", x.cpu(), w.cpu(), s.cpu()), x.dtype)
    used = w.device  # the kernel keys its counters by the tensors' device (with its index)
    stream = torch.cuda.current_stream(used).cuda_stream if used.type == "cuda" else 0
    assert int(small._LOCKS[(used.type, used.index, stream)].abs().sum()) == 0


def test_outgrown_lock_buffer_stays_alive():
    """A counter buffer that a larger call replaces stays allocated (a CUDA graph captured with it keeps using its
    address), and the larger call gets a new zeroed buffer that covers it."""
    device = torch.device("cpu")
    key = (device.type, device.index, 0)
    small._LOCKS.pop(key, None)
    first = small._locks(device, 8)
    gone = weakref.ref(first)
    del first
    bigger = small._locks(device, 5000)
    gc.collect()
    assert gone() is not None and gone() is not bigger
    assert bigger.numel() >= 5000 and not bigger.any()
    assert small._locks(device, 16) is bigger  # smaller calls keep the current buffer


def test_sweep_configs_agree(device, rng):
    """Every configuration the bench times computes the same product (a sample in the interpreter)."""
    m, n, k = 2, 256, 512
    w, s = _weight(n, k, rng)
    x = randn(m, k, gen=rng, dtype=torch.bfloat16, device=device)
    ref = mxfp4_mm.call_backend("reference", x.cpu(), w, s)
    configs = planner.SWEEP if device.type == "cuda" else planner.SWEEP[::3]
    for config in configs:
        out = small.mxfp4_mm_small_m(x, w.to(device), s.to(device), None, config)
        assert_close(out.cpu(), ref, torch.bfloat16)


def test_dispatch_picks_small_m_up_to_16_tokens(device, rng):
    """The op's Triton backend runs the small-M kernel up to 16 tokens and the warpgroup-MMA kernel above;
    both match the reference."""
    n, k = 64, 256
    w, s = _weight(n, k, rng)
    for m in (16, 17):
        x = randn(m, k, gen=rng, dtype=torch.bfloat16)
        out = mxfp4_mm.call_backend("triton", x.to(device), w.to(device), s.to(device))
        assert_close(out.cpu(), mxfp4_mm.call_backend("reference", x, w, s), torch.bfloat16)
    with pytest.raises(ValueError, match="at most 16"):
        small.mxfp4_mm_small_m(torch.zeros(17, k), w, s)


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("reduce", ["in_kernel", "pass"])
def test_small_m_cuda_graph_capturable(rng, reduce):
    x = randn(5, 1024, dtype=torch.bfloat16, device="cuda", gen=rng)
    w, s = (t.cuda() for t in _weight(384, 1024, rng))
    bias = randn(384, dtype=torch.bfloat16, device="cuda", gen=rng)
    config = {"split_k": 4, "block_k": 128, "reduce": reduce}
    assert_graph_capturable(lambda: small.mxfp4_mm_small_m(x, w, s, bias, config), x)


# ------------------------------------------------------------- the asynchronous-copy (Gluon) variant
SM90 = CUDA and torch.cuda.get_device_capability()[0] == 9
RING_CASES = [  # (m, n, k, config): bias for odd m; ragged N; 1, 2, 4 splits; 8- and 16-wide MMA; 2-3 stages
    (1, 64, 512, {"split_k": 1}),
    (5, 200, 1024, {"split_k": 2}),
    (16, 130, 2048, {"split_k": 4, "stages": 3}),
    (8, 192, 4096, {"block_n": 128, "block_k": 512, "stages": 2, "split_k": 2}),
    (3, 96, 1536, {"narrow_m": False, "stages": 2, "split_k": 3}),
    (16, 8192, 8192, {}),
    (5, 300, 2048, {"num_warps": 8, "block_n": 128, "split_k": 2}),  # two warpgroups, ragged N
    (16, 256, 1024, {"num_warps": 8, "block_n": 256, "stages": 3, "split_k": 1}),  # two repeats per warpgroup
    (7, 128, 1024, {"pdl": False, "split_k": 2}),  # launched without programmatic dependent launch
    # K parts (on "lanes" weights; the checkpoint order runs one warpgroup per program): ragged N with bias, 2 splits,
    # the 8-wide tile, 2 K steps per part
    (13, 1000, 8192, {"parts": 4}),
    (16, 192, 4096, {"parts": 4, "split_k": 2}),
    (4, 512, 2048, {"parts": 4, "split_k": 1}),
]


def test_ring_applies_only_where_its_kernel_can_run():
    """The Gluon kernel's precondition (a pure function): asked for, sm_90, whole K steps (>= 2) per split,
    K % 128, 256-multiple steps, the in-kernel reduction, 2 or 3 ring slots, 4-byte-copyable activations; anything else falls
    back to the register-load kernel."""
    cpu = torch.device("cpu")

    def applies(k=8192, config=None, stride=8192, address=0, capability=(9, 0)):
        p = planner.plan(4, 256, k, cpu, dict({"loads": "ring"}, **(config or {})))
        return planner.ring_applies(p, k, stride, address, capability)

    assert applies()
    assert not applies(config={"loads": "registers"})
    assert not applies(capability=None) and not applies(capability=(8, 0)) and not applies(capability=(10, 0))
    assert not applies(k=2880) and not applies(k=8192 + 64)  # K % 128
    assert not applies(config={"block_k": 128})
    assert not applies(config={"reduce": "pass"})
    assert not applies(config={"mma": "sync"}) and not applies(config={"num_warps": 8})  # 8 warps: 128-row blocks
    assert applies(config={"num_warps": 8, "block_n": 128}) and not applies(config={"num_warps": 2})
    assert not applies(k=512, config={"split_k": 1, "block_k": 512})  # one K step
    assert not applies(stride=8191) and not applies(address=2)
    assert applies(config={"stages": 3}) and not applies(config={"stages": 4})  # a ring of 2 or 3 slots
    # the checkpoint's byte order: the 8-wide tile only (up to 8 tokens, narrow_m on)
    for m, config, expected in ((8, {}, True), (9, {}, False), (16, {}, False), (4, {"narrow_m": False}, False)):
        p = planner.plan(m, 256, 8192, cpu, dict({"loads": "ring"}, **config), layout="rows")
        assert planner.ring_applies(p, 8192, 8192, 0, (9, 0)) is expected, (m, config)
        p = planner.plan(m, 256, 8192, cpu, dict({"loads": "ring"}, **config), layout="lanes")
        assert planner.ring_applies(p, 8192, 8192, 0, (9, 0)), (m, config)
    for k in (1536, 2304, 8192, 14336):  # the ring plan always splits K into whole steps
        p = planner.plan(1, 8192, k, cpu, {"loads": "ring", "split_k": "auto"})
        assert p["k_split"] * p["split"] == k and p["k_split"] % p["block_k"] == 0, p


@pytest.mark.skipif(not SM90, reason="the Gluon kernel is sm_90 only")
@pytest.mark.parametrize("static_weights", [False, True])
@pytest.mark.parametrize("layout", ["rows", "lanes"])
@pytest.mark.parametrize("m,n,k,config", RING_CASES)
def test_ring_kernel(rng, m, n, k, config, layout, static_weights):
    """Matches the reference (and runs the ring kernel, not the fallback), writing every output element
    (poisoned output and workspace), with the weight in the checkpoint's byte order and in the "lanes" one
    (natural-order activations, 16-byte copies, rows past M zero-filled), its first weight copies issued after or
    before the programmatic-dependent-launch wait (``static_weights``)."""
    config = dict(config, loads="ring")
    w, s = _weight(n, k, rng)
    stored = formats.mxfp4_rows_to_lanes(w) if layout == "lanes" else w
    x = randn(m, k, gen=rng, dtype=torch.bfloat16)
    bias = randn(n, gen=rng, dtype=torch.bfloat16) if m % 2 else None
    p = planner.plan(m, n, k, torch.device("cuda"), config, layout)
    # the checkpoint's byte order takes the ring only with the 8-wide tile (planner.ring_applies)
    serves = layout == "lanes" or planner.ring_tile_tokens(m, config) == 8
    assert planner.ring_applies(p, k, x.stride(0), 0, torch.cuda.get_device_capability()) == serves, p
    ref = mxfp4_mm.call_backend("reference", x, w, s, bias)
    out = torch.full((m, n), float("nan"), dtype=x.dtype, device="cuda")
    ws = torch.full((p["split"], m, n), float("nan"), dtype=torch.float32, device="cuda")
    small.mxfp4_mm_small_m(x.cuda(), stored.cuda(), s.cuda(), bias.cuda() if bias is not None else None, config,
                           out=out, workspace=ws, layout=layout, static_weights=static_weights)
    assert_close(out.cpu(), ref, x.dtype)


@pytest.mark.skipif(not SM90, reason="the Gluon kernel is sm_90 only")
@pytest.mark.parametrize("layout", ["rows", "lanes"])
def test_ring_kernel_every_code_and_scale_exact(layout):
    """All 16 codes at every K position and scales 2**-93 .. 2**33 through identity activations: exact, with the
    weight in the checkpoint's byte order and in the "lanes" one (``formats.mxfp4_rows_to_lanes``)."""
    rng = torch.Generator().manual_seed(5)
    n, k = 64, 512
    codes = torch.randint(0, 16, (n, k), generator=rng, dtype=torch.uint8)
    codes[:16, :] = (torch.arange(k)[None, :] + torch.arange(16)[:, None]) % 16
    w = formats.pack_e2m1(codes)
    s = torch.randint(34, 161, (n, k // 32), generator=rng, dtype=torch.uint8)
    s[0, 0], s[1, -1] = 34, 160
    dense = formats.dequantize_mxfp4(w, s)
    config = {"loads": "ring", "split_k": 1}
    stored = (formats.mxfp4_rows_to_lanes(w) if layout == "lanes" else w).cuda()
    for first in range(0, k, 16):
        x = torch.eye(k, dtype=torch.bfloat16)[first:first + 16]
        out = small.mxfp4_mm_small_m(x.cuda(), stored, s.cuda(), None, config, layout=layout)
        torch.testing.assert_close(out.cpu(), dense[:, first:first + 16].t().to(torch.bfloat16), rtol=0, atol=0)


@pytest.mark.skipif(not SM90, reason="the Gluon kernel is sm_90 only")
def test_ring_kernel_cuda_graph_capturable(rng):
    x = randn(5, 2048, dtype=torch.bfloat16, device="cuda", gen=rng)
    w, s = (t.cuda() for t in _weight(384, 2048, rng))
    bias = randn(384, dtype=torch.bfloat16, device="cuda", gen=rng)
    assert_graph_capturable(lambda: small.mxfp4_mm_small_m(x, w, s, bias, {"loads": "ring", "split_k": 4}), x)
    lanes = formats.mxfp4_rows_to_lanes(w)
    assert_graph_capturable(lambda: small.mxfp4_mm_small_m(x, lanes, s, bias, {"loads": "ring", "parts": 4},
                                                           layout="lanes"), x)


def test_resident_scales_fit():
    """The ring kernel keeps a program's whole scale slice resident when the plan asks for it (the default) and it
    takes at most ``RESIDENT_SCALE_BYTES`` of shared memory; otherwise each step's scales ride in its ring slot."""
    p = planner.plan(1, 8192, 8192, torch.device("cpu"), {"loads": "ring", "split_k": 4})
    assert planner.DEFAULT["resident_scales"] and planner.resident_scales_fit(p)  # 2048 / 32 bytes x 64 rows
    assert not planner.resident_scales_fit(dict(p, resident_scales=False))
    assert planner.resident_scales_fit(dict(p, k_split=8192)) and not planner.resident_scales_fit(dict(p, k_split=16384))
    assert not planner.resident_scales_fit(dict(p, block_n=128, k_split=8192))


def test_wide_tile_split_cap(monkeypatch):
    """Under split_k="auto" the ring kernel's 16-wide tile (9-16 tokens) takes at most ``WIDE_TILE_MAX_SPLIT`` splits
    where its partials are summed one column per thread (N % 16 != 0, or ``vec_sum`` off); with 16-byte partials
    (``vec_sum_applies``) it keeps the auto split (the H200 data in their comments).  The 8-wide tile, the
    register-load kernel and an explicit split are left alone.  (One warpgroup per program: K parts, which the 16-wide
    tile takes by default where the call is one wave, are ``test_k_parts_plan``'s.)"""
    monkeypatch.setattr(planner, "_num_sms", lambda index: 132)  # an H200's SMs, so "auto" picks what it picks there
    monkeypatch.setitem(planner.DEFAULT, "parts", 1)
    gpu = torch.device("cuda", 0)  # (only named: planning touches no GPU)
    assert planner.vec_sum_applies(planner.DEFAULT, 1024) and not planner.vec_sum_applies(planner.DEFAULT, 1000)
    assert not planner.vec_sum_applies(dict(planner.DEFAULT, vec_sum=False), 1024)
    assert planner.plan(16, 1024, 8192, gpu)["split"] == planner.plan(8, 1024, 8192, gpu)["split"] == 16
    assert planner.plan(16, 1000, 8192, gpu)["split"] == planner.plan(9, 1000, 8192, gpu)["split"] == 8
    assert planner.plan(8, 1000, 8192, gpu)["split"] == 16
    assert planner.plan(16, 1024, 8192, gpu, {"vec_sum": False})["split"] == 8
    assert planner.plan(5, 1000, 8192, gpu, {"narrow_m": False})["split"] == 8
    assert planner.plan(16, 1000, 16384, gpu)["split"] == 8 and planner.plan(16, 1024, 16384, gpu)["split"] == 32
    assert planner.plan(16, 8192, 8192, gpu)["split"] == 4  # "auto" under the cap: unchanged
    assert planner.plan(16, 1000, 8192, gpu, {"loads": "registers"})["split"] == 16
    assert planner.plan(16, 1000, 8192, gpu, {"split_k": 16})["split"] == 16


def test_k_parts_plan(monkeypatch):
    """K parts (4 warp-specialized warpgroups per program splitting its K range, sums added in shared memory) are the
    16-wide tile's default on "lanes" weights where the call is one wave of one program per SM and each part has whole K
    steps (>= 2) and its scales resident: then 2 ring slots (``K_PARTS_STAGES``) and no split-K sum where one program
    takes the whole K.  Up to 8 tokens, on checkpoint-order weights, with more column tiles than SMs, or where the scales
    do not fit, one warpgroup per program; an explicit ``parts`` is kept where it can run."""
    monkeypatch.setattr(planner, "_num_sms", lambda index: 132)
    gpu = torch.device("cuda", 0)  # (only named: planning touches no GPU)

    def plan(m, n, k, config=None, layout="lanes"):
        p = planner.plan(m, n, k, gpu, config, layout)
        return p["parts"], p["split"], p["stages"]

    assert planner.DEFAULT["parts"] == "auto" and planner.K_PARTS == 4
    assert plan(16, 8192, 8192) == plan(9, 8192, 8192) == (4, 1, planner.K_PARTS_STAGES)
    assert plan(16, 1024, 16384) == (4, 8, 2) and plan(16, 4096, 8192) == (4, 2, 2)
    assert plan(8, 8192, 8192) == (1, 4, 3) and plan(1, 8192, 8192) == (1, 4, 3)  # the 8-wide tile
    assert plan(16, 8192, 8192, layout="rows")[0] == 1
    assert plan(16, 28672, 8192)[0] == 1  # 448 column tiles: several waves
    assert plan(16, 8192, 16384)[0] == 1  # a program's 16384 / 32 x 64 scale bytes are not resident
    assert plan(16, 8192, 8192, {"parts": 1}) == (1, 4, 3)
    assert plan(8, 8192, 8192, {"parts": 4}) == (4, 1, 2)  # explicit: also on the 8-wide tile
    assert plan(16, 8192, 640, {"parts": 4})[0] == 1  # 3 K steps: not whole parts
    p = planner.plan(16, 8192, 8192, gpu)
    assert planner.ring_applies(p, 8192, 8192, 0, (9, 0)) and p["num_warps"] == 4
    assert not planner.ring_applies(dict(p, num_warps=8), 8192, 8192, 0, (9, 0))
    assert not planner.ring_applies(dict(p, parts=2), 8192, 8192, 0, (9, 0))
    assert not planner.ring_applies(dict(p, block_n=128), 8192, 8192, 0, (9, 0))


def test_ring_stages():
    """The ring is 3 slots deep where each program has at least 8 K steps and, with the 16-wide MMA tile, at most 16
    (beyond, 4 programs no longer fit on an SM; the H200 data in ``DEEP_RING``'s comment), else 2; a configuration that
    names its stages keeps them."""
    assert planner.ring_stages(8, 8) == 3 and planner.ring_stages(8, 32) == 3
    assert planner.ring_stages(16, 8) == 3 and planner.ring_stages(16, 16) == 3
    assert planner.ring_stages(8, 7) == 2 and planner.ring_stages(16, 7) == 2 and planner.ring_stages(16, 17) == 2
    assert planner.ring_stages(16, 8, lanes=False) == 2 and planner.ring_stages(8, 8, lanes=False) == 3
    cpu = torch.device("cpu")
    assert planner.DEFAULT["stages"] == "auto"
    assert planner.plan(1, 8192, 8192, cpu, {"split_k": 4})["stages"] == 3  # 8 steps of 256
    assert planner.plan(8, 8192, 8192, cpu, {"split_k": 8})["stages"] == 2  # 4 steps
    assert planner.plan(16, 8192, 8192, cpu, {"split_k": 4})["stages"] == 3  # 16-wide tile, 8 steps
    assert planner.plan(16, 8192, 8192, cpu, {"split_k": 4}, "rows")["stages"] == 2  # checkpoint order: no resident scales
    assert planner.plan(16, 8192, 8192, cpu, {"split_k": 1})["stages"] == 2  # 16-wide tile, 32 steps
    assert planner.plan(5, 8192, 8192, cpu, {"split_k": 1})["stages"] == 3  # 8-wide tile, 32 steps
    assert planner.plan(5, 8192, 8192, cpu, {"split_k": 1, "narrow_m": False})["stages"] == 2  # 16-wide
    assert planner.plan(1, 8192, 8192, cpu, {"split_k": 4, "stages": 2})["stages"] == 2


@pytest.mark.skipif(not SM90, reason="the Gluon kernel is sm_90 only")
@pytest.mark.parametrize("m,n,k,config", [(16, 1024, 8192, {}), (12, 2048, 8192, {"split_k": 16}), (1, 8192, 8192, {}),
                                          (8, 512, 8192, {"split_k": 16}), (16, 1024, 16384, {"split_k": 32}),
                                          (13, 640, 2048, {"num_warps": 8, "block_n": 128, "split_k": 4}),
                                          (16, 256, 1024, {"split_k": 1})])
def test_vec_sum_equals_column_sum(rng, m, n, k, config):
    """Split-K partials stored and summed 16 bytes per thread (``vec_sum``, the default where N % 16 == 0) give bitwise
    the outputs of one column per thread, at the same split, with bias and "lanes" weights, and match the reference."""
    w, s = _weight(n, k, rng)
    x = randn(m, k, gen=rng).to(torch.bfloat16)
    bias = randn(n, gen=rng).to(torch.bfloat16)
    ref = mxfp4_mm.call_backend("reference", x, w, s, bias)
    lanes = formats.mxfp4_rows_to_lanes(w).cuda()
    x, s, bias = x.cuda(), s.cuda(), bias.cuda()
    assert planner.ring_serves(x, n, config) and planner.vec_sum_applies(planner.plan(m, n, k, x.device, config), n)
    config = dict(config, split_k=planner.plan(m, n, k, x.device, config)["split"])  # the same split both ways
    outs = [small.mxfp4_mm_small_m(x, lanes, s, bias, dict(config, vec_sum=vec), layout="lanes") for vec in (True, False)]
    assert torch.equal(outs[0], outs[1])
    assert_close(outs[0].cpu(), ref, torch.bfloat16)


@pytest.mark.skipif(not SM90, reason="the Gluon kernel is sm_90 only")
@pytest.mark.parametrize("m,n,k", [(16, 8192, 8192), (11, 1000, 2048), (3, 640, 4096)])
def test_k_parts_equal_split_k(rng, m, n, k):
    """One program of 4 K parts per column tile (their sums added in shared memory, in part order) gives bitwise the
    outputs of 4 one-warpgroup programs splitting K the same way (their partials added through global memory, in split
    order), with bias, ragged N and both MMA widths, and matches the reference."""
    w, s = _weight(n, k, rng)
    x = randn(m, k, gen=rng, dtype=torch.bfloat16)
    bias = randn(n, gen=rng, dtype=torch.bfloat16)
    ref = mxfp4_mm.call_backend("reference", x, w, s, bias)
    lanes, x, s, bias = formats.mxfp4_rows_to_lanes(w).cuda(), x.cuda(), s.cuda(), bias.cuda()
    parts, split = {"loads": "ring", "parts": 4, "split_k": 1}, {"loads": "ring", "parts": 1, "split_k": 4}
    assert planner.plan(m, n, k, x.device, parts)["parts"] == 4 and planner.ring_serves(x, n, parts)
    outs = [small.mxfp4_mm_small_m(x, lanes, s, bias, config, layout="lanes", static_weights=True)
            for config in (parts, split)]
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    assert_close(outs[0].cpu(), ref, x.dtype)


@pytest.mark.skipif(not SM90, reason="the Gluon kernel is sm_90 only")
@pytest.mark.parametrize("static_weights", [False, True])
@pytest.mark.parametrize("m,n,k,config", [(1, 8192, 8192, {}), (5, 1000, 4096, {}), (16, 640, 2048, {"split_k": 2}),
                                          (9, 2944, 16384, {}), (13, 384, 4096, {"num_warps": 8, "block_n": 128})])
def test_resident_scales_equal_ring_slot_scales(rng, m, n, k, config, static_weights):
    """Weights in the "lanes" order with the scales resident (copied once per program) give bitwise the outputs of
    the same kernel copying each step's scales into its ring slot (one warpgroup per program: K parts read resident
    scales only, ``test_k_parts_equal_split_k``)."""
    w, s = (t.cuda() for t in _weight(n, k, rng))
    lanes = formats.mxfp4_rows_to_lanes(w)
    x = randn(m, k, gen=rng, dtype=torch.bfloat16, device="cuda")
    bias = randn(n, gen=rng, dtype=torch.bfloat16, device="cuda")
    config = dict(config, loads="ring", parts=1)
    assert planner.ring_serves(x, n, config) and planner.resident_scales_fit(planner.plan(m, n, k, x.device, config))
    outs = [small.mxfp4_mm_small_m(x, lanes, s, bias, dict(config, resident_scales=resident), layout="lanes",
                                   static_weights=static_weights) for resident in (True, False)]
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    assert_close(outs[0].cpu(), mxfp4_mm.call_backend("reference", x.cpu(), w.cpu(), s.cpu(), bias.cpu()), x.dtype)
