"""Triton MXFP4 weight-only GEMM for decode batches (M <= 16): a GEMV-shaped kernel that streams the
4-bit weight once and keeps the decode cheap.

Work split: each program owns ``BLOCK_N`` output columns and ``K_SPLIT`` of K (split-K so that a few
programs per SM stream the weight even at M = 1); the tokens are padded to one 16-row tile.  Two MMA
arrangements (``mma`` in the config):

* ``"sync"``: the tokens are the MMA's A operand and the decoded weight its B operand
  (``tl.dot(x, w.T)``); with 16 rows on the M side Triton uses Ampere-style ``mma.sync``, the warps split
  the weight columns (no column is decoded twice), and the bf16 operand layout (``kWidth = 8``) gives each
  thread 8 consecutive K of one column: exactly one 32-bit word of codes, decoded in place.
* ``"wgmma"``: the weight is the A operand (``tl.dot(w, x.T)``, 64 weight rows per warpgroup MMA, fed from
  registers) and the tokens the B operand from shared memory; the register layout (``kWidth = 2``) gives
  each thread K pairs ``2t, 2t+1`` of every 8, so a word's four code pairs sit 8 apart in K.

Either way the decoded values never take a shared-memory round trip, and in ``"wgmma"`` the raw words and
scale bytes do not either: they are loaded in the operand's row order (``mma_rows``), so the only shared
memory in the loop is the activation tile (checked on the sm_90 SASS by ``tests/test_sm90_compile.py``).

K order: the kernel computes ``x_perm @ w_perm.T`` with the same permutation of K inside every block of
``32 * C`` elements on both sides (``C`` = 4, 2 or 1 scale groups, the largest that divides ``K / 32``),
so the result is ``x @ w.T``.  The permutation is chosen so that memory word ``C * t + j`` of a block
lands where the MMA layout wants the codes of thread ``t`` (lane % 4) for logical group ``j``: each thread
loads ``C`` contiguous words (one 16-byte load for C = 4) that share one e8m0 scale (memory group
``(C t + j) // 4``), and the activations are gathered in the permuted order (8-element runs for
``"sync"``, 2-element runs for ``"wgmma"``).

Decode of one 32-bit word (8 codes, code ``i`` in bits ``4i..4i+3``) into four bf16x2 registers, by
inline PTX (``DECODE_ASM``) on a GPU: ``y = w << 4``; for pair ``i`` (codes ``2i``, ``2i+1``) one
``prmt`` builds ``[sign(2i+1) x8 | byte_i(w) | sign(2i) x8 | byte_i(y)]`` (the ``prmt`` sign-replicate
mode turns the nibble's sign bit into a whole byte), ``(t << 2) & 0x81C081C0`` leaves each half as the
bf16 ``code * 2**-126`` (sign at bit 15, exponent bits 8..7 and mantissa bit 6 from the nibble), and
one ``mul.bf16x2`` by ``2**(e - 1 - SHIFT)`` leaves ``code * 2**(e - 127) * 2**-SHIFT``: 4 instructions per
pair plus one shift per word.  ``SHIFT`` = 32 keeps every product normal in bf16 for scales 2**-93 .. 2**33 (checked at
load, ``MAX_SCALE_BYTE``); the fp32 accumulator is multiplied back by 2**SHIFT.  ``decode_pair_bits``
below is the same algorithm in plain Python (the CPU tests check it code by code).

Words in the "lanes" layout (``formats.mxfp4_rows_to_lanes``) have their 32 bits stored so that register ``p`` is
the OR of one or two ``rotl(word, r) & mask`` terms (``formats.LANES_PAIR_TERMS``; ``LANES_DECODE_ASM``, built from
that table): 9 integer instructions per word instead of 13, bitwise the same registers.  H200, N=K=8192, back to
back, 1 / 8 / 16 tokens: 13.7 / 14.4 / 15.4 -> 12.6 / 13.1 / 14.2 us (``bench/results/2026-12-01T1800-h200``).

In Triton's CPU interpreter (``EXACT``: no inline PTX, and bf16 arithmetic is unreliable there) the
same tile is decoded with exact fp32 arithmetic and multiplied in fp32.

Split-K partials (fp32) are summed in split order, so results do not depend on scheduling: either by
the last program of each column block to finish (``REDUCE = 1``: an int32 arrival counter per column
block, reset by that program for the next call; one kernel) or by ``gemm_common.reduce_splits``
(``REDUCE = 0``: a second, tiny kernel).  Both are CUDA-graph safe (no host sync, fixed sizes).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from atom_kernels.dispatch import triton_interpreting
from atom_kernels.formats import LANES_BIT_SOURCES, LANES_PAIR_TERMS, MX_GROUP
from atom_kernels.ops._triton_common import dot_acc
from atom_kernels.ops.gemm_common import reduce_splits

SMALL_M_MAX = 16  # tokens; one 16-row MMA tile
_SHIFT = 32
_BLOCK_M = 16

# Default configuration and the alternatives the bench sweeps (each merged over DEFAULT):
#   mma: "sync" (tokens as the A operand, mma.sync, any block_n / num_warps) or "wgmma" (weights as the
#        A operand from registers: warpgroup MMA when block_n % 64 == 0 and num_warps % 4 == 0);
#   block_n: output columns per program; block_k: K per loop step; split_k: "auto" or a count; waves:
#   programs per SM that "auto" aims for; reduce: "in_kernel" (arrival counters, one kernel) or "pass"
#   (a second kernel).
# Tried on the H200 and removed (2026-11-30): loading 2 or 4 K steps before the first decode (more bytes in
# flight per program; ``bench/results/2026-11-30T1600-h200``): no variant beat one step (N=K=8192 M=1: 28.4 us
# with 4 x 128, 35.9 with 2 x 256, vs 25.4), so bytes in flight per program are not what limits it.
# Triton's own pipelining (num_stages > 1) does not help: the scale bytes stay synchronous loads, and with the
# scales read as int32 words (copied asynchronously too; tried 2026-11-30, ``bench/results/2026-11-30T1540-h200``)
# the decoded tile needs a layout conversion (5.7 instructions per weight instead of 3.2): 35-39 us vs 25.
# Nsight Compute on the H200 (2026-11-30, ``bench/results/2026-11-30T1900-h200``) then showed the L1/shared pipe
# 78% busy at 24% of DRAM bandwidth: the raw words went through shared memory (see ``mma_rows``).  Loaded in the
# operand's layout: 25.1 -> 18.3 us (M=1), 28.4 -> 20.3 us (M=16).  Tried on that kernel and removed (same
# folder): an L2 bulk prefetch of the next 1-8 K steps (cp.async.bulk.prefetch; per-row addresses become a
# serial loop over uniform registers: 24-34 us); a per-row line prefetch (prefetch.global.L1/L2) 1-2 steps
# ahead: 20.6-21.4 us; the next step's words and scales loaded before decoding this one (151 registers:
# 16.9 us at M=1 but 27.1 at M=16); activations in natural K order permuted in registers (161 registers:
# 21 us); 128-wide K steps at 6-8 programs per SM (72 registers: 19-23 us); load-ahead capped at 128 registers
# (24 bytes spilled): 16.9 / 20.7 us, not adopted for 7% at M=1 only; a weight repacked so that every program's
# K step is one contiguous 8 KB tile: 17.1 / 19.3 us (6%, not worth a kernel-specific checkpoint layout yet).
# What limits it now (sampled stalls of the default, same folder): 39% waiting on the global loads of the
# current step, 15% at the barrier before the MMA (the activation tile in shared memory), 14% issuing; 402
# instructions per 128 weights per thread, 272 of them the decode.  The marginal rate (K = 8192 -> 14336)
# is 2.2 TB/s: the steady state is slow, not the launch.
# The same kernel with its loads as cp.async copies into a shared-memory ring (``gluon_small_m``, sm_90,
# ``bench/results/2026-11-30T2230-h200``): 2 stages (one step ahead) 15.7-16.3 / 19.4-20.7 us vs 18.1 / 20.5;
# 3 and 4 stages were slower (16.8-18.6 at M=1; at M=16 the 16-wide activation slots leave room for only 3
# programs per SM: 23-34 us), so deeper prefetch is not what it lacks.  Also tried there: two warpgroups per
# program sharing the activation slots (half the activation traffic from L2: 16.7 / 22.4 us, slower) and
# splitting each step's MMA in two so the first half runs while the second decodes (16.1 / 19.6: no change);
# 96 registers for 5 programs per SM (16 bytes spilled: 16.9 / 26.1 us, slower).
# The 8-wide MMA for up to 8 tokens is worth 2.4 us at M=1 (18.1 -> 15.7).
# Where the rest goes (timing-only variants, ``bench/results/2026-12-01T0215-h200``, M=1 / 16 from 15.9 / 19.9 us):
# removing the per-step barrier and copy wait, or half the MMAs, changes nothing; TMA loads of the words, deeper
# rings and 5-6 programs per SM are no faster (one wave of 8-step programs: more prefetch only delays every first
# step).  What costs: the global split-K reduction (0.9 / 1.7 us; warpgroups splitting K inside one CTA through
# gl.warp_specialize were no faster: 16.1 / 23.6), the 4-byte activation copies (natural K order with 16-byte
# copies: -0.3 / -2.9 us) and the decode (a 9 + 4 op decode: -0.6 / -1.1 us).  The last two need the codes
# repacked at load; all four together reach 12.9 / 13.9 us (timing only).
# Tried on the PDL ring kernel and reverted (``bench/results/2026-12-01T1350-h200``, patches there; 14.3 / 16.0 us):
# the split-K sum inside a thread-block cluster through distributed shared memory (bitwise equal, but the H200 holds
# 124 active 4-CTA clusters, fewer than 128 column blocks: 20.8 / 23.1 us; where they fit it saves nothing: the wait
# is for the slowest program of a column block), an asynchronous MMA (no change), 128-row blocks with 128-wide steps
# (15.2 / 19.1) and 128-wide steps with rings of 2-6 slots (18.5-25 us: a program's time follows its step count).
# Default: wgmma, 64 columns, 256-wide K steps, ~4 programs per SM; the ring kernel with 2 or 3 stages
# (``ring_stages``) where it applies, else one stage of register loads (best on both 8192 cases).
# Tried on the ring kernel with the 9-instruction lanes decode and not kept (``bench/results/2026-12-01T1830-h200``,
# patches there, both bitwise equal): weights one step further ahead than activations (3 weight slots, 2 activation
# slots: 14.6 -> 14.8 us at 16 tokens, no gain at 1) and each program's K steps stored as contiguous 8 KB tiles
# ([64 rows x 256 K] per step: -0.3 us at 1 / 8 / 16 tokens, N=K=8192; a plan-dependent weight layout for every
# kernel that reads lanes, not worth it for 2%).
# Where 16 tokens go (per-program %globaltimer timelines, ``bench/results/2026-12-01T2040-h200``, N=K=8192): 8 K steps
# of ~1.16 us each after the PDL wait (1 token: 0.97), paced by the decode and MMA of 4 programs per SM, then ~2 us of
# split-K tail (release fence, arrival atomic, the last arriver's loads of the other partials: ~1.3 us under load).
# Tried there and not kept, both bitwise equal: the sum by a designated program (the last split) polling its partners'
# partials in a sentinel-filled workspace, no fence or atomic (1 / 16 tokens 12.59 / 14.30 -> 12.04 / 14.57 us; 16
# splits at N=1024 5.9 -> 12.5), and step 0 decoded before the PDL wait (12.45 / 14.21 -> 12.21 / 14.18; N=28672 8
# tokens after RMSNorm +1.6); and not bitwise equal, slower: one or two K steps moved from the last split (whose
# programs end last) to the first (16 tokens 14.12 -> 15.41 / 16.67 us; a program's time follows its step count).
# Ring kernel per K step (``bench/results/2026-12-02T0025-h200``, bitwise equal results): the scales unpacked two per
# register (``SCALE_PAIR_ASM``; 34 -> 16 instructions per step) and one barrier per step instead of three (separate slot
# buffers, the loop unrolled by the ring depth), the copies issued before the step's reads with 2 slots and after them
# with 3: N=K=8192 1 / 8 / 16 tokens 12.56 / 12.93 / 14.20 -> 11.84 / 12.28 / 13.93 us.  Tried there and not kept: an L2
# prefetch of the next 1-8 steps' weight lines before the PDL wait (16 tokens 14.02 -> 14.21-17.90 us, slower the more
# it fetched) and 2 or 4 warpgroups per program sharing the activation tile (14.24 -> 15.54 / 20.40 us).
# Ring kernel on "lanes" weights (``resident_scales``): each program copies its whole scale slice once, 8-byte runs,
# before its K loop (before the PDL wait with ``static_weights``) instead of one 4-byte copy per row block and step
# (18x the ideal shared-memory wavefronts); bitwise the same results.  H200, N=K=8192, back to back: 1 / 8 / 16
# tokens 14.4 / 15.0 / 16.2 -> 13.7 / 14.5 / 15.4 us (``bench/results/2026-12-01T1435-h200/resident-scales.json``).
# Ring depth (``stages="auto"``, ``ring_stages``): 3 slots where the MMA tile is 8 wide and each program has at least 8
# K steps, else 2.  H200, lanes weights, 2 -> 3 stages (``bench/results/2026-12-01T1830-h200/stage-study.json``):
# 1 / 8 tokens N=K=8192 (8 steps) 13.15 / 13.26 -> 12.59 / 12.97 us, N=8192 K=16384 (16 steps) 22.8 / 23.9 -> 21.9 /
# 22.5, N=28672 K=8192 (32) 41.4 / 41.5 -> 39.9 / 40.5; but at 16 tokens (16-wide activation slots) 3 stages cost
# 0.3 us at 8 steps and 15 us at 28-32 (3 programs per SM), and with 2-4 steps they gain nothing (-0.2 .. +0.6).
# Since the ring kernel takes one barrier per step (bench/results/2026-12-02T0025-h200), the 16-wide tile gains from 3
# slots too, on "lanes" weights, where 4 programs still fit on an SM (at most 16 steps: 3 x 16 KB of slots + up to 8 KB
# of resident scales).  H200, 12 / 16 tokens, 2 -> 3 slots (``bench/results/2026-12-02T0350-h200/wide-ring.json``):
# N=8192 K=16384 (16 steps) 24.4 / 24.7 -> 23.3 / 23.9 us, N=14336 K=4096 (8) 13.3 / 13.4 -> 12.8 / 13.1, N=K=8192 (8)
# 13.5 / 13.7 -> 13.3 / 13.8; with 28 steps (3 programs per SM) 41.9 / 42.0 -> 50.2 / 51.4 (``variants-5.json``).
DEEP_RING = dict(stages=3, max_tile_tokens=8, min_steps=8, max_wide_steps=16)
# Split-K of the ring kernel's 16-wide tile (9-16 tokens) under "auto", where the partials are summed one column per
# thread (no ``vec_sum``, below): at most 8 splits.  H200, lanes weights, 16
# tokens (``bench/results/2026-12-01T1830-h200/split-study.json``): N=1024 K=8192 16 -> 8 splits 8.9 -> 6.6 us,
# N=2048 K=8192 9.6 -> 7.9, N=1024 K=16384 32 -> 8 13.7 -> 10.6; where "auto" already gives 8 or fewer (N >= 3072
# at K=8192, K <= 4096) it was the fastest or within 0.1 us.  The 8-wide tile keeps "auto" (N=1024, 8 tokens:
# 16 splits 5.3 us, 8 splits 5.9).
WIDE_TILE_MAX_SPLIT = 8
# K parts (``gluon_small_m``, 9-16 tokens, "lanes" weights, where one CTA per SM covers the call in one wave): each
# program is 4 warpgroups that split its K range (warp specialization, each with its own ring and barriers) and add their
# sums in shared memory, so the split-K sum through global memory (partials, fence, arrival atomic, the last program's
# loads: ~1.8 us of the 16-token call's tail) goes.  Their K loops take one step per iteration (2 ring slots picked at
# run time): unrolled, 4 copies of the loop overflow the SM's instruction cache (Nsight Compute: stalled on "no
# instruction" 0.13 -> 3.0 warps per issue with 2 slots, 5.7 with 3).  H200, bitwise the results of split-K 4
# (``bench/results/2026-12-02T1000-h200/parts-study.json``), 16 tokens back to back / after RMSNorm: N=K=8192 13.83 /
# 14.81 -> 13.15 / 13.59 us, N=1024 K=16384 7.22 / 7.97 -> 6.18 / 6.69, N=2048 K=8192 6.16 / 7.39 -> 5.90 / 6.95,
# N=4096 K=8192 8.72 / 9.84 -> 8.96 / 9.58; at 1 / 8 tokens N=K=8192 back to back +0.3 / +0.5 us (after RMSNorm -0.5),
# so the 8-wide tile keeps one warpgroup per program; with more tiles than SMs (N=28672) slower (several waves).
K_PARTS = 4
K_PARTS_STAGES = 2
# Split-K sum (``vec_sum``, default on, where ``vec_sum_applies``: N % 16 == 0): partials stored and summed 4 columns
# (16 bytes) per thread, the sum over splits unrolled so every split's load is in flight at once; bitwise the same
# results.  What made many splits slow with 16 rows: H200, 16 tokens (``bench/results/2026-12-01T1830-h200/
# vec-study.json``), N=1024 K=8192 16 splits 8.85 -> 5.74 us, N=2048 K=8192 9.62 -> 6.60, N=1024 K=16384 32 splits
# 13.61 -> 7.35, each faster than the same shape at 8 splits (6.74 / 8.08 / 10.72); with 8 or fewer splits and at
# N=K=8192 (4 splits, 1 / 8 / 16 tokens) within 0.15 us either way.  With a ragged N (1000, rows not 16-byte aligned)
# the 4-column layout was 3 us slower (``reduce-variants.json``), so there the one-column layout stays, with
# ``WIDE_TILE_MAX_SPLIT``.
VEC_SUM_ALIGN = 16  # output features: N % 16 == 0 keeps every row of partials 16-byte aligned (N is specialized on 16)
DEFAULT: dict = dict(mma="wgmma", block_n=64, block_k=256, split_k="auto", waves=4, reduce="in_kernel", num_warps=4,
                     num_stages=1, loads="ring", stages="auto", narrow_m=True, pdl=True, resident_scales=True,
                     vec_sum=True, parts="auto")
SWEEP: list[dict] = [
    dict(),
    dict(narrow_m=False),
    dict(stages=2),
    dict(stages=3),
    dict(pdl=False),  # the ring kernel without programmatic dependent launch
    dict(resident_scales=False),  # the ring kernel copying each step's scale bytes into its ring slot
    dict(vec_sum=False),  # split-K partials one column per thread (and at most 8 splits at 9-16 tokens)
    dict(parts=1),  # the ring kernel without K parts (one warpgroup per program; the default up to 8 tokens)
    dict(num_warps=8, block_n=128, waves=2),  # two warpgroups share the activation slots
    dict(loads="registers"),  # the register-load kernel (the default before the ring, and on other GPUs)
    dict(loads="registers", num_stages=3),
    dict(loads="registers", block_n=128),
    dict(loads="registers", block_k=128, waves=6),
    dict(loads="registers", block_k=512),
    dict(loads="registers", mma="sync", block_n=128, num_stages=1),
    dict(loads="registers", waves=3),
    dict(loads="registers", waves=8),
    dict(loads="registers", split_k=1),
    dict(loads="registers", reduce="pass"),
]

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


@triton.jit
def word_runs(NB: tl.constexpr, C: tl.constexpr):
    """Word offsets ``[NB, 4C]`` of one K step's memory runs (row start 0): block ``b`` holds words ``4C b ..``."""
    return (tl.arange(0, NB) * (4 * C))[:, None] + tl.arange(0, 4 * C)[None, :]


@triton.jit
def run_scales(NB: tl.constexpr, C: tl.constexpr):
    """Scale offsets ``[NB, 4]`` (row start 0) of thread ``t``'s run in each block: group ``C b + C t // 4``."""
    return (tl.arange(0, NB) * C)[:, None] + (C * tl.arange(0, 4) // 4)[None, :]


@triton.jit
def logical_tile(words, e, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, C: tl.constexpr, WGMMA: tl.constexpr,
                 EXACT: tl.constexpr, SHIFT: tl.constexpr):
    """Memory runs ``words [BLOCK_N, NB, 4C]`` int32 and their scales ``e [BLOCK_N, NB, 4]`` -> the decoded
    weight tile ``[BLOCK_N, BLOCK_K]`` (values ``* 2**-SHIFT``) in the logical K order of ``activation_k``."""
    NB: tl.constexpr = BLOCK_K // (32 * C)
    W: tl.constexpr = BLOCK_K // 8
    words = tl.reshape(tl.permute(tl.reshape(words, (BLOCK_N, NB, 4, C)), (0, 1, 3, 2)), (BLOCK_N, W))  # [.., j, t]
    e = tl.reshape(tl.broadcast_to(e[:, :, None, :], (BLOCK_N, NB, C, 4)), (BLOCK_N, W))
    v = decode_words(words, e, SHIFT, EXACT)  # [BLOCK_N, W, 8]: code order within each word
    if WGMMA:  # code 2 p + l of word (j, t) -> logical 32 j + 8 p + 2 t + l
        v = tl.permute(tl.reshape(v, (BLOCK_N, NB, C, 4, 4, 2)), (0, 1, 2, 4, 3, 5))
    return tl.reshape(v, (BLOCK_N, BLOCK_K))


@triton.jit
def activation_k(BLOCK_K: tl.constexpr, C: tl.constexpr, WGMMA: tl.constexpr):
    """The natural K offset (from the step start) of each logical K position: logical
    ``32C blk + 32 j + 8 t + i`` ("sync") or ``32C blk + 32 j + 8 p + 2 t + l`` ("wgmma", i = 2 p + l) holds
    code ``i`` of memory word ``C t + j`` of block ``blk``, natural ``32C blk + 8 (C t + j) + i``."""
    kl = tl.arange(0, BLOCK_K)
    base = (kl // (32 * C)) * (32 * C) + 8 * ((kl // 32) % C)
    if WGMMA:
        kn = base + 8 * C * ((kl // 2) % 4) + 2 * ((kl // 8) % 4) + kl % 2
        return tl.max_contiguous(tl.multiple_of(kn, 2), 2)
    kn = base + 8 * C * ((kl // 8) % 4) + kl % 8
    return tl.max_contiguous(tl.multiple_of(kn, 8), 8)


@triton.jit
def mma_rows(BLOCK_N: tl.constexpr):
    """Tile row indices shaped ``[8, 4, 2, 1, BLOCK_N / 64]``, row = l + 16 w + 8 r + 64 a: the order in which
    the warpgroup MMA's register operand (4 warps) holds the rows -- lane // 4, warp, register, (a slot for
    the K blocks), repetition.

    Why: Triton's coalescing pass lays a load out by the address pattern alone (threads over the contiguous
    dimension first, then over the others in order), and a load is never re-laid out afterwards.  Loaded as
    ``[BLOCK_N, NB, 4C]`` the words came with rows 8..15 on another warp than the operand wants, and Triton
    moved every word through shared memory (4 barriers per K step; the scale bytes too).  Shaped like this,
    the words (``[8, 4, 2, NB, BLOCK_N / 64, 4C]``, 16-byte runs contiguous) and the scales
    (``[4, 8, 4, 2, NB, BLOCK_N / 64]``, no contiguous dimension) get the operand's own layout."""
    l = tl.arange(0, 8)[:, None, None, None, None]
    w = tl.arange(0, 4)[None, :, None, None, None] * 16
    r = tl.arange(0, 2)[None, None, :, None, None] * 8
    a = tl.arange(0, BLOCK_N // 64)[None, None, None, None, :] * 64
    return l + w + r + a


@triton.jit
def from_mma_rows(words, BLOCK_N: tl.constexpr, NB: tl.constexpr, X: tl.constexpr):
    """Words loaded as ``[8, 4, 2, NB, BLOCK_N / 64, X]`` (rows as ``mma_rows``) -> ``[BLOCK_N, NB, X]``."""
    return tl.reshape(tl.permute(words, (4, 1, 2, 0, 3, 5)), (BLOCK_N, NB, X))


@triton.jit
def from_mma_rows_t(scales, BLOCK_N: tl.constexpr, NB: tl.constexpr, X: tl.constexpr):
    """Scales loaded as ``[X, 8, 4, 2, NB, BLOCK_N / 64]`` -> ``[BLOCK_N, NB, X]``."""
    return tl.reshape(tl.permute(scales, (5, 2, 3, 1, 4, 0)), (BLOCK_N, NB, X))


@triton.jit
def _mxfp4_small_m_kernel(
    w_ptr, s_ptr, x_ptr, out_ptr, ws_ptr, lock_ptr, bias_ptr,
    N, M, stride_xm, stride_om,
    K: tl.constexpr, K_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr, C: tl.constexpr, HAS_BIAS: tl.constexpr,
    REDUCE: tl.constexpr, WGMMA: tl.constexpr, MMA_ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr, EXACT: tl.constexpr, SHIFT: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr,
):
    NB: tl.constexpr = BLOCK_K // (32 * C)  # blocks of 32*C elements per K step
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    mask_n = offs_n < N
    mask_m = offs_m < M
    blk = tl.arange(0, NB)
    if MMA_ROWS:  # loads shaped as the MMA operand holds the rows (mma_rows): no layout conversion after them
        rows = pid_n * BLOCK_N + mma_rows(BLOCK_N)  # [8, 4, 2, 1, BLOCK_N / 64]
        if not EVEN_N:
            rows = tl.where(rows < N, rows, 0)  # padding columns read column 0 (in bounds), never stored
        w_off = rows.to(tl.int64)[:, :, :, :, :, None] * (K // 8) + word_runs(NB, C)[None, None, None, :, None, :]
        w_off = tl.max_contiguous(w_off, [1, 1, 1, 1, 1, C])  # one thread's run: C words (not the 4C of a block)
        s_off = rows.to(tl.int64)[None, :, :, :, :, :] * (K // 32) + tl.trans(run_scales(NB, C))[:, None, None, None, :, None]
    else:
        rows = tl.where(mask_n, offs_n, 0) if not EVEN_N else offs_n
        w_off = rows.to(tl.int64)[:, None, None] * (K // 8) + word_runs(NB, C)[None, :, :]
        s_off = rows.to(tl.int64)[:, None, None] * (K // 32) + run_scales(NB, C)[None, :, :]
    kn = activation_k(BLOCK_K, C, WGMMA)
    x_off = offs_m.to(tl.int64)[:, None] * stride_xm + kn[None, :]
    if WGMMA:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)

    for step in range(0, K_SPLIT, BLOCK_K):
        k0 = pid_k * K_SPLIT + step
        if EVEN_K:
            words = tl.load(w_ptr + (w_off + k0 // 8))
            e = tl.load(s_ptr + (s_off + k0 // 32))
            x = tl.load(x_ptr + (x_off + k0), mask=mask_m[:, None], other=0.0)
        else:  # blocks past K read nothing (code 0, activation 0)
            blk_ok = (k0 // (32 * C) + blk) < K // (32 * C)
            if MMA_ROWS:
                w_ok = blk_ok[None, None, None, :, None, None]
                s_ok = blk_ok[None, None, None, None, :, None]
            else:
                w_ok = blk_ok[None, :, None]
                s_ok = blk_ok[None, :, None]
            words = tl.load(w_ptr + (w_off + k0 // 8), mask=w_ok, other=0)
            e = tl.load(s_ptr + (s_off + k0 // 32), mask=s_ok, other=0)
            x = tl.load(x_ptr + (x_off + k0), mask=mask_m[:, None] & ((k0 + kn) < K)[None, :], other=0.0)
        if MMA_ROWS:
            words = from_mma_rows(words, BLOCK_N, NB, 4 * C)
            e = from_mma_rows_t(e, BLOCK_N, NB, 4)
        w_tile = logical_tile(words, e, BLOCK_N, BLOCK_K, C, WGMMA, EXACT, SHIFT)
        x = x.to(tl.float32) if EXACT else x.to(tl.bfloat16)
        if WGMMA:
            acc = dot_acc(w_tile, tl.trans(x), acc, EXACT)
        else:
            acc = dot_acc(x, tl.trans(w_tile), acc, EXACT)
    if WGMMA:
        acc = tl.trans(acc)
    acc = acc * (2.0 ** SHIFT)

    out_offs = offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        ws_offs = offs_m.to(tl.int64)[:, None] * N + offs_n[None, :]
        tl.store(ws_ptr + pid_k.to(tl.int64) * M * N + ws_offs, acc, mask=mask)
        if REDUCE == 1:
            tl.debug_barrier()  # every thread's partial is written before the arrival is published
            arrived = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:  # the last program of this column block sums all partials in order
                total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for split in range(SPLIT_K):
                    total += tl.load(ws_ptr + split * M * N + ws_offs, mask=mask, other=0.0, cache_modifier=".cg")
                if HAS_BIAS:
                    total += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
                tl.store(out_ptr + out_offs, total.to(out_ptr.dtype.element_ty), mask=mask)
                tl.atomic_xchg(lock_ptr + pid_n, 0, sem="relaxed", scope="gpu")  # ready for the next call


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _sm_count(device: torch.device) -> int:
    return _num_sms(device.index or 0) if device.type == "cuda" else 8


def pick_split(tiles: int, k_iters: int, device: torch.device, waves: int) -> int:
    """About ``waves`` programs per SM (any count, not only powers of two), each with >= 2 K steps."""
    return max(1, min(waves * _sm_count(device) // max(tiles, 1), k_iters // 2))


_LOCKS: dict[tuple, torch.Tensor] = {}
_OUTGROWN_LOCKS: list[torch.Tensor] = []  # buffers replaced by larger ones: a captured CUDA graph may still use them


def _locks(device: torch.device, n: int) -> torch.Tensor:
    """Zeroed int32 arrival counters (one per column block) for the in-kernel split-K reduction; every call
    leaves them zero again.  One buffer per device and stream, so kernels on different streams never share
    a counter.  (Made during a CUDA-graph capture, the buffer comes from the graph's pool and its zeroing is
    part of the graph; the cache keeps it alive.)  A buffer that a larger call outgrows is kept alive too: a graph
    captured with it replays its address, which must not go back to the allocator for other tensors."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device.type, device.index, stream)
    buf = _LOCKS.get(key)
    if buf is None or buf.numel() < n:
        if buf is not None:
            _OUTGROWN_LOCKS.append(buf)
        buf = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        _LOCKS[key] = buf
    return buf


def loads_in_mma_rows(cfg: dict) -> bool:
    """Whether the weight loads can take the warpgroup MMA operand's row order (``mma_rows``): one warpgroup
    (4 warps) over whole 64-row MMA tiles."""
    return cfg["mma"] == "wgmma" and cfg["block_n"] % 64 == 0 and cfg["num_warps"] == 4


RING_SLOTS = (2, 3)  # the ring kernel's depths (its slots are separate buffers, picked at compile time)
RING_TRITON = "3.6."  # the Triton whose (experimental) Gluon API the ring kernel is written and verified against


def ring_applies(p: dict, k: int, x_stride: int, x_address: int, capability: tuple[int, int] | None) -> bool:
    """Whether ``gluon_small_m`` (the same kernel with its loads as asynchronous copies into a shared-memory
    ring) serves a call planned as ``p``: asked for (``loads="ring"``), on an sm_90 GPU (``capability``; None
    off the GPU or in the interpreter), the in-kernel split-K reduction, K a multiple of 128 with whole K steps
    per split (at least 2: Triton 3.6 fails to compile the one-step loop), 256-multiple K steps
    in the warpgroup-MMA arrangement with one or two warpgroups over whole 64-row repeats (or, with K parts, 4
    warp-specialized warpgroups over 64 columns with whole K steps, at least 2, per part), and activations that allow
    4-byte copies."""
    parts = p.get("parts", 1)
    warps_fit = (p["num_warps"] in (4, 8) and p["block_n"] % (16 * p["num_warps"]) == 0 if parts == 1 else
                 parts == K_PARTS and p["num_warps"] == 4 and p["block_n"] == 64
                 and p["k_split"] % (parts * p["block_k"]) == 0 and p["k_split"] >= 2 * parts * p["block_k"])
    return (p["loads"] == "ring" and capability is not None and capability[0] == 9 and p["mma"] == "wgmma" and warps_fit
            and p["reduce"] == "in_kernel" and p["stages"] in RING_SLOTS and k % 128 == 0 and p["block_k"] % 256 == 0
            and p["k_split"] * p["split"] == k and p["k_split"] >= 2 * p["block_k"]
            and x_stride % 2 == 0 and x_address % 4 == 0)


RESIDENT_SCALE_BYTES = 16384  # shared memory a program's resident scale slice may take (4 programs per SM)


def resident_scales_fit(p: dict) -> bool:
    """Whether the ring kernel keeps a program's whole scale slice (``k_split / 32`` bytes per row) in shared memory
    for a plan ``p`` that asks for it (``resident_scales``); otherwise each step's scales ride in its ring slot."""
    return bool(p.get("resident_scales")) and p["k_split"] // MX_GROUP * p["block_n"] <= RESIDENT_SCALE_BYTES


def plan(m: int, n: int, k: int, device: torch.device, config: dict | None = None, layout: str = "lanes") -> dict:
    """Launch parameters of one call on weights in ``layout`` (a dict the bench records)."""
    cfg = dict(DEFAULT, **(config or {}))
    block_k = cfg["block_k"]
    if block_k % MX_GROUP or block_k & (block_k - 1):
        raise ValueError(f"block_k must be a power of two >= {MX_GROUP}, got {block_k}")
    c = chunk_groups(k, block_k)
    tiles = triton.cdiv(n, cfg["block_n"])
    k_iters = triton.cdiv(k, block_k)
    tile_tokens = ring_tile_tokens(m, cfg)
    parts = K_PARTS if cfg["parts"] == "auto" and tile_tokens > 8 else 1 if cfg["parts"] == "auto" else cfg["parts"]
    if not (cfg["loads"] == "ring" and layout == "lanes" and cfg.get("resident_scales") and cfg["block_n"] == 64
            and cfg["num_warps"] == 4 and k_iters % parts == 0 and k_iters // parts >= 2):
        parts = 1
    split = cfg["split_k"]
    if split == "auto":
        split = pick_split(tiles * parts, k_iters // parts, device, cfg["waves"])
        if cfg["loads"] == "ring" and tile_tokens > 8 and not vec_sum_applies(cfg, n):
            split = min(split, WIDE_TILE_MAX_SPLIT)
    split = max(1, min(int(split), k_iters))
    if cfg["loads"] == "ring":  # the ring kernel takes whole K steps per split (and, under "auto", per part)
        while split > 1 and k_iters % (split * (parts if cfg["split_k"] == "auto" else 1)):
            split -= 1
    k_split = triton.cdiv(k_iters, split) * block_k
    split = triton.cdiv(k, k_split)
    part_steps = k_split // block_k // parts
    if parts > 1 and (part_steps * parts * block_k != k_split or part_steps < 2  # whole K steps, >= 2 per part
                      or not resident_scales_fit(dict(cfg, k_split=k_split))  # K parts read resident scales only
                      or cfg["parts"] == "auto" and tiles * split > _sm_count(device)):  # and (auto) take one wave
        return plan(m, n, k, device, dict(cfg, parts=1), layout)
    stages = cfg["stages"]
    if stages == "auto":
        stages = K_PARTS_STAGES if parts > 1 else ring_stages(tile_tokens, k_split // block_k, lanes=layout == "lanes")
    return dict(cfg, c=c, tiles=tiles, split=split, k_split=k_split, mma_rows=loads_in_mma_rows(cfg), stages=stages,
                parts=parts)


def vec_sum_applies(cfg: dict, n: int) -> bool:
    """Whether the ring kernel stores and sums its split-K partials 16 bytes per thread (``vec_sum``, N % 16 == 0)."""
    return bool(cfg.get("vec_sum", True)) and n % VEC_SUM_ALIGN == 0


def ring_tile_tokens(m: int, cfg: dict) -> int:
    """The width of the ring kernel's MMA tile: 8 up to 8 tokens (unless ``narrow_m`` is off), else 16."""
    return 8 if m <= 8 and cfg.get("narrow_m", True) else 16


def ring_stages(tile_tokens: int, steps: int, lanes: bool = True) -> int:
    """Shared-memory slots of the ring kernel for an MMA tile ``tile_tokens`` wide and ``steps`` K steps per program
    (``DEEP_RING``: deeper where the programs are long enough to use it, and with the wide tile's larger activation slots
    only on "lanes" weights (resident scales; on the checkpoint's order that loop spills) while 4 programs still fit on
    an SM)."""
    fits = tile_tokens <= DEEP_RING["max_tile_tokens"] or (lanes and steps <= DEEP_RING["max_wide_steps"])
    return DEEP_RING["stages"] if steps >= DEEP_RING["min_steps"] and fits else 2


def _ring_capability(device: torch.device) -> tuple[int, int] | None:
    """The compute capability the ring kernel may run on (None off the GPU, in the interpreter, or with a Triton
    other than ``RING_TRITON``)."""
    if device.type != "cuda" or triton_interpreting() or not triton.__version__.startswith(RING_TRITON):
        return None
    return torch.cuda.get_device_capability(device)


def ring_serves(x: torch.Tensor, n: int, config: dict | None = None) -> bool:
    """Whether a call with activations ``x`` and ``n`` output features runs the ring kernel."""
    m, k = x.shape
    return ring_applies(plan(m, n, k, x.device, config), k, x.stride(0), x.data_ptr(), _ring_capability(x.device))


def lanes_serve(n: int, k: int, device: torch.device) -> bool:
    """Whether decode-sized calls of an ``[n, k]`` weight on ``device`` run the ring kernel (K-contiguous,
    4-byte aligned activations), the one that reads the ``"lanes"`` layout faster."""
    device = torch.device(device)
    return ring_applies(plan(SMALL_M_MAX, n, k, device), k, k, 0, _ring_capability(device))


def mxfp4_mm_small_m(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None,
                     config: dict | None = None, out: torch.Tensor | None = None,
                     workspace: torch.Tensor | None = None, layout: str = "rows",
                     static_weights: bool = False) -> torch.Tensor:
    """``x [M <= 16, K] @ dequant(w, w_scale).T (+ bias)``; ``out`` and ``workspace`` (fp32, at least
    ``split * M * N``) may be given (the tests pass poisoned ones).  ``static_weights``: no recent kernel on the
    stream writes ``w`` / ``w_scale`` (``gluon_small_m``: the ring kernel then starts copying them before it waits
    for the previous kernel).  Weights in the ``"lanes"`` layout are read by
    the ring kernel only (``ring_serves``; ``triton.mxfp4_mm`` sends other calls to the warpgroup-MMA kernel)."""
    m, k = x.shape
    n = w.shape[0]
    if m > SMALL_M_MAX:
        raise ValueError(f"the small-M MXFP4 kernel takes at most {SMALL_M_MAX} tokens, got {m}")
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    if x.stride(1) != 1:  # both kernels read a row's K as consecutive elements
        x = x.contiguous()
    p = plan(m, n, k, x.device, config, layout)
    split = p["split"]
    reduce_in_kernel = p["reduce"] == "in_kernel"
    locks = _locks(x.device, p["tiles"]) if split > 1 and reduce_in_kernel else None
    if split > 1 and workspace is None:
        workspace = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
    if ring_applies(p, k, x.stride(0), x.data_ptr(), _ring_capability(x.device)):
        from atom_kernels.ops.mxfp4_mm.gluon_small_m import launch_ring  # Gluon: sm_90 only, imported on use

        launch_ring(x, w, w_scale, out, workspace, locks, bias, p, _SHIFT, lanes=layout == "lanes",
                    static_weights=static_weights)
    elif layout != "rows":
        raise ValueError(f"the register-load small-M kernel reads the 'rows' layout, not {layout!r}")
    else:
        _mxfp4_small_m_kernel[(p["tiles"], split)](
            w.view(torch.int32), w_scale.view(torch.uint8), x, out, workspace if split > 1 else out,
            locks if locks is not None else out, bias if bias is not None else out,
            n, m, x.stride(0), out.stride(0),
            K=k, K_SPLIT=p["k_split"], SPLIT_K=split, C=p["c"], HAS_BIAS=bias is not None,
            REDUCE=1 if reduce_in_kernel else 0, WGMMA=p["mma"] == "wgmma", MMA_ROWS=p["mma_rows"], BLOCK_N=p["block_n"],
            BLOCK_M=_BLOCK_M,
            BLOCK_K=p["block_k"],
            EXACT=triton_interpreting(), SHIFT=_SHIFT, EVEN_N=n % p["block_n"] == 0, EVEN_K=p["k_split"] * split == k,
            num_warps=p["num_warps"], num_stages=p["num_stages"],
        )
    if split > 1 and not reduce_in_kernel:
        reduce_splits(workspace[:split].view(split, m, n), out, bias)
    return out
