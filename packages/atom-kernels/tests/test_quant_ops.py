"""Triton kernels of the quantization ops against their torch references (CPU: Triton's interpreter;
on a GPU the same tests check the compiled kernels, the cuBLASLt path and CUDA-graph capture)."""

import pytest
import torch
from helpers import assert_close, assert_graph_capturable, randn

from atom_kernels import dispatch, formats, fp8_block_mm, fp8_scaled_mm, mxfp4_mm, quant_fp8
from atom_kernels.ops.mxfp4_mm import triton as mxfp4_triton

CUDA = torch.cuda.is_available()
# The FP8 GEMMs see identical fp8 inputs; kernel and reference differ only in summation order.
GEMM_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _act(rows, k, dtype, device, gen, scale=4.0):
    x = randn(rows, k, dtype=torch.float32, gen=gen, scale=scale)
    x[0, : min(k, 3)] = torch.tensor([125.0, -31.5, 1e-4])[: min(k, 3)]  # values whose rounding carries
    return x.to(dtype=dtype, device=device)


def _same_codes(a, b):
    assert torch.equal(a.view(torch.uint8).cpu(), b.view(torch.uint8).cpu()), "fp8 codes differ"


# ------------------------------------------------------------------------------------ quant_fp8
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,group", [((1, 8), None), ((7, 300), None), ((2, 3, 130), 128), ((5, 1000), 64),
                                         ((3, 96), 128), ((2, 9000), None)])
def test_quant_fp8_dynamic(device, rng, dtype, shape, group):
    rows = 1
    for size in shape[:-1]:
        rows *= size
    x = _act(rows, shape[-1], dtype, device, rng).reshape(shape)
    q, s = quant_fp8.call_backend("triton", x, group)
    rq, rs = quant_fp8.call_backend("reference", x.cpu(), group)
    assert q.shape == x.shape and s.shape == rs.shape
    assert torch.equal(s.cpu(), rs)  # bit-exact scales and codes (the kernel rounds like cvt.rn / .to)
    _same_codes(q, rq)


def test_quant_fp8_static_and_zero_rows(device, rng):
    x = _act(6, 77, torch.bfloat16, device, rng)
    x[2] = 0
    scale = torch.tensor([0.013], device=device)
    q, s = quant_fp8.call_backend("triton", x, None, scale)
    rq, rs = quant_fp8.call_backend("reference", x.cpu(), None, scale.cpu())
    assert s.shape == (6, 1) and torch.equal(s.cpu(), rs)
    _same_codes(q, rq)
    q, s = quant_fp8.call_backend("triton", x)
    assert torch.isfinite(s).all() and q[2].float().abs().sum() == 0


def test_quant_fp8_empty(device):
    q, s = quant_fp8.call_backend("triton", torch.empty(0, 64, device=device), 128)
    assert q.shape == (0, 64) and s.shape == (0, 1)


# ---------------------------------------------------------------------------------- FP8 GEMMs
FP8_CASES = [  # (m, n, k, config override)
    (1, 200, 256, None), (5, 96, 300, None), (40, 64, 128, None), (70, 130, 256, None),
    (3, 256, 512, {"split_k": 2}), (33, 130, 384, {"swap": False, "block_p": 32, "block_q": 32, "block_k": 128}),
    (9, 72, 256, {"swap": True, "block_p": 64, "block_q": 16, "block_k": 128, "split_k": 3}),
]


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n,k,config", FP8_CASES)
def test_fp8_scaled_mm(device, rng, out_dtype, m, n, k, config):
    aq, asc = formats.quantize_fp8_per_row(randn(m, k, gen=rng, scale=3.0))
    bq, bsc = formats.quantize_fp8_per_row(randn(n, k, gen=rng, scale=0.05))
    bias = randn(n, gen=rng)
    ref = fp8_scaled_mm.call_backend("reference", aq, asc, bq, bsc, bias, out_dtype)
    args = [t.to(device) for t in (aq, asc, bq, bsc, bias)]
    out = fp8_scaled_mm.call_backend("triton", *args, out_dtype, config=config)
    assert_close(out.cpu(), ref, tol=GEMM_TOL[out_dtype])


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,n,k,config", FP8_CASES)
def test_fp8_block_mm(device, rng, out_dtype, m, n, k, config):
    aq, asc = formats.quantize_fp8_per_group(randn(m, k, gen=rng, scale=3.0), 128)
    bq, bsc = formats.quantize_fp8_blocks(randn(n, k, gen=rng, scale=0.05), (128, 128))
    bias = randn(n, gen=rng) if m % 2 else None
    ref = fp8_block_mm.call_backend("reference", aq, asc, bq, bsc, (128, 128), bias, out_dtype)
    dev = [t.to(device) for t in (aq, asc, bq, bsc)]
    out = fp8_block_mm.call_backend("triton", *dev, (128, 128), bias.to(device) if bias is not None else None,
                                    out_dtype, config=config)
    assert_close(out.cpu(), ref, tol=GEMM_TOL[out_dtype])


def test_fp8_block_mm_matches_dequantized_matmul(rng):
    """The reference itself: the block GEMM equals a plain matmul of the dequantized operands."""
    x, w = randn(4, 256, gen=rng), randn(130, 256, gen=rng, scale=0.1)
    aq, asc = formats.quantize_fp8_per_group(x, 128)
    bq, bsc = formats.quantize_fp8_blocks(w, (128, 128))
    a = aq.float() * asc.repeat_interleave(128, dim=1)
    expected = a @ formats.dequantize_fp8_blocks(bq, bsc).t()
    out = fp8_block_mm.call_backend("reference", aq, asc, bq, bsc, (128, 128), None, torch.float32)
    torch.testing.assert_close(out, expected)
    assert_close(out, x @ w.t(), tol=0.1)  # and both are close to the unquantized product


def test_fp8_kernel_preconditions():
    from atom_kernels.ops.fp8_block_mm import triton as block_triton
    from atom_kernels.ops.fp8_scaled_mm import triton as scaled_triton

    a = torch.zeros(2, 64, dtype=torch.float8_e4m3fn)
    assert scaled_triton.unsupported(a, torch.ones(2, 1), torch.zeros(3, 32, dtype=torch.float8_e4m3fn), torch.ones(3, 1))
    assert "128" in block_triton.unsupported(a, torch.ones(2, 1), a, torch.ones(1, 1), (128, 64))


@pytest.mark.skipif(not CUDA, reason="torch._scaled_mm row-wise needs a Hopper GPU")
@pytest.mark.parametrize("m,n,k", [(1, 256, 512), (16, 4096, 1024), (300, 1024, 2048)])
def test_fp8_scaled_mm_cublas_matches_reference(rng, m, n, k):
    aq, asc = formats.quantize_fp8_per_row(randn(m, k, gen=rng, scale=3.0))
    bq, bsc = formats.quantize_fp8_per_row(randn(n, k, gen=rng, scale=0.05))
    args = [t.cuda() for t in (aq, asc, bq, bsc)]
    if fp8_scaled_mm.resolve(*args, None, torch.bfloat16)[0] != "torch":
        pytest.skip("this GPU has no row-wise torch._scaled_mm")
    out = fp8_scaled_mm.call_backend("torch", *args, None, torch.bfloat16)
    ref = fp8_scaled_mm.call_backend("reference", aq, asc, bq, bsc, None, torch.bfloat16)
    assert_close(out.cpu(), ref, tol=GEMM_TOL[torch.bfloat16])


@pytest.mark.skipif(not CUDA, reason="needs a GPU")
def test_fp8_scaled_mm_falls_back_to_triton_on_odd_dims(rng):
    aq = torch.zeros(3, 40, dtype=torch.float8_e4m3fn, device="cuda")  # K = 40: not a multiple of 16
    backend, _ = fp8_scaled_mm.resolve(aq, torch.ones(3, 1, device="cuda"), aq[:2], torch.ones(2, 1, device="cuda"))
    assert backend == "triton"


# ------------------------------------------------------------------------------------- MXFP4
MX_CASES = [  # (m, n, k, config override)
    (1, 64, 256, None), (3, 100, 96, None), (16, 130, 512, {"split_k": 2}), (20, 64, 64, None),
    (70, 96, 160, None), (5, 64, 256, {"block_k": 128, "split_k": 1}), (2, 200, 1024, {"block_n": 128, "split_k": 3}),
]


def _mx_weight(n, k, gen):
    w = randn(n, k, gen=gen, scale=0.05) * torch.rand(n, 1, generator=gen) * 4
    return formats.quantize_mxfp4(w)


@pytest.mark.parametrize("m,n,k,config", MX_CASES)
def test_mxfp4_mm(device, rng, m, n, k, config):
    w, s = _mx_weight(n, k, rng)
    bias = randn(n, gen=rng) if m % 2 else None
    dtypes = [torch.bfloat16] if device.type == "cuda" else [torch.float32, torch.bfloat16]
    for dtype in dtypes:
        x = randn(m, k, gen=rng, dtype=dtype)
        ref = mxfp4_mm.call_backend("reference", x, w, s, bias)
        out = mxfp4_mm.call_backend("triton", x.to(device), w.to(device), s.to(device),
                                    bias.to(device) if bias is not None else None, config=config)
        assert out.dtype == dtype
        assert_close(out.cpu(), ref, dtype)


def test_mxfp4_mm_every_code_and_scale_range(device, rng):
    """All 16 codes at every position of a group, with scales 2**-90 .. 2**30 (the kernel's range)."""
    n, k = 64, 64
    codes = torch.randint(0, 16, (n, k), generator=rng, dtype=torch.uint8)
    codes[0, :32] = torch.arange(32, dtype=torch.uint8) % 16
    w = formats.pack_e2m1(codes)
    s = torch.randint(127 - 90, 127 + 31, (n, k // 32), generator=rng, dtype=torch.uint8)
    x = torch.eye(k)[:16] if device.type == "cpu" else torch.eye(k, dtype=torch.bfloat16)[:16]
    dense = formats.dequantize_mxfp4(w, s)  # [n, k]
    out = mxfp4_mm.call_backend("triton", x.to(device), w.to(device), s.to(device))
    torch.testing.assert_close(out.float().cpu(), dense[:, :16].t().float().to(out.dtype).float(), rtol=0, atol=0)


def test_mxfp4_sweep_configs_agree(device, rng):
    """Every configuration the bench sweeps computes the same product (a sample of them in the
    interpreter, all of them on a GPU)."""
    m, n, k = 3, 128, 1024
    w, s = _mx_weight(n, k, rng)
    x = randn(m, k, gen=rng, dtype=torch.bfloat16, device=device)
    ref = mxfp4_mm.call_backend("reference", x.cpu(), w, s)
    configs = mxfp4_triton.SWEEP if device.type == "cuda" else mxfp4_triton.SWEEP[::7]
    for config in configs:
        out = mxfp4_mm.call_backend("triton", x, w.to(device), s.to(device), None, config=config)
        assert_close(out.cpu(), ref, torch.bfloat16)


def test_mxfp4_preconditions():
    w, s = formats.quantize_mxfp4(torch.randn(8, 64))
    assert mxfp4_triton.unsupported(torch.randn(2, 64), w, s) is None
    assert "do not match" in mxfp4_triton.unsupported(torch.randn(2, 96), w, s)
    assert "contiguous" in mxfp4_triton.unsupported(torch.randn(2, 64), w.t().contiguous().t(), s)


# ------------------------------------------------------------------------ graphs and dispatch
@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a GPU")
def test_quant_ops_are_cuda_graph_capturable(rng):
    x = randn(9, 512, dtype=torch.bfloat16, device="cuda", gen=rng)
    assert_graph_capturable(lambda: quant_fp8.call_backend("triton", x, 128), x)
    bq, bsc = (t.cuda() for t in formats.quantize_fp8_blocks(randn(256, 512, gen=rng, scale=0.05)))
    cq, csc = (t.cuda() for t in formats.quantize_fp8_per_row(randn(256, 512, gen=rng, scale=0.05)))
    w, s = (t.cuda() for t in formats.quantize_mxfp4(randn(256, 512, gen=rng, scale=0.05)))

    def block():
        q, sc = quant_fp8.call_backend("triton", x, 128)
        return fp8_block_mm.call_backend("triton", q, sc, bq, bsc)

    def rowwise():
        q, sc = quant_fp8.call_backend("triton", x)
        return fp8_scaled_mm.call_backend("triton", q, sc, cq, csc)

    assert_graph_capturable(block, x)
    assert_graph_capturable(rowwise, x)
    assert_graph_capturable(lambda: mxfp4_mm.call_backend("triton", x, w, s), x)


def test_quant_ops_registered():
    table = dispatch.describe("cpu")
    for name in ("quant_fp8", "fp8_scaled_mm", "fp8_block_mm", "mxfp4_mm"):
        assert table[name] == "reference"
    assert dispatch.OPS["fp8_scaled_mm"].backends == ("aiter", "torch", "triton", "reference")
    assert "torch" not in dispatch.OPS["rms_norm"].backends
