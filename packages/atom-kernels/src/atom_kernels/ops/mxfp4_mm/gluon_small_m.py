"""The small-M MXFP4 kernel of ``triton_small_m`` with its loads made asynchronous (Gluon, sm_90).

Same math, K permutation, decode and split-K reduction as ``triton_small_m`` (read its docstring first);
what differs is how the bytes arrive.  There, a K step's weight words, scale bytes and activations are
ordinary loads into registers, issued when the step starts: Nsight Compute sampled 39% of the warps
waiting on them, and loading the next step ahead in registers cost too many registers (151).  Here they
are ``cp.async`` copies into a ring of ``STAGES`` shared-memory slots, issued ``STAGES - 1`` steps ahead, so
the copies of later steps are in flight while this step decodes, without holding registers:

* weight words: each thread copies the 16-byte runs it will decode, shaped as the warpgroup MMA operand
  holds the rows (``[8 lanes, 4 warps, 2 registers, K blocks, repeats, 16 words]``, as ``mma_rows``), and
  reads the same runs back (``LDS.128``) in the same layout; the slot's physical order puts a row's 16 words
  next to the next lane's, so a quarter warp's 16-byte reads hit 32 distinct banks;
* scale bytes: 4-byte copies (the 4 groups of one row's 128-element block), read back one byte per thread in
  the layout the decode wants;
* activations: 4-byte copies (2 K-adjacent values, the ``"wgmma"`` permutation's runs) into the MMA's
  B-operand tile (128-byte swizzle), 8 rows wide up to 8 tokens, else 16; rows past ``M`` copy row ``M - 1``
  again (no predicate per copy): they only reach output columns past ``M``, which are never stored.

Weights in the ``"lanes"`` byte order (``LANES``; ``formats.mxfp4_rows_to_lanes``) put each code where this
kernel's logical K order wants it, so the activations are copied in natural K order, 16 bytes at a time, rows
past ``M`` zero-filled (a re-read row would come from L2: 16-byte copies bypass L1); where the activation rows are K
apart (``X_CONTIGUOUS``, the usual case) a thread's 4 rows are one address plus constants (no clamp: the masked rows are
never read), 16 fewer instructions per K step at 16 tokens (H200, ``bench/results/2026-12-02T0350-h200/wide-ring.json``:
N=K=8192 12 / 16 tokens 13.79 / 14.09 -> 13.51 / 13.72 us, N=28672 K=8192 44.6 / 44.7 -> 43.5 / 43.8, N=8192 K=28672
41.7 / 42.0 -> 40.6 / 41.2, 1-8 tokens and shapes of at most 4 K steps per program within noise); each thread then reads the 4
scale groups of its row blocks (word ``j`` of every thread is in group ``j``).  H200, N=K=8192: 16 tokens
19.6 -> 17.6 us, 8 tokens 17.2 -> 16.5, 1 token unchanged (``bench/results/2026-12-01T0300-h200``).  The layout also
stores each word's bits where ``LANES_DECODE_ASM`` decodes them in 9 integer instructions instead of 13
(``triton_small_m``): 1 / 16 tokens 13.7 / 15.4 -> 12.6 / 14.2 us (``bench/results/2026-12-01T1800-h200``).

Resident scales (``p["resident_scales"]``, the default, with "lanes" weights where ``resident_scales_fit``): each
program copies its whole scale slice once, a row's 8 scale bytes of every K step in one 8-byte copy, into a
``[steps, rows, 2 words]`` buffer, before its K loop (before the PDL wait with ``static_weights``), and each step reads
its rows' 32-bit scale words (4 groups each) straight in the decode's register layout.  Each word becomes two registers
of paired bf16 multipliers, groups ``(4b, 4b+2)`` and ``(4b+1, 4b+3)`` (one ``prmt`` and one ``mad`` per pair:
``triton_small_m.SCALE_PAIR_ASM``), and each decoded word's 4 multiplies take their half of the pair inside the
instruction (``LANES_DECODE_ASM_LOW`` / ``_HIGH``: ``HMUL2 ... R.H0_H0``): 16 instructions per step to unpack 16 scales
instead of 34 (``bench/results/2026-12-02T0025-h200``, bitwise the same results).  Per
step the scales were a 4-byte copy per row block into the ring slot: 18x the ideal shared-memory wavefronts (Nsight
Compute, ``bench/results/2026-12-01T0215-h200``) and, timed without them, 1 us of the kernel.  Bitwise the same
results; H200, N=K=8192, back to back, 1 / 8 / 16 tokens: 14.4 / 15.0 / 16.2 -> 13.7 / 14.5 / 15.4 us
(``bench/results/2026-12-01T1435-h200``; the timing-only runs that found it: ``2026-12-01T1350-h200``).

Programmatic dependent launch (PDL, ``p["pdl"]``, the default): the kernel is launched so that it may start while
the kernel before it on the stream still runs, lets the next kernel launch as soon as all its own programs have
started (``griddepcontrol.launch_dependents``), and waits for the previous kernel (``griddepcontrol.wait``) before
it reads anything that kernel may have written (activations, workspace, arrival counters).  With
``static_weights`` (a layer's parameters: nothing on the stream writes them while it serves) the first steps' weight
and scale copies are issued before that wait, so the weights start streaming while the previous kernel finishes.
It pays off only when the previous kernel lets this one launch early (ATOM's RMSNorm, SiLU-and-mul and this kernel
do).  H200, N=K=8192, 1 / 16 tokens: back to back 16.4 / 19.8 us without PDL, 14.5 / 16.2 with it; after ATOM's
RMSNorm 14.7 / 17.3 (pair minus the norm), after a plain copy 16.3 / 18.4 (``bench/results/2026-12-01T1040-h200``).
Copying the weights before the wait is most of the gain (PDL alone: 16.3 -> 15.5 at 1 token); an L2 bulk prefetch of
each program's whole weight slice before the wait made it slower (19.8 us), and so did a third ring stage.

One or two warpgroups per program (``num_warps`` 4 or 8; two share the activation slots, each owning every
other 64-row repeat).  Each step (``_ring_step``): wait for its copy group, fence (the MMA reads shared memory through
the async proxy), barrier (every thread's copies landed, and no thread still reads the slot that the next copies
overwrite), read its words and scales and issue the copies of step ``+ STAGES - 1`` (the copies first with 2 slots,
where they are for the next step; the reads first with 3), decode, one warpgroup MMA (weights from registers,
activations from the slot).  That barrier is the only one per step: the slots are separate buffers and the loop is
unrolled by the ring depth (each slot a compile-time choice), and the wait and the fence are PTX the compiler does not
interpret; with one ring buffer indexed at run time the compiler added two more barriers per step.  With the paired
scales above, H200, back to back (``bench/results/2026-12-02T0025-h200/order-ab.json``, bitwise equal results):
N=K=8192 1 / 8 / 16 tokens 12.56 / 12.93 / 14.20 -> 11.84 / 12.28 / 13.93 us, N=28672 K=8192 39.5 / 40.1 / 45.0 ->
36.2 / 37.3 / 44.5 us.  Checkpoint-order weights ("rows") spill 88 bytes at 16 tokens in this loop (18.4 -> 20.5 us;
sm_90 serving repacks to "lanes").
K parts (``PARTS`` = 4, ``p["parts"]``; the planner's default for the 16-wide tile where the call is one wave,
``triton_small_m.K_PARTS``): a program is 4 warpgroups over the same 64 columns, each summing a quarter of the program's
K range through a ring of its own, as warp-specialized partitions (``gl.warp_specialize``: every partition's barriers
are its own 128 threads', so the warpgroups never wait for each other inside the loop); the 3 workers' sums meet the
default partition's in shared memory (an mbarrier), added in part order, so the results are bitwise those of 4 splits.
One such program per SM replaces the 4 split-K programs and their sum through global memory (~1.8 us of the
16-token call's tail).  Their K loops take one step per iteration (2 slots picked at run time; the compiler then adds a
barrier per step): unrolled, the 4 partitions' copies of the loop overflow the instruction cache.  Measured (H200,
``bench/results/2026-12-02T1000-h200``): a 16-warp program whose warpgroups share the CTA's barrier runs in lockstep,
16 tokens 13.8 -> 17.0 us; warp-specialized and unrolled, 13.6 (3 slots: 17.3, Nsight Compute "no instruction" stalls
0.13 -> 3.0 / 5.7 warps per issue); rolled, 13.15 (after RMSNorm 14.81 -> 13.59).
Registers are capped at 128 (``MAX_REGISTERS``) so that 4 programs of one warpgroup fit on an SM.  Split-K partials
go through the fp32 workspace; where N % 16 == 0 (``VEC_SUM``, ``triton_small_m.vec_sum_applies``) 4 columns (16
bytes) per thread and the last program's sum over splits unrolled, which keeps 16-32 splits cheap at 16 tokens.

Preconditions (``triton_small_m.ring_applies``, a pure function; otherwise the register-load kernel runs):
Triton 3.6 (Gluon is experimental; its API moves between releases), an NVIDIA GPU of compute capability 9.x, a ring of 2
or 3 slots (``RING_SLOTS``),
``K % 128 == 0`` (16-byte weight runs, 4-byte scale runs), ``block_k`` a multiple of 256, ``block_n`` a
multiple of ``16 * num_warps``, at least 2 whole K steps per split, the in-kernel split-K reduction, and
activations whose row stride and address allow 4-byte copies.  Gluon kernels do not run in Triton's CPU
interpreter: the CPU tests compile this one for sm_90 and check its SASS (``tests/test_sm90_compile.py``)
and its preconditions; its results are checked on the GPU (``tests/test_mxfp4_small_m.py``, summaries
committed under ``bench/results``).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy, fence_async_shared, mbarrier, warpgroup_mma

from atom_kernels.ops._pdl import launch_options
from atom_kernels.ops.mxfp4_mm.triton_small_m import (  # word -> 4 bf16x2 (checkpoint / "lanes" bits)
    DECODE_ASM,
    LANES_DECODE_ASM,
    LANES_DECODE_ASM_HIGH,
    LANES_DECODE_ASM_LOW,
    SCALE_PAIR_ASM,
    resident_scales_fit,
    ring_tile_tokens,
    vec_sum_applies,
)

MAX_REGISTERS = 128  # per thread: 4 programs of 4 warps per SM (uncapped, 16 tokens took 164: 3 programs)
PART_REGISTERS = gl.constexpr(MAX_REGISTERS)  # per thread of each K-part worker partition
RUN_WORDS = gl.constexpr(16)  # words of one 128-element block (4 threads x 4 words)


@gluon.constexpr_function
def _axis_layout(parent, rank, dim):
    """The layout of a 1-D ``arange`` that ``_axis`` expands into ``parent`` along every dimension but ``dim``."""
    layout = parent
    for d in reversed([d for d in range(rank) if d != dim]):
        layout = gl.SliceLayout(d, layout)
    return layout


@gluon.jit
def _axis(n: gl.constexpr, dim: gl.constexpr, rank: gl.constexpr, parent: gl.constexpr):
    """``arange(n)`` along dimension ``dim`` of a rank-``rank`` tensor of layout ``parent`` (size 1 elsewhere)."""
    x = gl.arange(0, n, layout=_axis_layout(parent, rank, dim))
    for d in gl.static_range(rank):
        if d != dim:
            x = gl.expand_dims(x, d)
    return x


@gluon.jit
def _split_pair(p):
    lo = p.to(gl.int16).to(gl.bfloat16, bitcast=True)
    hi = (p >> 16).to(gl.int16).to(gl.bfloat16, bitcast=True)
    return gl.join(lo, hi)


@gluon.jit
def _decoded_tile(words6, e6, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr, SHIFT: gl.constexpr,
                  LANES: gl.constexpr):
    """Words ``[8, 4, 2, NB, R, 16]`` (rows as the MMA holds them) and scales -> the bf16 tile
    ``[BLOCK_N, BLOCK_K]`` (``* 2**-SHIFT``) in the ``"wgmma"`` logical K order.  Scales: ``[4, 8, 4, 2, NB, R]``
    (group ``t`` of thread ``t``: checkpoint layout), or with ``LANES`` ``[4, 8, 4, 2, NB, R, 4]`` (groups 0..3 of
    the block, the same for the 4 threads of a row: word ``j`` of every thread is in group ``j``)."""
    NB: gl.constexpr = BLOCK_K // 128
    W: gl.constexpr = BLOCK_K // 8
    words = gl.reshape(gl.permute(words6, (4, 1, 2, 0, 3, 5)), (BLOCK_N, NB, 4, 4))  # [row, block, t, j]
    words = gl.reshape(gl.permute(words, (0, 1, 3, 2)), (BLOCK_N, W))  # [row, (block, j, t)]
    if LANES:
        e = gl.reshape(gl.permute(e6, (5, 2, 3, 1, 4, 0, 6)), (BLOCK_N, W))  # [row, (block, group j, t)]
        mult = (e.to(gl.int32) + (127 - SHIFT - 1)) * 0x00800080  # the scale's bf16 bits in both halves
        mult = gl.convert_layout(mult, words.type.layout)
    else:
        e = gl.reshape(gl.permute(e6, (5, 2, 3, 1, 4, 0)), (BLOCK_N, NB, 4))  # [row, block, t]
        mult = (e.to(gl.int32) + (127 - SHIFT - 1)) * 0x00800080  # the scale's bf16 bits in both halves
        mult = gl.join(gl.join(mult, mult), gl.join(mult, mult))  # the same scale for the 4 words j of a run
        mult = gl.reshape(gl.permute(gl.reshape(mult, (BLOCK_N, NB, 4, 4)), (0, 1, 3, 2)), (BLOCK_N, W))
    p0, p1, p2, p3 = gl.inline_asm_elementwise(LANES_DECODE_ASM if LANES else DECODE_ASM, "=r,=r,=r,=r,r,r", [words, mult],
                                               dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True, pack=1)
    return _tile_from_pairs(p0, p1, p2, p3, BLOCK_N, BLOCK_K)


@gluon.jit
def _tile_from_pairs(p0, p1, p2, p3, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    """The decode's 4 bf16x2 registers per word ``[BLOCK_N, (block, j, t)]`` -> the tile ``[BLOCK_N, BLOCK_K]`` in the
    ``"wgmma"`` logical K order."""
    NB: gl.constexpr = BLOCK_K // 128
    v = gl.join(gl.join(_split_pair(p0), _split_pair(p1)), gl.join(_split_pair(p2), _split_pair(p3)))
    v = gl.permute(v, (0, 1, 4, 3, 2))  # [row, word, code]
    v = gl.permute(gl.reshape(v, (BLOCK_N, NB, 4, 4, 4, 2)), (0, 1, 2, 4, 3, 5))  # code 2p+l of (j, t) -> 32j+8p+2t+l
    return gl.reshape(v, (BLOCK_N, BLOCK_K))


@gluon.jit
def _split_words(words6, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    """Words ``[8, 4, 2, NB, R, 16]`` (rows as the MMA holds them) -> those of ``j = 0, 1`` and of ``j = 2, 3``, each
    ``[row, block, t, j % 2]`` (word ``4 t + j`` of a block; ``j`` is the word's scale group within the block)."""
    NB: gl.constexpr = BLOCK_K // 128
    words = gl.reshape(gl.permute(words6, (4, 1, 2, 0, 3, 5)), (BLOCK_N, NB, 4, 2, 2))  # [row, block, t, j//2, j%2]
    return gl.split(gl.permute(words, (0, 1, 2, 4, 3)))


@gluon.jit
def _decoded_tile_paired(first, second, scale_words, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    """``_decoded_tile`` for "lanes" words (``_split_words``) with the step's scales as 32-bit words (``scale_words
    [BLOCK_N, NB]``: groups ``4 b .. 4 b + 3`` of a row, a row's 4 threads alike): each becomes two registers of paired
    multipliers (``SCALE_PAIR_ASM``: groups ``(4b, 4b+2)`` and ``(4b+1, 4b+3)``), and word ``j`` of a thread takes half
    ``j // 2`` of pair ``j % 2`` inside the multiply (``LANES_DECODE_ASM_LOW`` / ``_HIGH``)."""
    NB: gl.constexpr = BLOCK_K // 128
    lo, hi = gl.inline_asm_elementwise(SCALE_PAIR_ASM, "=r,=r,r", [scale_words], dtype=(gl.int32, gl.int32),
                                       is_pure=True, pack=1)
    lo = gl.expand_dims(lo, 2).broadcast_to([BLOCK_N, NB, 4])
    hi = gl.expand_dims(hi, 2).broadcast_to([BLOCK_N, NB, 4])
    mult = gl.convert_layout(gl.join(lo, hi), first.type.layout)  # [row, block, t, j%2]
    a0, a1, a2, a3 = gl.inline_asm_elementwise(LANES_DECODE_ASM_LOW, "=r,=r,=r,=r,r,r", [first, mult],
                                               dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True, pack=1)
    b0, b1, b2, b3 = gl.inline_asm_elementwise(LANES_DECODE_ASM_HIGH, "=r,=r,=r,=r,r,r", [second, mult],
                                               dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True, pack=1)
    return _tile_from_pairs(_word_order(a0, b0, BLOCK_N, BLOCK_K), _word_order(a1, b1, BLOCK_N, BLOCK_K),
                            _word_order(a2, b2, BLOCK_N, BLOCK_K), _word_order(a3, b3, BLOCK_N, BLOCK_K), BLOCK_N, BLOCK_K)


@gluon.jit
def _word_order(first, second, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr):
    """Registers of words ``j = 0, 1`` and ``j = 2, 3`` (``[row, block, t, j % 2]`` each) -> ``[row, (block, j, t)]``."""
    return gl.reshape(gl.permute(gl.join(first, second), (0, 1, 4, 3, 2)), (BLOCK_N, BLOCK_K // 8))


@gluon.jit
def _opaque_zero():
    """0, as a value the compiler cannot fold (a constant-index round fails to compile in Triton 3.6)."""
    return gl.inline_asm_elementwise("mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=True, pack=1)


@gluon.constexpr_function
def _wait_asm(pending):
    return f"cp.async.wait_group {pending};"


@gluon.jit
def _asm_statement(asm: gl.constexpr):
    """One PTX statement with side effects (``griddepcontrol.*``, ``cp.async.wait_group``, ``fence.proxy.async``), out of
    the compiler's sight: it adds no barrier of its own around it."""
    gl.inline_asm_elementwise(asm + " // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.constexpr_function
def _scale_fill_layout(block_n, warpgroups, words):
    """One step's scales ``[block_n rows, words]`` (32-bit words of 4 groups) for the copy: a row's ``words`` per thread
    (one copy); threads beyond the rows hold duplicates, which the copy masks off."""
    row_warps = min(block_n // 32, 4 * warpgroups)
    return gl.BlockedLayout([1, words], [32, 1], [row_warps, 4 * warpgroups // row_warps], [1, 0])


@gluon.jit
def _copy_scales(scales_smem, s_ptr, f_off, w0, STEPS: gl.constexpr, WORDS: gl.constexpr):
    """Copy a program's whole scale slice (32-bit words of 4 groups, from word ``w0``) into ``scales_smem [STEPS, rows,
    WORDS]``."""
    for s in gl.static_range(STEPS):
        async_copy.async_copy_global_to_shared(scales_smem.index(s), s_ptr + (f_off + (w0 + s * WORDS)))


@gluon.jit
def _issue_weight_copies(w_slot, s_slot, w_ptr, s_ptr, w_off, s_off, k0, SCALES: gl.constexpr):
    async_copy.async_copy_global_to_shared(w_slot, w_ptr + (w_off + k0 // 8))
    if SCALES:  # (else the program's scales are already resident)
        async_copy.async_copy_global_to_shared(s_slot, s_ptr + (s_off + k0 // 32))


@gluon.jit
def _issue_copies(w_slot, s_slot, x_slot, w_ptr, s_ptr, x_ptr, w_off, s_off, x_off, x_mask, k0, SCALES: gl.constexpr):
    """Start the copies of the K step at ``k0`` into one ring slot (its weight, scale and activation buffers)."""
    _issue_weight_copies(w_slot, s_slot, w_ptr, s_ptr, w_off, s_off, k0, SCALES)
    async_copy.async_copy_global_to_shared(x_slot, x_ptr + (x_off + k0), mask=x_mask)


@gluon.jit
def _issue_ahead(step, w_next, s_next, x_next, w_ptr, s_ptr, x_ptr, w_off, s_off, x_off, x_mask, k_start,
                 STEPS: gl.constexpr, STAGES: gl.constexpr, BLOCK_K: gl.constexpr, RESIDENT: gl.constexpr):
    """The copies of step ``step + STAGES - 1`` (if there is one) into the slot step ``step - 1`` used."""
    ahead = step + STAGES - 1
    if ahead < STEPS:
        _issue_copies(w_next, s_next, x_next, w_ptr, s_ptr, x_ptr, w_off, s_off, x_off, x_mask, k_start + ahead * BLOCK_K,
                      not RESIDENT)


@gluon.jit
def _slot(j: gl.constexpr, a, b, c, ROLLED: gl.constexpr):
    """Ring slot ``j`` (a compile-time index): of one stacked buffer ``a`` (``ROLLED``), else ``_pick``."""
    if ROLLED:
        return a.index(j)
    else:
        return _pick(j, a, b, c)


@gluon.jit
def _pick(j: gl.constexpr, a, b, c):
    """Ring slot ``j``'s buffer out of its three (separate allocations: see ``_ring_step``); ``j = -1``: the last slot
    (``c`` is ``b`` in a ring of 2)."""
    if j == 0:
        return a
    elif j == 1:
        return b
    else:
        return c


@gluon.jit
def _ring_step(acc, step, w_slot, s_slot, x_slot, w_next, s_next, x_next, s_res, w_ptr, s_ptr, x_ptr, w_off, s_off,
               x_off, x_mask, k_start, STEPS: gl.constexpr, STAGES: gl.constexpr, BLOCK_N: gl.constexpr,
               BLOCK_K: gl.constexpr, SHIFT: gl.constexpr, LANES: gl.constexpr, RESIDENT: gl.constexpr,
               WORDS: gl.constexpr, SCALE_LANES: gl.constexpr, SCALE_READ: gl.constexpr, A_OPERAND: gl.constexpr):
    """K step ``step``: wait for its copies (ring slot ``*_slot``), read its words and scales (``s_res``: the resident
    slice), start the copies of step ``step + STAGES - 1`` into the slot step ``step - 1`` used (``*_next``), decode,
    MMA.  The slots are separate allocations, and the wait and fence are PTX the compiler does not interpret, so the
    only barrier per step is the one below: with one ring buffer indexed by a runtime slot the compiler cannot tell a
    step's copies from its reads and adds two more (after the wait, and between the copies and the reads)."""
    NB: gl.constexpr = BLOCK_K // 128
    R: gl.constexpr = BLOCK_N // 64
    _asm_statement(_wait_asm(STAGES - 2))  # this step's copies (this thread's) have landed
    _asm_statement("fence.proxy.async.shared::cta;")  # ... and are visible to the MMA's async proxy
    gl.thread_barrier()  # every thread's copies landed and fenced; nobody still reads the slot refilled below
    if STAGES == 2:  # the copies are for the next step: start them first
        _issue_ahead(step, w_next, s_next, x_next, w_ptr, s_ptr, x_ptr, w_off, s_off, x_off, x_mask, k_start, STEPS,
                     STAGES, BLOCK_K, RESIDENT)
    words = w_slot.load(WORDS)
    if RESIDENT:  # the step's scale words, read in the decode's row order
        first, second = _split_words(words, BLOCK_N, BLOCK_K)
        scale_words = s_res.index(step).load(gl.SliceLayout(2, gl.SliceLayout(3, first.type.layout)))
    elif LANES:
        e = gl.expand_dims(s_slot.load(gl.SliceLayout(6, SCALE_LANES)), 6)
        e = e.broadcast_to([4, 8, 4, 2, NB, R, 4])  # the same 4 groups for the 4 threads of a row
    else:
        e = s_slot.load(SCALE_READ)
    if STAGES > 2:  # the copies are for a later step: this step's reads first
        _issue_ahead(step, w_next, s_next, x_next, w_ptr, s_ptr, x_ptr, w_off, s_off, x_off, x_mask, k_start, STEPS,
                     STAGES, BLOCK_K, RESIDENT)
    async_copy.commit_group()
    if RESIDENT:
        tile = _decoded_tile_paired(first, second, scale_words, BLOCK_N, BLOCK_K)
    else:
        tile = _decoded_tile(words, e, BLOCK_N, BLOCK_K, SHIFT, LANES)
    return warpgroup_mma(gl.convert_layout(tile, A_OPERAND), x_slot.permute((1, 0)), acc)


@gluon.jit
def _ring_round(acc, i, w0, w1, w2, s0, s1, s2, x0, x1, x2, s_res, w_ptr, s_ptr, x_ptr, w_off, s_off, x_off, x_mask,
                k_start, STEPS: gl.constexpr, STAGES: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_K: gl.constexpr,
                SHIFT: gl.constexpr, LANES: gl.constexpr, RESIDENT: gl.constexpr, WORDS: gl.constexpr,
                SCALE_LANES: gl.constexpr, SCALE_READ: gl.constexpr, A_OPERAND: gl.constexpr):
    """Round ``i`` of the K loop: steps ``i * STAGES + j`` in slot ``j``, each refilling slot ``j - 1`` (mod STAGES)."""
    for j in gl.static_range(STAGES):
        if STEPS % STAGES == 0 or i * STAGES + j < STEPS:  # (the last round may have fewer steps)
            acc = _ring_step(acc, i * STAGES + j, _pick(j, w0, w1, w2), _pick(j, s0, s1, s2), _pick(j, x0, x1, x2),
                             _pick(j - 1, w0, w1, w2), _pick(j - 1, s0, s1, s2), _pick(j - 1, x0, x1, x2), s_res, w_ptr,
                             s_ptr, x_ptr, w_off, s_off, x_off, x_mask, k_start, STEPS, STAGES, BLOCK_N, BLOCK_K, SHIFT,
                             LANES, RESIDENT, WORDS, SCALE_LANES, SCALE_READ, A_OPERAND)
    return acc


@gluon.constexpr_function
def _ring_layouts(warps, block_m, lanes, vec_sum):
    """The kernel's register layouts for ``warps`` warps (one or two warpgroups): a dict of ``WORDS`` (words as the MMA
    operand holds the rows, 4 words per thread), ``SCALE_COPY`` / ``SCALE_READ`` (scales copied 4 bytes per thread, read one
    byte per thread), ``ACT`` (activations 2 values per thread, 8 with ``lanes``), ``SCALE_LANES``, ``OUT`` (the
    epilogue), ``MMA`` and ``A_OPERAND``.  Warpgroup g of WG owns the 64-row repeats a = g (mod WG): warp w + 4 g, as the
    MMA layout orders them."""
    wg = warps // 4
    mma = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4 * wg, 1], instr_shape=[16, block_m, 16])
    return dict(
        WORDS=gl.BlockedLayout([1, 1, 1, 1, 1, 4], [8, 1, 1, 1, 1, 4], [1, 4, 1, 1, wg, 1], [5, 0, 1, 2, 3, 4]),
        SCALE_COPY=gl.BlockedLayout([4, 1, 1, 1, 1, 1], [1, 8, 1, 2, 2, 1], [1, 1, 4, 1, 1, wg], [0, 1, 2, 3, 4, 5]),
        SCALE_READ=gl.BlockedLayout([1, 1, 1, 1, 1, 1], [4, 8, 1, 1, 1, 1], [1, 1, 4, 1, 1, wg], [0, 1, 2, 3, 4, 5]),
        # lanes: natural K order, 16-byte runs (8 values) per thread, one row per warp (covers [4 WG, 256]); else
        # covers [WG, 256]: no copy twice
        ACT=(gl.BlockedLayout([1, 8], [1, 32], [4 * wg, 1], [1, 0]) if lanes
             else gl.BlockedLayout([1, 2], [1, 32], [wg, 4], [1, 0])),
        SCALE_LANES=(gl.BlockedLayout([4, 1, 1, 1, 1, 1, 1], [1, 8, 1, 1, 1, 1, 4], [1, 1, 4, 1, 1, wg, 1],
                                      [6, 1, 0, 2, 3, 4, 5]) if lanes else None),
        # vec_sum: 4 adjacent columns per thread, 16-byte partials (N % 16 == 0 keeps every row aligned)
        OUT=(gl.BlockedLayout([1, 4], [8, 4], [1, 4 * wg], [1, 0]) if vec_sum
             else gl.BlockedLayout([1, 1], [2, 16], [wg, 4], [1, 0])),
        MMA=mma,
        A_OPERAND=gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2),
    )


@gluon.constexpr_function
def _layout(layouts, name):
    return layouts[name]


@gluon.jit
def _ring_slots(BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                STEPS: gl.constexpr, RESIDENT: gl.constexpr):
    """The ring: 2 or 3 slots, each its own weight, scale and activation buffers (see ``_ring_step``), and with
    ``RESIDENT`` the program's whole scale slice as 32-bit words (4 groups each), ``[step, row, word]``, copied once:
    ``(w0, w1, w2, s0, s1, s2, x0, x1, x2, s_res)`` (a ring of 2 repeats its last slot)."""
    R: gl.constexpr = BLOCK_N // 64
    NB: gl.constexpr = BLOCK_K // 128
    gl.static_assert(STAGES == 2 or STAGES == 3, "the ring has 2 or 3 slots")
    W_SLOT: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [5, 0, 1, 2, 3, 4])
    S_SLOT: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0, 1, 2, 3, 4, 5])
    X_SLOT: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    w0 = gl.allocate_shared_memory(gl.int32, [8, 4, 2, NB, R, RUN_WORDS], W_SLOT)
    w1 = gl.allocate_shared_memory(gl.int32, [8, 4, 2, NB, R, RUN_WORDS], W_SLOT)
    x0 = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, BLOCK_K], X_SLOT)
    x1 = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, BLOCK_K], X_SLOT)
    if STAGES == 3:
        w2 = gl.allocate_shared_memory(gl.int32, [8, 4, 2, NB, R, RUN_WORDS], W_SLOT)
        x2 = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, BLOCK_K], X_SLOT)
    else:
        w2 = w1
        x2 = x1
    if RESIDENT:
        s_res = gl.allocate_shared_memory(gl.int32, [STEPS, BLOCK_N, NB], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        s0 = s_res
        s1 = s_res
        s2 = s_res
    else:  # one step's scales per ring slot
        s0 = gl.allocate_shared_memory(gl.uint8, [4, 8, 4, 2, NB, R], S_SLOT)
        s1 = gl.allocate_shared_memory(gl.uint8, [4, 8, 4, 2, NB, R], S_SLOT)
        if STAGES == 3:
            s2 = gl.allocate_shared_memory(gl.uint8, [4, 8, 4, 2, NB, R], S_SLOT)
        else:
            s2 = s1
        s_res = s0
    return w0, w1, w2, s0, s1, s2, x0, x1, x2, s_res


@gluon.jit
def _ring_slots_stacked(BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                        STEPS: gl.constexpr):
    """The ring of one K part: every slot in one buffer per kind, indexed at run time, as ``_ring_slots`` returns them
    (``(w, w, w, s, s, s, x, x, x, s)``; resident scales)."""
    R: gl.constexpr = BLOCK_N // 64
    NB: gl.constexpr = BLOCK_K // 128
    w_all = gl.allocate_shared_memory(gl.int32, [STAGES, 8, 4, 2, NB, R, RUN_WORDS],
                                      gl.SwizzledSharedLayout(1, 1, 1, [5, 0, 1, 2, 3, 4]))
    x_all = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_M, BLOCK_K],
                                      gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
    s_all = gl.allocate_shared_memory(gl.int32, [STEPS, BLOCK_N, NB], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    return w_all, w_all, w_all, s_all, s_all, s_all, x_all, x_all, x_all, s_all


@gluon.jit
def _ring_accumulate(part: gl.constexpr, slots, w_ptr, s_ptr, x_ptr, N, M, stride_xm,
                     K: gl.constexpr, K_PART: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr,
                     BLOCK_K: gl.constexpr, STAGES: gl.constexpr, SHIFT: gl.constexpr, EVEN_N: gl.constexpr,
                     LANES: gl.constexpr, PDL: gl.constexpr, STATIC_WEIGHTS: gl.constexpr, RESIDENT: gl.constexpr,
                     VEC_SUM: gl.constexpr, X_CONTIGUOUS: gl.constexpr, PARTS: gl.constexpr):
    """This program's sum ``acc [BLOCK_N, BLOCK_M]`` (fp32, ``* 2**-SHIFT``, MMA layout) over part ``part`` of its K range
    (``K_PART`` wide), through the ring ``slots`` (``_ring_slots``; with K parts ``_ring_slots_stacked``)."""
    ROLLED: gl.constexpr = PARTS > 1  # one step per loop iteration (see _mxfp4_small_m_ring_kernel)
    R: gl.constexpr = BLOCK_N // 64
    NB: gl.constexpr = BLOCK_K // 128
    STEPS: gl.constexpr = K_PART // BLOCK_K
    WG: gl.constexpr = gl.num_warps() // 4
    LAYOUTS: gl.constexpr = _ring_layouts(gl.num_warps(), BLOCK_M, LANES, VEC_SUM)
    WORDS: gl.constexpr = _layout(LAYOUTS, "WORDS")
    SCALE_COPY: gl.constexpr = _layout(LAYOUTS, "SCALE_COPY")
    SCALE_READ: gl.constexpr = _layout(LAYOUTS, "SCALE_READ")
    ACT: gl.constexpr = _layout(LAYOUTS, "ACT")
    SCALE_LANES: gl.constexpr = _layout(LAYOUTS, "SCALE_LANES")
    MMA: gl.constexpr = _layout(LAYOUTS, "MMA")
    A_OPERAND: gl.constexpr = _layout(LAYOUTS, "A_OPERAND")
    w0 = slots[0]
    w1 = slots[1]
    w2 = slots[2]
    s0 = slots[3]
    s1 = slots[4]
    s2 = slots[5]
    x0 = slots[6]
    x1 = slots[7]
    x2 = slots[8]
    s_res = slots[9]
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    # weight word offsets [8, 4, 2, NB, R, 16]: row l + 16 w + 8 r + 64 a, word 16 b + j of the step
    rows = (pid_n * BLOCK_N + _axis(8, 0, 6, WORDS) + 16 * _axis(4, 1, 6, WORDS) + 8 * _axis(2, 2, 6, WORDS)
            + 64 * _axis(R, 4, 6, WORDS))
    if not EVEN_N:
        rows = gl.where(rows < N, rows, 0)  # padding columns read row 0 (in bounds), never stored
    w_off = rows.to(gl.int64) * (K // 8) + (RUN_WORDS * _axis(NB, 3, 6, WORDS) + _axis(RUN_WORDS, 5, 6, WORDS))
    # scale offsets [4, 8, 4, 2, NB, R]: group 4 b + t of the step
    s_rows = (pid_n * BLOCK_N + _axis(8, 1, 6, SCALE_COPY) + 16 * _axis(4, 2, 6, SCALE_COPY)
              + 8 * _axis(2, 3, 6, SCALE_COPY) + 64 * _axis(R, 5, 6, SCALE_COPY))
    if not EVEN_N:
        s_rows = gl.where(s_rows < N, s_rows, 0)
    s_off = s_rows.to(gl.int64) * (K // 32) + (4 * _axis(NB, 4, 6, SCALE_COPY) + _axis(4, 0, 6, SCALE_COPY))
    # activation offsets [BLOCK_M, BLOCK_K] in the "wgmma" logical K order (triton_small_m.activation_k, C = 4)
    kl = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, ACT))
    rows_x = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, ACT))
    if LANES:  # the "lanes" layout makes the logical K order natural (formats.mxfp4_rows_to_lanes)
        kn = gl.max_contiguous(gl.multiple_of(kl, 8), 8)
        # Rows past M are zero-filled (no read): 16-byte copies bypass L1, so re-reading row M - 1 would go to L2.
        x_mask = (rows_x < M)[:, None] & (kn >= 0)[None, :]
    else:
        kn = (kl // 128) * 128 + 8 * ((kl // 32) % 4) + 32 * ((kl // 2) % 4) + 2 * ((kl // 8) % 4) + kl % 2
        kn = gl.max_contiguous(gl.multiple_of(kn, 2), 2)
        # Rows past M copy row M - 1 again (no predicate per copy; 4-byte copies hit L1): they only reach MMA
        # output columns past M, which are never stored.
        x_mask = None
    if LANES and X_CONTIGUOUS:  # rows K apart: a thread's 4 rows are constant offsets of one address (rows past M are
        x_off = rows_x[:, None] * K + kn[None, :]  # masked, never read); 16 fewer instructions per step at 16 tokens
    else:
        x_off = gl.minimum(rows_x, M - 1)[:, None] * stride_xm + kn[None, :]  # int32: at most 16 rows

    k_start = pid_k * (K_PART * PARTS) + part * K_PART
    if RESIDENT:  # [step, row, word] offsets (32-bit words) of the program's whole scale slice: NB words per row and step
        SCALE_FILL: gl.constexpr = _scale_fill_layout(BLOCK_N, WG, NB)
        s_words_ptr = s_ptr.to(gl.pointer_type(gl.int32), bitcast=True)  # K % 128 == 0: rows of whole words
        f_rows = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, SCALE_FILL))
        if not EVEN_N:
            f_rows = gl.where(f_rows < N, f_rows, 0)
        f_off = f_rows.to(gl.int64)[:, None] * (K // 128) + gl.arange(0, NB, layout=gl.SliceLayout(0, SCALE_FILL))[None, :]
        if PDL and STATIC_WEIGHTS:  # static: before the wait, in the first copy group
            _copy_scales(s_res, s_words_ptr, f_off, k_start // 128, STEPS, NB)
    if PDL and STATIC_WEIGHTS:  # the caller says no recent kernel writes the weights: copy them before the wait
        for s in gl.static_range(STAGES - 1):
            if s < STEPS:
                _issue_weight_copies(_slot(s, w0, w1, w2, ROLLED), _pick(s, s0, s1, s2), w_ptr, s_ptr, w_off, s_off,
                                     k_start + s * BLOCK_K, not RESIDENT)
    if PDL:
        _asm_statement("griddepcontrol.wait;")  # the previous kernel's results (x, locks, ...) are visible now
    if RESIDENT and not (PDL and STATIC_WEIGHTS):
        _copy_scales(s_res, s_words_ptr, f_off, k_start // 128, STEPS, NB)
    for s in gl.static_range(STAGES - 1):
        if s < STEPS:
            if PDL and STATIC_WEIGHTS:
                async_copy.async_copy_global_to_shared(_slot(s, x0, x1, x2, ROLLED),
                                                       x_ptr + (x_off + k_start + s * BLOCK_K), mask=x_mask)
            else:
                _issue_copies(_slot(s, w0, w1, w2, ROLLED), _pick(s, s0, s1, s2), _slot(s, x0, x1, x2, ROLLED), w_ptr,
                              s_ptr, x_ptr, w_off, s_off, x_off, x_mask, k_start + s * BLOCK_K, not RESIDENT)
        async_copy.commit_group()

    acc = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=MMA)
    if ROLLED:  # one step per iteration, slots picked at run time (the compiler adds a barrier per step)
        for step in range(STEPS):
            slot = step % STAGES
            nxt = (step + STAGES - 1) % STAGES
            acc = _ring_step(acc, step, w0.index(slot), s_res, x0.index(slot), w0.index(nxt), s_res, x0.index(nxt), s_res,
                             w_ptr, s_ptr, x_ptr, w_off, s_off, x_off, x_mask, k_start, STEPS, STAGES, BLOCK_N, BLOCK_K,
                             SHIFT, LANES, RESIDENT, WORDS, SCALE_LANES, SCALE_READ, A_OPERAND)
    else:
        # Unrolled by the ring depth so that every slot index is a constant: the compiler then sees that a step's copies
        # (into the slot of step + STAGES - 1) and its reads (its own slot) touch different memory and adds no barrier
        # between them; the one barrier per step below is the ring's.
        ROUNDS: gl.constexpr = (STEPS + STAGES - 1) // STAGES
        if ROUNDS == 1:  # (Triton 3.6 fails to compile a loop of one round, and a round at a constant index)
            acc = _ring_round(acc, _opaque_zero(), w0, w1, w2, s0, s1, s2, x0, x1, x2, s_res, w_ptr, s_ptr, x_ptr, w_off,
                              s_off, x_off, x_mask, k_start, STEPS, STAGES, BLOCK_N, BLOCK_K, SHIFT, LANES, RESIDENT, WORDS,
                              SCALE_LANES, SCALE_READ, A_OPERAND)
        else:
            for i in range(ROUNDS):
                acc = _ring_round(acc, i, w0, w1, w2, s0, s1, s2, x0, x1, x2, s_res, w_ptr, s_ptr, x_ptr, w_off, s_off, x_off,
                                  x_mask, k_start, STEPS, STAGES, BLOCK_N, BLOCK_K, SHIFT, LANES, RESIDENT, WORDS, SCALE_LANES,
                                  SCALE_READ, A_OPERAND)
    async_copy.wait_group(0)
    return acc


@gluon.jit
def _ring_part_first(slots, w_ptr, s_ptr, x_ptr, N, M, stride_xm, K: gl.constexpr, K_PART: gl.constexpr,
                     BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
                     SHIFT: gl.constexpr, EVEN_N: gl.constexpr, LANES: gl.constexpr, PDL: gl.constexpr,
                     STATIC_WEIGHTS: gl.constexpr, RESIDENT: gl.constexpr, VEC_SUM: gl.constexpr,
                     X_CONTIGUOUS: gl.constexpr, PARTS: gl.constexpr):
    """The default partition of K parts: part 0's sum, returned."""
    return (_ring_accumulate(0, slots, w_ptr, s_ptr, x_ptr, N, M, stride_xm, K, K_PART, BLOCK_N, BLOCK_M, BLOCK_K,
                             STAGES, SHIFT, EVEN_N, LANES, PDL, STATIC_WEIGHTS, RESIDENT, VEC_SUM, X_CONTIGUOUS, PARTS),)


@gluon.jit
def _ring_part(part: gl.constexpr, slots, sums, done, w_ptr, s_ptr, x_ptr, N, M, stride_xm, K: gl.constexpr,
               K_PART: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_K: gl.constexpr,
               STAGES: gl.constexpr, SHIFT: gl.constexpr, EVEN_N: gl.constexpr, LANES: gl.constexpr, PDL: gl.constexpr,
               STATIC_WEIGHTS: gl.constexpr, RESIDENT: gl.constexpr, VEC_SUM: gl.constexpr, X_CONTIGUOUS: gl.constexpr,
               PARTS: gl.constexpr):
    """A worker partition of K parts: part ``part``'s sum into ``sums[part - 1]``, then one arrival on ``done``."""
    acc = _ring_accumulate(part, slots, w_ptr, s_ptr, x_ptr, N, M, stride_xm, K, K_PART, BLOCK_N, BLOCK_M, BLOCK_K,
                           STAGES, SHIFT, EVEN_N, LANES, PDL, STATIC_WEIGHTS, RESIDENT, VEC_SUM, X_CONTIGUOUS, PARTS)
    sums.index(part - 1).store(acc)
    gl.thread_barrier()  # the partition's stores are done before its (single) arrival
    mbarrier.arrive(done)


@gluon.jit
def _mxfp4_small_m_ring_kernel(
    w_ptr, s_ptr, x_ptr, out_ptr, ws_ptr, lock_ptr, bias_ptr,
    N, M, stride_xm, stride_om,
    K: gl.constexpr, K_SPLIT: gl.constexpr, SPLIT_K: gl.constexpr, HAS_BIAS: gl.constexpr,
    BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_K: gl.constexpr, STAGES: gl.constexpr,
    SHIFT: gl.constexpr, EVEN_N: gl.constexpr, LANES: gl.constexpr, PDL: gl.constexpr = False,
    STATIC_WEIGHTS: gl.constexpr = False, RESIDENT_SCALES: gl.constexpr = False, VEC_SUM: gl.constexpr = False,
    X_CONTIGUOUS: gl.constexpr = False, PARTS: gl.constexpr = 1,
):
    K_PART: gl.constexpr = K_SPLIT // PARTS
    STEPS: gl.constexpr = K_PART // BLOCK_K
    RESIDENT: gl.constexpr = RESIDENT_SCALES and LANES  # the program's scales copied once, 8-byte runs
    LAYOUTS: gl.constexpr = _ring_layouts(gl.num_warps(), BLOCK_M, LANES, VEC_SUM)
    OUT: gl.constexpr = _layout(LAYOUTS, "OUT")
    MMA: gl.constexpr = _layout(LAYOUTS, "MMA")
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    if PDL:  # the next kernel on the stream may launch now; it waits for this one's results (its own wait below)
        _asm_statement("griddepcontrol.launch_dependents;")
    if PARTS == 1:
        acc = _ring_accumulate(0, _ring_slots(BLOCK_N, BLOCK_M, BLOCK_K, STAGES, STEPS, RESIDENT), w_ptr, s_ptr, x_ptr,
                               N, M, stride_xm, K, K_PART, BLOCK_N, BLOCK_M, BLOCK_K, STAGES, SHIFT, EVEN_N, LANES, PDL,
                               STATIC_WEIGHTS, RESIDENT, VEC_SUM, X_CONTIGUOUS, PARTS)
    else:
        # K parts: PARTS warpgroups split the program's K range (warp specialization: the default partition takes
        # part 0, workers 1.. the rest, each with its own ring and barriers); the workers' sums meet in shared memory
        # and are added in part order, as split-K partials are.
        gl.static_assert(PARTS == 4 and gl.num_warps() == 4, "K parts: 4 parts of one warpgroup each")
        slots0 = _ring_slots_stacked(BLOCK_N, BLOCK_M, BLOCK_K, STAGES, STEPS)
        slots1 = _ring_slots_stacked(BLOCK_N, BLOCK_M, BLOCK_K, STAGES, STEPS)
        slots2 = _ring_slots_stacked(BLOCK_N, BLOCK_M, BLOCK_K, STAGES, STEPS)
        slots3 = _ring_slots_stacked(BLOCK_N, BLOCK_M, BLOCK_K, STAGES, STEPS)
        sums = gl.allocate_shared_memory(gl.float32, [PARTS - 1, BLOCK_N, BLOCK_M], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(done, count=PARTS - 1)
        fence_async_shared()
        gl.thread_barrier()
        acc, = gl.warp_specialize(
            [(_ring_part_first, (slots0, w_ptr, s_ptr, x_ptr, N, M, stride_xm, K, K_PART, BLOCK_N, BLOCK_M,
                                 BLOCK_K, STAGES, SHIFT, EVEN_N, LANES, PDL, STATIC_WEIGHTS, RESIDENT, VEC_SUM, X_CONTIGUOUS,
                                 PARTS)),
             (_ring_part, (1, slots1, sums, done, w_ptr, s_ptr, x_ptr, N, M, stride_xm, K, K_PART, BLOCK_N, BLOCK_M,
                                 BLOCK_K, STAGES, SHIFT, EVEN_N, LANES, PDL, STATIC_WEIGHTS, RESIDENT, VEC_SUM, X_CONTIGUOUS,
                                 PARTS)),
             (_ring_part, (2, slots2, sums, done, w_ptr, s_ptr, x_ptr, N, M, stride_xm, K, K_PART, BLOCK_N, BLOCK_M,
                                 BLOCK_K, STAGES, SHIFT, EVEN_N, LANES, PDL, STATIC_WEIGHTS, RESIDENT, VEC_SUM, X_CONTIGUOUS,
                                 PARTS)),
             (_ring_part, (3, slots3, sums, done, w_ptr, s_ptr, x_ptr, N, M, stride_xm, K, K_PART, BLOCK_N, BLOCK_M,
                                 BLOCK_K, STAGES, SHIFT, EVEN_N, LANES, PDL, STATIC_WEIGHTS, RESIDENT, VEC_SUM, X_CONTIGUOUS,
                                 PARTS))],
            [4, 4, 4], [PART_REGISTERS, PART_REGISTERS, PART_REGISTERS])
        mbarrier.wait(done, 0)
        for g in gl.static_range(PARTS - 1):
            acc += sums.index(g).load(MMA)

    acc = gl.convert_layout(gl.permute(acc, (1, 0)), OUT) * (2.0 ** SHIFT)
    offs_m = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, OUT))
    offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, OUT))
    mask_n = offs_n < N
    mask = (offs_m < M)[:, None] & mask_n[None, :]
    out_offs = offs_m.to(gl.int64)[:, None] * stride_om + offs_n[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += gl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(gl.float32)[None, :]
        gl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        ws_offs = offs_m.to(gl.int64)[:, None] * N + offs_n[None, :]
        gl.store(ws_ptr + pid_k.to(gl.int64) * M * N + ws_offs, acc, mask=mask)
        gl.thread_barrier()  # every thread's partial is written before the arrival is published
        arrived = gl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:  # the last program of this column block sums all partials in split order
            total = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=OUT)
            if VEC_SUM:  # every split's load in flight at once
                for split in gl.static_range(SPLIT_K):
                    total += gl.load(ws_ptr + split * M * N + ws_offs, mask=mask, other=0.0, cache_modifier=".cg")
            else:
                for split in range(SPLIT_K):
                    total += gl.load(ws_ptr + split * M * N + ws_offs, mask=mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                total += gl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(gl.float32)[None, :]
            gl.store(out_ptr + out_offs, total.to(out_ptr.dtype.element_ty), mask=mask)
            gl.atomic_xchg(lock_ptr + pid_n, 0, sem="relaxed", scope="gpu")  # ready for the next call


def launch_ring(x, w, w_scale, out, workspace, locks, bias, p: dict, shift: int, lanes: bool = False,
                static_weights: bool = False) -> None:
    """Launch the kernel for a plan of ``triton_small_m.plan`` (``k_split * split == K``); up to 8 tokens the
    MMA is 8 wide (half the activation copies and shared memory of 16).  With ``p["pdl"]`` it is launched with
    programmatic dependent launch; ``static_weights`` (the caller's promise that no recent kernel on the stream
    writes ``w`` or ``w_scale``) lets it copy its first weight steps before waiting for the previous kernel."""
    m, k = x.shape
    block_m = ring_tile_tokens(m, p)
    n = w.shape[0]
    split = p["split"]
    _mxfp4_small_m_ring_kernel[(p["tiles"], split)](
        w.view(torch.int32), w_scale.view(torch.uint8), x, out, workspace if split > 1 else out,
        locks if locks is not None else out, bias if bias is not None else out,
        n, m, x.stride(0), out.stride(0),
        K=k, K_SPLIT=p["k_split"], SPLIT_K=split, HAS_BIAS=bias is not None, BLOCK_N=p["block_n"], BLOCK_M=block_m,
        BLOCK_K=p["block_k"], STAGES=p["stages"], SHIFT=shift, EVEN_N=n % p["block_n"] == 0, LANES=lanes,
        PDL=p["pdl"], STATIC_WEIGHTS=static_weights, RESIDENT_SCALES=lanes and resident_scales_fit(p),
        VEC_SUM=vec_sum_applies(p, n), X_CONTIGUOUS=x.stride(0) == k, PARTS=p.get("parts", 1),
        num_warps=p["num_warps"], maxnreg=MAX_REGISTERS, **launch_options(p["pdl"]),
    )


