"""Number formats of quantized weights and activations, in plain torch: the specification the
kernels decode and the checkpoint writers encode.

* **FP8 e4m3** (``torch.float8_e4m3fn``, largest finite 448): a scaled tensor ``q`` with dequantized
  value ``q * scale``; the scale covers one tensor, one output channel (row), or one block.
  Encoding divides by the scale, clamps to ±448 and rounds to nearest even (what ``.to(float8)``
  and the GPU's ``cvt.rn.satfinite`` do).
* **MXFP4** (OCP microscaling): e2m1 codes, 4 bits each (bit 3 sign, bits 2-1 exponent, bit 0
  mantissa; magnitudes ``{0, 0.5, 1, 1.5, 2, 3, 4, 6}``), two per byte with element ``2i`` in the low
  nibble, and one e8m0 scale byte ``e`` (value ``2**(e-127)``; 255 is NaN) per 32 consecutive
  elements along the last dim.  ``packed [N, K/2]`` uint8 and ``scales [N, K/32]`` uint8.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
# The smallest dynamic scale: an all-zero row quantizes to zeros instead of dividing by zero.
FP8_MIN_AMAX = 1e-10

MX_GROUP = 32
E2M1_MAX = 6.0
# Magnitudes of the 8 non-negative e2m1 codes; codes 8-15 are their negatives.
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_VALUES = torch.tensor(E2M1_MAGNITUDES + tuple(-v for v in E2M1_MAGNITUDES), dtype=torch.float32)
# Midpoints between consecutive magnitudes: the rounding boundaries of the encoder.
_E2M1_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float32)


# ----------------------------------------------------------------------------------------- FP8
def fp8_encode(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``round(clamp(x * (1 / scale), ±448))`` as e4m3; ``scale`` broadcasts against ``x``.  The
    reciprocal is taken once (IEEE fp32 division) and multiplied in, which a GPU kernel reproduces
    exactly."""
    return (x.float() * torch.reciprocal(scale.float())).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def fp8_scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    """The dynamic scale that maps ``amax`` onto 448 (fp32, never zero)."""
    return amax.float().clamp_min(FP8_MIN_AMAX) * (1.0 / FP8_MAX)


def quantize_fp8_per_tensor(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale for the whole tensor: ``(q, scale [])``."""
    scale = fp8_scale_from_amax(w.abs().amax())
    return fp8_encode(w, scale), scale


def quantize_fp8_per_row(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per row (output channel of a ``[N, K]`` weight, or token of an activation):
    ``(q, scale [N, 1])``."""
    scale = fp8_scale_from_amax(w.abs().amax(dim=-1, keepdim=True))
    return fp8_encode(w, scale), scale


def quantize_fp8_per_group(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per row and per ``group_size`` consecutive columns (the last group may be short):
    ``(q, scale [..., ceil(K / group_size)])``."""
    k = x.shape[-1]
    groups = -(-k // group_size)
    padded = torch.nn.functional.pad(x.float(), (0, groups * group_size - k))
    grouped = padded.reshape(*x.shape[:-1], groups, group_size)
    scale = fp8_scale_from_amax(grouped.abs().amax(dim=-1))
    q = fp8_encode(grouped, scale[..., None]).reshape(*x.shape[:-1], groups * group_size)[..., :k]
    return q.contiguous(), scale


def expand_blocks(scale: torch.Tensor, block: tuple[int, int], shape: tuple[int, int]) -> torch.Tensor:
    """A ``[ceil(N/bn), ceil(K/bk)]`` block-scale grid repeated to the ``[N, K]`` elements it covers."""
    bn, bk = block
    return scale.repeat_interleave(bn, dim=0)[: shape[0]].repeat_interleave(bk, dim=1)[:, : shape[1]]


def quantize_fp8_blocks(w: torch.Tensor, block: tuple[int, int] = (128, 128)) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 block quantization of a ``[N, K]`` weight: ``(q, scale_inv [ceil(N/bn), ceil(K/bk)])``
    where ``scale_inv`` is the dequantization *multiplier* of each ``bn x bk`` block."""
    n, k = w.shape
    bn, bk = block
    nb, kb = -(-n // bn), -(-k // bk)
    padded = torch.nn.functional.pad(w.float(), (0, kb * bk - k, 0, nb * bn - n))
    amax = padded.reshape(nb, bn, kb, bk).abs().amax(dim=(1, 3))
    scale = fp8_scale_from_amax(amax)
    return fp8_encode(w, expand_blocks(scale, block, (n, k))), scale


def dequantize_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``q * scale`` with ``scale`` broadcasting (scalar, ``[N, 1]`` or already expanded)."""
    return (q.float() * scale.float()).to(dtype)


def dequantize_fp8_blocks(q: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] = (128, 128),
                          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return dequantize_fp8(q, expand_blocks(scale_inv.float(), block, tuple(q.shape)), dtype)


# ---------------------------------------------------------------------------------------- MXFP4
def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., K/2]`` -> codes uint8 ``[..., K]`` (element 2i from the low nibble)."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """codes uint8 ``[..., K]`` (K even) -> uint8 ``[..., K/2]``, element 2i in the low nibble."""
    pairs = codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)


def e8m0_to_float(scales: torch.Tensor) -> torch.Tensor:
    """e8m0 bytes -> fp32 ``2**(e-127)`` (255 -> NaN, as the format defines)."""
    e = scales.view(torch.uint8).to(torch.int32)
    value = torch.ldexp(torch.ones_like(e, dtype=torch.float32), e - 127)
    return torch.where(e == 255, torch.full_like(value, float("nan")), value)


def dequantize_mxfp4(packed: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``packed [..., K/2]`` uint8 and ``scales [..., K/32]`` e8m0 -> values ``[..., K]``."""
    codes = unpack_e2m1(packed.view(torch.uint8))
    values = E2M1_VALUES.to(codes.device)[codes.long()]
    k = values.shape[-1]
    if scales.shape[-1] * MX_GROUP != k:
        raise ValueError(f"MXFP4 scales {tuple(scales.shape)} do not cover {k} elements in groups of {MX_GROUP}")
    factor = e8m0_to_float(scales).repeat_interleave(MX_GROUP, dim=-1)
    return (values * factor).to(dtype)


MXFP4_LAYOUTS = ("rows", "lanes")
LANES_BLOCK = 128  # codes per block of the "lanes" layout (64 bytes, 4 scale groups)

# The bits of each 32-bit word of the "lanes" layout.  The kernels decode a word into 4 registers, register ``p``
# holding codes ``2 p`` (low half) and ``2 p + 1`` (high half) as bf16 bit patterns ``code * 2**-126``: sign at bit 15,
# exponent bits 8-7, mantissa bit 6 (and 16 higher).  Register ``p`` is the OR of ``rotl(word, r) & mask`` over the
# terms ``(mask, r)`` below, so the layout puts each code bit where those terms fetch it: 9 integer operations per word
# (4 shifts, 5 and/or) where the byte-wise decode of the checkpoint's order takes 13.  (Rotations 2, 6, 12 and one of
# two bits by 24 -- a shift by 8 -- are the cheapest cover of the word's 32 bits by 4 such sets, found by an exhaustive
# search over rotations per bit.)
LANES_PAIR_TERMS = (
    ((0x81808180, 0), (0x00400040, 24)),
    ((0x81C081C0, 2),),
    ((0x81C081C0, 6),),
    ((0x81C081C0, 12),),
)
_HALF_BIT_OF_NIBBLE_BIT = {15: 3, 8: 2, 7: 1, 6: 0}  # bf16 half bit -> e2m1 code bit (sign, exponent 1-0, mantissa)


def _lanes_bit_sources() -> tuple[int, ...]:
    """``source[b]``: the bit of the byte-ordered word (code ``i`` in bits ``4 i .. 4 i + 3``) stored at bit ``b`` of a
    "lanes" word, from ``LANES_PAIR_TERMS``."""
    source = [None] * 32
    for pair, terms in enumerate(LANES_PAIR_TERMS):
        for mask, rotation in terms:
            for bit in (b for b in range(32) if mask >> b & 1):
                code = 2 * pair + bit // 16
                stored_at = (bit - rotation) % 32
                if source[stored_at] is not None:
                    raise AssertionError(f"LANES_PAIR_TERMS fetch bit {stored_at} twice")
                source[stored_at] = 4 * code + _HALF_BIT_OF_NIBBLE_BIT[bit % 16]
    if None in source:
        raise AssertionError("LANES_PAIR_TERMS leave word bits unused")
    return tuple(source)


LANES_BIT_SOURCES = _lanes_bit_sources()


def _byte_spread_tables(source: tuple[int, ...]) -> torch.Tensor:
    """``[4, 256, 4]`` uint8: the 4 output bytes that byte ``i`` of a word with value ``v`` contributes to the word
    whose bit ``b`` is input bit ``source[b]`` (so a word permutes as the OR of 4 table rows)."""
    tables = torch.zeros(4, 256, 4, dtype=torch.uint8)
    values = torch.arange(256)
    for b, s in enumerate(source):
        tables[s // 8, :, b // 8] |= (((values >> (s % 8)) & 1) << (b % 8)).to(torch.uint8)
    return tables


def _permute_word_bits(packed: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
    words = packed.reshape(*packed.shape[:-1], -1, 4)  # little-endian 32-bit words
    tables = tables.to(packed.device)
    out = tables[0][words[..., 0].long()]
    for i in range(1, 4):
        out |= tables[i][words[..., i].long()]
    return out.reshape(packed.shape)


_TO_LANES_BITS = _byte_spread_tables(LANES_BIT_SOURCES)
_FROM_LANES_BITS = _byte_spread_tables(tuple(LANES_BIT_SOURCES.index(b) for b in range(32)))


def _lane_blocks(packed: torch.Tensor) -> torch.Tensor:
    k = packed.shape[-1] * 2
    if k % LANES_BLOCK:
        raise ValueError(f"the MXFP4 'lanes' layout needs K to be a multiple of {LANES_BLOCK}, got K={k}")
    return packed.reshape(*packed.shape[:-1], k // LANES_BLOCK, 4, 4, 4)


def mxfp4_rows_to_lanes(packed: torch.Tensor) -> torch.Tensor:
    """Checkpoint layout (``"rows"``: codes in K order, two per byte) -> ``"lanes"``: inside each 64-byte block
    of 128 codes, word ``4 t + j`` (bytes ``16 t + 4 j .. + 3``) holds bytes ``16 j + 4 p + t`` (p = 0..3) of the
    checkpoint, as its bytes ``p``, with its 32 bits then permuted by ``LANES_BIT_SOURCES`` (t, j, p in 0..3).

    Why: the small-M MMA kernel's thread ``t`` of a row reads 16 bytes and decodes its word ``j``, pair ``p``
    into MMA K position ``32 j + 8 p + 2 t``; in this layout that position is the code's own K, so the
    activations are copied in their natural order (``ops/mxfp4_mm/gluon_small_m.py``), and each pair comes out of
    one or two shifts and masks (``LANES_PAIR_TERMS``).  Same codes, same scales (word ``j`` of every thread lies in
    scale group ``j`` of the block); needs K % 128 == 0."""
    blocks = _lane_blocks(packed)  # [..., block, j, p, t]
    moved = blocks.permute(*range(blocks.dim() - 3), -1, -3, -2).reshape(packed.shape).contiguous()
    return _permute_word_bits(moved, _TO_LANES_BITS)


def mxfp4_lanes_to_rows(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of ``mxfp4_rows_to_lanes``."""
    blocks = _lane_blocks(_permute_word_bits(packed, _FROM_LANES_BITS))  # [..., block, t, j, p]
    return blocks.permute(*range(blocks.dim() - 3), -2, -1, -3).reshape(packed.shape).contiguous()


def mxfp4_in_rows(packed: torch.Tensor, layout: str) -> torch.Tensor:
    """``packed`` in the checkpoint layout, whatever ``layout`` (one of ``MXFP4_LAYOUTS``) it is in."""
    if layout not in MXFP4_LAYOUTS:
        raise ValueError(f"unknown MXFP4 layout {layout!r}; known: {', '.join(MXFP4_LAYOUTS)}")
    return mxfp4_lanes_to_rows(packed) if layout == "lanes" else packed


def mxfp4_scale_exponents(amax: torch.Tensor) -> torch.Tensor:
    """The e8m0 exponent (unbiased) of each group: ``floor(log2(amax)) - 2`` puts the largest element
    in [4, 8); when it would round past 6 (``>= 7``) the exponent goes up by one instead of clipping."""
    mantissa, exponent = torch.frexp(amax.float())  # amax = mantissa * 2**exponent, mantissa in [0.5, 1)
    e = exponent - 3  # floor(log2(amax)) - 2
    return torch.where(mantissa * 8 >= 7, e + 1, e)  # amax / 2**e = mantissa * 8; >= 7 would round past 6


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[..., K]`` (K a multiple of 32) -> ``(packed [..., K/2] uint8, scales [..., K/32] uint8)``;
    round to nearest, ties to the even code."""
    k = w.shape[-1]
    if k % MX_GROUP:
        raise ValueError(f"MXFP4 needs the last dim to be a multiple of {MX_GROUP}, got {k}")
    grouped = w.float().reshape(*w.shape[:-1], k // MX_GROUP, MX_GROUP)
    amax = grouped.abs().amax(dim=-1)
    exponent = mxfp4_scale_exponents(amax).clamp(-127, 127)
    exponent = torch.where(amax > 0, exponent, torch.full_like(exponent, -127))
    scaled = grouped / torch.ldexp(torch.ones_like(amax), exponent)[..., None]
    magnitude = scaled.abs()
    bounds = _E2M1_MIDPOINTS.to(w.device)
    low = torch.bucketize(magnitude, bounds, right=False)  # ties go to the smaller magnitude
    high = torch.bucketize(magnitude, bounds, right=True)  # ties go to the larger one
    code = torch.where(low % 2 == 0, low, high)  # a tie picks the even code (mantissa bit 0)
    code = code | ((scaled < 0) & (code != 0)).to(code.dtype) << 3
    packed = pack_e2m1(code.to(torch.uint8).reshape(*w.shape[:-1], k))
    return packed, (exponent + 127).to(torch.uint8)
