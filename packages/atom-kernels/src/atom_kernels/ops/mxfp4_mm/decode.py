"""The MXFP4 decode of the small-M kernels: 32-bit words of 8 e2m1 codes into bf16x2 registers.

On a GPU a word (code ``i`` in bits ``4i..4i+3``) becomes four bf16x2 registers by inline PTX (``DECODE_ASM``):
``y = w << 4``; for pair ``i`` (codes ``2i``, ``2i+1``) one ``prmt`` builds ``[sign(2i+1) x8 | byte_i(w) | sign(2i) x8 |
byte_i(y)]`` (sign-replicate mode turns the nibble's sign bit into a whole byte), ``(t << 2) & 0x81C081C0`` leaves each
half as the bf16 ``code * 2**-126``, and one ``mul.bf16x2`` by ``2**(e - 1 - SHIFT)`` leaves
``code * 2**(e - 127) * 2**-SHIFT``: 4 instructions per pair plus one shift per word. ``SHIFT`` = 32 keeps every product
normal in bf16 for scales 2**-93 .. 2**33 (checked at load); the fp32 accumulator is multiplied back by 2**SHIFT.

Words in the "lanes" layout (``formats.mxfp4_rows_to_lanes``) have their bits stored so that register ``p`` is the OR
of one or two ``rotl(word, r) & mask`` terms (``formats.LANES_PAIR_TERMS``): ``LANES_DECODE_ASM``, generated from that
table so layout and decode cannot drift apart, takes 9 integer instructions per word instead of 13.

``decode_pair_bits`` / ``decode_lanes_pair_bits`` are the same algorithms in plain Python (the CPU tests check them
code by code). In Triton's CPU interpreter (``EXACT``: no inline PTX) ``decode_words`` decodes with exact fp32 math.
"""

from __future__ import annotations

import triton
import triton.language as tl

from atom_kernels.formats import LANES_BIT_SOURCES, LANES_PAIR_TERMS, MX_GROUP

_SHIFT = 32  # the decoded values are code * 2**(e - 127 - _SHIFT): normal in bf16 for every scale a checkpoint holds

# One word -> four bf16x2 registers (see the module docstring).  $4: the word; $5: the scale as bf16x2.
DECODE_ASM = tl.constexpr("""
{
.reg .b32 y, t;
shl.b32 y, $4, 4;
prmt.b32 t, y, $4, 0xC480;
shl.b32 t, t, 2;
and.b32 t, t, 0x81C081C0;
mul.rn.bf16x2 $0, t, $5;
prmt.b32 t, y, $4, 0xD591;
shl.b32 t, t, 2;
and.b32 t, t, 0x81C081C0;
mul.rn.bf16x2 $1, t, $5;
prmt.b32 t, y, $4, 0xE6A2;
shl.b32 t, t, 2;
and.b32 t, t, 0x81C081C0;
mul.rn.bf16x2 $2, t, $5;
prmt.b32 t, y, $4, 0xF7B3;
shl.b32 t, t, 2;
and.b32 t, t, 0x81C081C0;
mul.rn.bf16x2 $3, t, $5;
}
""")
_PAIR_SELECTORS = (0xC480, 0xD591, 0xE6A2, 0xF7B3)  # prmt selectors of pairs 0..3 (documentation + tests)
_PAIR_MASK = 0x81C081C0


def _term_ptx(dest: str, mask: int, rotation: int) -> list[str]:
    """PTX leaving ``rotl($4, rotation) & mask`` in ``dest``: a plain shift where no bit of ``mask`` wraps around."""
    bits = [b for b in range(32) if mask >> b & 1]
    if rotation == 0:
        return [f"and.b32 {dest}, $4, {mask:#010x};"]
    if min(bits) >= rotation:
        shift = f"shl.b32 {dest}, $4, {rotation};"
    elif max(bits) < rotation:
        shift = f"shr.u32 {dest}, $4, {32 - rotation};"
    else:
        shift = f"shf.l.wrap.b32 {dest}, $4, $4, {rotation};"
    return [shift, f"and.b32 {dest}, {dest}, {mask:#010x};"]


def lanes_decode_asm(half: int | None = None) -> str:
    """``DECODE_ASM`` for words in the "lanes" layout: register ``p`` is the OR of ``formats.LANES_PAIR_TERMS[p]``,
    times the scale: 10 integer PTX instructions per word, 9 in SASS (ptxas merges register 0's mask and OR into one
    LOP3), instead of 13.  Built from the table, so the layout and its decode cannot drift apart.  With ``half`` (0 or
    1) ``$5`` holds two groups' multipliers (``SCALE_PAIR_ASM``) and the word takes the bf16 of that half in both lanes
    (ptxas folds the selection into the multiply's operand: ``HMUL2 ... R.H0_H0``)."""
    lines = ["{", ".reg .b32 t, u;"]
    scale = "$5"
    if half is not None:
        halves = ("h, g" if half == 0 else "g, h")  # h: the half this word takes
        lines += [".reg .b16 h, g;", ".reg .b32 m;", f"mov.b32 {{{halves}}}, $5;", "mov.b32 m, {h, h};"]
        scale = "m"
    for pair, terms in enumerate(LANES_PAIR_TERMS):
        for n, (mask, rotation) in enumerate(terms):
            lines += _term_ptx("t" if n == 0 else "u", mask, rotation)
            if n:
                lines.append("or.b32 t, t, u;")
        lines.append(f"mul.rn.bf16x2 ${pair}, t, {scale};")
    return "\n".join(lines + ["}"])


def scale_pair_asm(shift: int) -> str:
    """One 32-bit word of 4 e8m0 scale bytes (groups ``g .. g + 3``, byte ``i`` = group ``g + i``) -> two registers of
    bf16x2 multipliers ``2**(e - 1 - shift)``: groups ``(g, g + 2)`` in ``$0`` and ``(g + 1, g + 3)`` in ``$1`` (low half
    first).  One ``prmt`` spreads two bytes into the halves and one ``mad`` shifts them into the bf16 exponent field
    and adds the bias: 4 instructions per 4 scales (unpacked one byte at a time: 7)."""
    bias = (127 - shift - 1) * 0x00800080
    return "\n".join(["{", ".reg .b32 a, b;", "prmt.b32 a, $2, 0, 0x4240;", "prmt.b32 b, $2, 0, 0x4341;",
                      f"mad.lo.u32 $0, a, 128, {bias:#010x};", f"mad.lo.u32 $1, b, 128, {bias:#010x};", "}"])


LANES_DECODE_ASM = tl.constexpr(lanes_decode_asm())
LANES_DECODE_ASM_LOW = tl.constexpr(lanes_decode_asm(0))  # a word taking the low half of its paired multipliers
LANES_DECODE_ASM_HIGH = tl.constexpr(lanes_decode_asm(1))
SCALE_PAIR_ASM = tl.constexpr(scale_pair_asm(_SHIFT))
_LANES_BIT_SOURCES = tl.constexpr(LANES_BIT_SOURCES)


def _prmt(a: int, b: int, selector: int) -> int:
    """PTX ``prmt.b32`` (default mode): output byte ``j`` picks byte ``sel & 7`` of ``b:a``; selector bit 3
    replicates that byte's sign bit instead."""
    pool = (b << 32 | a).to_bytes(8, "little")
    out = 0
    for j in range(4):
        sel = (selector >> (4 * j)) & 0xF
        byte = pool[sel & 7]
        out |= ((0xFF if byte & 0x80 else 0) if sel & 8 else byte) << (8 * j)
    return out


def decode_pair_bits(word: int, pair: int) -> int:
    """The kernel's decode of codes ``2 pair`` (low half) and ``2 pair + 1`` (high half) of a 32-bit word
    into two bf16 bit patterns ``code * 2**-126``, step by step as ``DECODE_ASM`` does it."""
    y = (word << 4) & 0xFFFFFFFF
    t = _prmt(y, word, _PAIR_SELECTORS[pair])
    return ((t << 2) & 0xFFFFFFFF) & _PAIR_MASK


def decode_lanes_pair_bits(word: int, pair: int) -> int:
    """``decode_pair_bits`` for a word in the "lanes" layout (``formats.LANES_PAIR_TERMS``)."""
    out = 0
    for mask, rotation in LANES_PAIR_TERMS[pair]:
        out |= ((word << rotation | word >> (32 - rotation)) & 0xFFFFFFFF) & mask
    return out


def chunk_groups(k: int, block_k: int | None = None) -> int:
    """Scale groups per contiguous run of one thread (4 -> 16-byte loads): the largest of 4, 2, 1 that
    divides ``K / 32`` (and ``block_k / 32``)."""
    groups = [k // MX_GROUP] + ([block_k // MX_GROUP] if block_k else [])
    return next(c for c in (4, 2, 1) if all(g % c == 0 for g in groups))


@triton.jit
def _split_pair(p):
    lo = p.to(tl.int16).to(tl.bfloat16, bitcast=True)
    hi = (p >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return tl.join(lo, hi)


@triton.jit
def _lanes_to_byte_order(words):
    """Words of the "lanes" layout -> their bits in the byte order (``formats.LANES_BIT_SOURCES``; interpreter only)."""
    out = tl.zeros_like(words)
    for b in tl.static_range(32):
        out |= ((words >> b) & 1) << _LANES_BIT_SOURCES[b]
    return out


@triton.jit
def decode_words(words, e, SHIFT: tl.constexpr, EXACT: tl.constexpr, LANES: tl.constexpr = False):
    """``words [R, W]`` int32 (8 codes each, code i in bits 4i..4i+3; with ``LANES`` permuted as the "lanes" layout
    does, ``formats.LANES_BIT_SOURCES``) and their e8m0 scales ``e [R, W]`` -> ``[R, W, 8]`` values ``* 2**-SHIFT``
    in code order (bf16; fp32 when ``EXACT``)."""
    if EXACT:
        if LANES:
            words = _lanes_to_byte_order(words)
        nib = (words[:, :, None] >> (4 * tl.arange(0, 8))[None, None, :]) & 15
        code = (((nib & 7) << 22) | ((nib & 8) << 28)).to(tl.float32, bitcast=True)  # code * 2**-126
        scale = ((e.to(tl.int32) + (127 - SHIFT - 1)) << 23).to(tl.float32, bitcast=True)
        return code * scale[:, :, None]
    else:
        mult = (e.to(tl.int32) + (127 - SHIFT - 1)) * 0x00800080  # the scale's bf16 bits in both halves
        p0, p1, p2, p3 = tl.inline_asm_elementwise(LANES_DECODE_ASM if LANES else DECODE_ASM, "=r,=r,=r,=r,r,r",
                                                   [words, mult], dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
                                                   is_pure=True, pack=1)
        v = tl.join(tl.join(_split_pair(p0), _split_pair(p1)), tl.join(_split_pair(p2), _split_pair(p3)))
        return tl.permute(v, (0, 1, 4, 3, 2))  # [R, W, l, i_lo, i_hi] -> code 4 i_hi + 2 i_lo + l


