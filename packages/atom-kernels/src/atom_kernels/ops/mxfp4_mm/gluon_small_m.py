"""The small-M MXFP4 kernel with its loads as asynchronous copies into a shared-memory ring (Gluon, sm_90).

Same math, K permutation, decode and split-K reduction as ``triton_small_m`` (read its docstring first); what differs
is how the bytes arrive. A K step's weight words, scale bytes and activations are ``cp.async`` copies into a ring of
2 or 3 shared-memory slots, issued one or two steps ahead, so later steps' copies are in flight while this step
decodes, without holding registers (building blocks: ``gluon_ring``):

* weight words: each thread copies the 16-byte runs it will decode, shaped as the warpgroup MMA operand holds the rows
  (as ``triton_small_m.mma_rows``), and reads them back in the same layout; a quarter warp's reads hit 32 banks;
* scale bytes: with "lanes" weights and ``resident_scales`` (the default where ``planner.resident_scales_fit``) a
  program copies its whole scale slice once, before its K loop, and each step reads its 32-bit scale words straight
  into paired bf16 multipliers (``decode.SCALE_PAIR_ASM``); otherwise 4-byte copies into each ring slot;
* activations: with "lanes" weights 16-byte copies in natural K order (rows past ``M`` zero-filled); with the
  checkpoint's order 4-byte copies of the permuted K runs (rows past ``M`` repeat row ``M - 1``, never stored).
  8 rows wide up to 8 tokens, else 16.

Each step (``gluon_ring._ring_step``): wait for its copy group, fence (the MMA reads shared memory through the async
proxy), one barrier (copies landed, and nobody still reads the slot the next copies overwrite), read words and
scales, issue the copies of a later step, decode, one warpgroup MMA (weights from registers, activations from the
slot). The slots are separate buffers and the loop is unrolled by the ring depth, so the barrier is the only one per
step.

Programmatic dependent launch (``p["pdl"]``): the kernel may start while its predecessor on the stream runs, lets its
successor launch once all its programs started, and waits for the predecessor before reading what it may have
written. With ``static_weights`` (parameters nothing on the stream writes) the first steps' weight and scale copies
are issued before that wait, so the weights stream while the previous kernel finishes.

K parts (``PARTS`` = 4, ``planner.K_PARTS``; 9-16 tokens where the call is one wave): a program is 4 warp-specialized
warpgroups over the same 64 columns, each summing a quarter of the program's K range through its own ring; the workers'
sums meet the default partition's in shared memory, added in part order, so the results are bitwise those of 4 splits.
Their loops take one step per iteration (slots picked at run time): unrolled, 4 copies overflow the instruction cache.

Registers are capped at 128 (``MAX_REGISTERS``) so 4 programs of one warpgroup fit on an SM. Split-K partials go
through the fp32 workspace, 16 bytes per thread where N % 16 == 0 (``planner.vec_sum_applies``).

Preconditions: ``planner.ring_applies`` (a pure function; otherwise the register-load kernel runs). Gluon kernels do not
run in Triton's CPU interpreter: the CPU tests compile this one for sm_90 and check its SASS and preconditions; its
results are checked on the GPU (``tests/test_mxfp4_small_m.py``).
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import async_copy, fence_async_shared, mbarrier

from atom_kernels.ops._pdl import launch_options
from atom_kernels.ops.mxfp4_mm.gluon_ring import (
    MAX_REGISTERS,
    PART_REGISTERS,
    RUN_WORDS,
    _asm_statement,
    _axis,
    _copy_scales,
    _issue_copies,
    _issue_weight_copies,
    _layout,
    _opaque_zero,
    _pick,
    _ring_layouts,
    _ring_round,
    _ring_slots,
    _ring_slots_stacked,
    _ring_step,
    _scale_fill_layout,
    _slot,
)
from atom_kernels.ops.mxfp4_mm.planner import resident_scales_fit, ring_tile_tokens, vec_sum_applies


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
    """Launch the kernel for a plan of ``planner.plan`` (``k_split * split == K``); up to 8 tokens the
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


