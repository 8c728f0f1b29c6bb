"""The MXFP4 dequantize kernel (``ops/mxfp4_mm/dequant.py``) and the op's prefill path that uses it (weight
dequantized once, product by cuBLAS / torch): exact against ``formats.dequantize_mxfp4`` in both byte orders."""

import pytest
import torch
from helpers import assert_close, randn

from atom_kernels import formats, mxfp4_mm
from atom_kernels.ops.mxfp4_mm.dequant import dequantize
from atom_kernels.ops.mxfp4_mm.triton import default_kernel


@pytest.mark.parametrize("layout", ["rows", "lanes"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the interpreter on scale byte 255
def test_dequantize_matches_the_format(device, rng, layout, dtype):
    """Every code with random scales, the extreme scale bytes 0 (2**-127) and 255 (NaN) included, 37 rows (a ragged
    row block), K = 384 (three 128-code blocks): bit-exact to the reference (NaN where it is NaN)."""
    n, k = 37, 384
    w = torch.randint(0, 256, (n, k // 2), generator=rng, dtype=torch.uint8)
    s = torch.randint(110, 140, (n, k // 32), generator=rng, dtype=torch.uint8)
    s[0, 0], s[1, 1], s[2, 2] = 0, 255, 254
    if dtype == torch.bfloat16 and device.type == "cpu":
        s[0, 0] = 2  # the interpreter's fp32 -> bf16 cast flushes subnormal results (0.5 * 2**-127); the GPU keeps them
    stored = formats.mxfp4_rows_to_lanes(w) if layout == "lanes" else w
    out = dequantize(stored.to(device), s.to(device), dtype, layout).cpu()
    ref = formats.dequantize_mxfp4(w, s, dtype)
    assert out.dtype == dtype and out.shape == (n, k)
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(torch.nan_to_num(out), torch.nan_to_num(ref))


def test_dequantize_errors():
    with pytest.raises(ValueError, match="K % 128"):
        dequantize(torch.zeros(4, 48, dtype=torch.uint8), torch.zeros(4, 3, dtype=torch.uint8), torch.float32)


@pytest.mark.parametrize("layout", ["rows", "lanes"])
def test_op_prefill_path(device, rng, layout):
    """``kernel="dequant"`` (the default from DEQUANT_MIN_TOKENS on a GPU): the op on both byte orders, with bias,
    equals the reference."""
    m, n, k = 70, 96, 256
    w, s = formats.quantize_mxfp4(randn(n, k, gen=rng, scale=0.05))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    x, bias = randn(m, k, gen=rng, dtype=dtype), randn(n, gen=rng, dtype=dtype)
    ref = mxfp4_mm.call_backend("reference", x, w, s, bias)
    stored = formats.mxfp4_rows_to_lanes(w) if layout == "lanes" else w
    out = mxfp4_mm.call_backend("triton", x.to(device), stored.to(device), s.to(device), bias.to(device),
                                config={"kernel": "dequant"}, layout=layout)
    assert_close(out.cpu(), ref, dtype)


def test_default_kernel_by_tokens():
    assert default_kernel(16, 8192, torch.device("cpu")) == "small_m"
    assert default_kernel(4096, 8192, torch.device("cpu")) == "mma"  # the interpreter / CPU never takes cuBLAS
    if torch.cuda.is_available():
        assert default_kernel(4096, 8192, torch.device("cuda")) == "dequant"
        assert default_kernel(4096, 2880, torch.device("cuda")) == "mma"  # K % 128 != 0
        assert default_kernel(256, 8192, torch.device("cuda")) == "mma"
