"""Building blocks of the sm_90 small-M ring kernel (``gluon_small_m``): register and shared-memory layouts, the ring's
slots, the asynchronous copies that fill them, and one K step (wait, barrier, read, issue the next copies, decode, MMA).

Gluon (Triton's experimental explicit-layout dialect), sm_90 only; compiled for sm_90 and its SASS checked on the CPU
(``tests/test_sm90_compile.py``), run on the GPU tests.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy, warpgroup_mma

from atom_kernels.ops.mxfp4_mm.decode import (  # word -> 4 bf16x2 (checkpoint / "lanes" bits)
    DECODE_ASM,
    LANES_DECODE_ASM,
    LANES_DECODE_ASM_HIGH,
    LANES_DECODE_ASM_LOW,
    SCALE_PAIR_ASM,
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
