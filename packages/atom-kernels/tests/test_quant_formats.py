"""The quantization formats themselves (``atom_kernels.formats``): every code decodes to its OCP value,
encoding rounds to nearest (ties to even), and dequantized tensors are within each format's error."""

import pytest
import torch

from atom_kernels import formats as F

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_e2m1_codes_and_nibble_order():
    codes = torch.arange(16, dtype=torch.uint8).repeat(2)[None]  # one group of 32
    packed = F.pack_e2m1(codes)
    assert packed[0, 0].item() == 0x10  # element 0 in the low nibble, element 1 in the high one
    assert torch.equal(F.unpack_e2m1(packed), codes)
    values = F.dequantize_mxfp4(packed, torch.tensor([[127]], dtype=torch.uint8))
    assert values[0, :16].tolist() == E2M1 + [-v for v in E2M1]


def test_e8m0_scales():
    e = torch.tensor([0, 1, 120, 127, 130, 254, 255], dtype=torch.uint8)
    got = F.e8m0_to_float(e)
    assert got[:-1].tolist() == [2.0 ** (int(v) - 127) for v in e[:-1]]
    assert torch.isnan(got[-1])


def test_mxfp4_encoder_rounds_to_nearest_even():
    # one group whose largest magnitude is 6 (scale 1): midpoints go to the code with mantissa bit 0
    row = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0, 0.26, 4.9] + [0.0] * 20)
    packed, scales = F.quantize_mxfp4(row[None])
    assert scales.item() == 127
    got = F.dequantize_mxfp4(packed, scales)[0, :12].tolist()
    assert got == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 0.0, -4.0, 0.5, 4.0]


@pytest.mark.parametrize("amax,exponent", [(6.0, 0), (6.9, 0), (7.0, 1), (4.0, 0), (3.99, 0), (3.4, -1), (0.75, -3)])
def test_mxfp4_scale_choice(amax, exponent):
    """The scale puts the largest element in [4, 7); one that would round past 6 (>= 7) moves up a
    binade instead of clipping."""
    row = torch.zeros(1, 32)
    row[0, 3] = amax
    _, scales = F.quantize_mxfp4(row)
    assert scales.item() - 127 == exponent


def test_mxfp4_error_bound(rng):
    w = torch.randn(48, 256, generator=rng) * torch.rand(48, 1, generator=rng) * 3
    w[0, :32] = 0.0  # an all-zero group
    packed, scales = F.quantize_mxfp4(w)
    deq = F.dequantize_mxfp4(packed, scales)
    step = F.e8m0_to_float(scales).repeat_interleave(32, dim=1)
    # half the grid spacing at each magnitude: 0.25 s below 2 s, |w| / 4 above
    bound = torch.maximum(0.25 * step, w.abs() / 4) * (1 + 1e-6)
    assert ((deq - w).abs() <= bound).all()
    assert deq[0, :32].abs().sum() == 0
    assert F.quantize_mxfp4(deq)[0].equal(packed)  # decoded values re-encode to the same codes


def _fp8_bound(x, scale):
    # e4m3: 3 mantissa bits (half-ulp 2**-4 relative), subnormal step 2**-9 (half: 2**-10) of the scale
    return torch.maximum(x.abs() * 2.0**-4, scale * 2.0**-10) * (1 + 1e-6)


def test_fp8_per_row_group_block_error(rng):
    w = torch.randn(130, 300, generator=rng) * torch.rand(130, 1, generator=rng) * 10
    q, s = F.quantize_fp8_per_row(w)
    assert s.shape == (130, 1) and q.dtype == torch.float8_e4m3fn
    assert ((F.dequantize_fp8(q, s) - w).abs() <= _fp8_bound(w, s)).all()
    assert torch.allclose(q.float().abs().amax(dim=1), torch.full((130,), 448.0))  # each row reaches 448
    q, s = F.quantize_fp8_per_group(w, 128)
    assert s.shape == (130, 3)
    full = s.repeat_interleave(128, dim=1)[:, :300]
    assert ((q.float() * full - w).abs() <= _fp8_bound(w, full)).all()
    q, s = F.quantize_fp8_blocks(w, (128, 128))
    assert s.shape == (2, 3)
    full = F.expand_blocks(s, (128, 128), (130, 300))
    assert ((F.dequantize_fp8_blocks(q, s) - w).abs() <= _fp8_bound(w, full)).all()
    q, s = F.quantize_fp8_per_tensor(w)
    assert s.dim() == 0 and ((F.dequantize_fp8(q, s) - w).abs() <= _fp8_bound(w, s)).all()


def test_fp8_zero_rows_stay_finite():
    q, s = F.quantize_fp8_per_row(torch.zeros(2, 16))
    assert torch.isfinite(s).all() and (s > 0).all() and q.float().abs().sum() == 0
