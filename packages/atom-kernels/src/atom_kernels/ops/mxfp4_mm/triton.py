"""Triton MXFP4 weight-only GEMM.  Up to 16 tokens ``triton_small_m`` runs (a GEMV-shaped kernel:
``mma.sync`` with the tokens on the 16-row side, cheap decode, split-K); above, the warpgroup-MMA kernel
below.

Layout of the work in the warpgroup-MMA kernel: operands are swapped, the weight's output features run along the 64/128-row MMA
tile and the tokens along its 16-wide side, so M = 1..16 costs one padded 16-column tile; K is split
over programs (fp32 partials, then ``gemm_common.reduce_splits``) until every SM has about two.

Decoding, per 32-bit word of 8 codes (``w`` viewed as int32, one 16-byte load per thread):
``((t & 0x00070007) << 6) | ((t & 0x00080008) << 12)`` with ``t = word >> 4j`` turns nibbles ``j`` and
``j + 4`` into a pair of bf16 values ``code * 2**-126`` packed in one register (4 integer ops per
pair); one bf16x2 multiply by ``2**(e - 33)`` applies the group's e8m0 scale and leaves
``value * 2**-32`` (normal in bf16 for scales 2**-93 .. 2**33), undone on the fp32 accumulator.
The pairs are fed to the MMA in a K order permuted within each group of 32 (pair ``j`` of the word
owned by MMA lane ``c`` sits at K positions ``8j + 2c`` (element ``j + 4``) and ``8j + 2c + 1``
(element ``j``)), so each thread's MMA fragment is exactly the words it decoded and no shuffle is
needed; the activation tile is loaded in natural order and permuted the same way in registers.  (The
orders were chosen by compiling for sm_90 and counting SASS: ~4.4 instructions per weight element in
the decode loop, no shared-memory round trip for the weights.)

Weights in the ``"lanes"`` byte order (``formats.mxfp4_rows_to_lanes``) are this kernel's natural order: lane run
``c`` (16 bytes) of a 128-code block holds word ``c`` of the block's 4 scale groups, and byte ``p`` of such a word
is the pair of codes at K ``8 p + 2 c`` of its group, exactly the pairs MMA lane ``c`` of a quad holds in its
register fragment.  So a run is one 16-byte load, each pair decodes to one bf16x2 register (``decode_words`` with
``LANES``: the word's bits are stored where one or two shifts and masks fetch each pair, ``formats.LANES_PAIR_TERMS``),
the decoded tile is in natural K order and the activations are used as they
are: no permutation through shared memory (no ``ldmatrix``/``stmatrix`` in the sm_90 loop), which halves the time
above 16 tokens (docs/kernels.md).

In Triton 3.6's CPU interpreter bf16 arithmetic and bf16 ``tl.dot`` operate on the raw 16-bit
integers, so there (``EXACT``) the same decoded values are scaled and multiplied in fp32.  The bf16
path (the GPU path) is covered by the GPU tests.

Loop bounds are compile-time constants (one specialization per weight shape): the interpreter
cannot iterate over a runtime integer with numpy >= 2.4.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.dispatch import triton_interpreting
from atom_kernels.formats import MX_GROUP, MXFP4_LAYOUTS
from atom_kernels.ops._triton_common import grouped_tile
from atom_kernels.ops.gemm_common import pick_split_k, reduce_splits
from atom_kernels.ops.mxfp4_mm.decode import decode_words
from atom_kernels.ops.mxfp4_mm.planner import SMALL_M_MAX, ring_serves
from atom_kernels.ops.mxfp4_mm.triton_small_m import mxfp4_mm_small_m

# The decoded weights carry a factor 2**-SHIFT so every scale from 2**-93 to 2**33 stays a normal bf16.
_SHIFT = 32

# Warpgroup-MMA kernel configurations by the number of tokens ("decode" runs only when asked for with
# ``config={"kernel": "mma"}``: up to SMALL_M_MAX tokens the small-M kernel runs).  The bench sweeps
# alternatives (``SWEEP``; the small-M kernel's are ``planner.SWEEP``).
CONFIGS: dict[str, dict] = {
    "decode": dict(block_n=64, block_m=16, block_k=256, split_k="auto", group=1, num_warps=4, num_stages=4),
    "small": dict(block_n=64, block_m=64, block_k=128, split_k="auto", group=1, num_warps=4, num_stages=4),
    "medium": dict(block_n=128, block_m=64, block_k=128, split_k=1, group=8, num_warps=4, num_stages=3),
    "large": dict(block_n=128, block_m=128, block_k=128, split_k=1, group=8, num_warps=8, num_stages=3),
}

# On "lanes" weights (the default byte order on sm_90) by the largest token count each serves (None: any): the
# fastest configuration of each range in the bench's sweep at N = K = 8192 (``python -m atom_tools.kernels mxfp4``;
# up to 16 tokens only where the ring kernel does not run).
LANES_CONFIGS: tuple[tuple[int | None, dict], ...] = (
    (16, dict(block_n=64, block_m=16, block_k=256, split_k=4, group=1, num_warps=4, num_stages=3)),
    (32, dict(block_n=64, block_m=32, block_k=256, split_k="auto", group=1, num_warps=4, num_stages=4)),
    (64, dict(block_n=128, block_m=64, block_k=256, split_k=2, group=1, num_warps=8, num_stages=3)),
    (128, dict(block_n=128, block_m=64, block_k=256, split_k=1, group=8, num_warps=8, num_stages=3)),
    (256, dict(block_n=128, block_m=128, block_k=256, split_k=1, group=8, num_warps=8, num_stages=3)),
    (None, dict(block_n=256, block_m=128, block_k=128, split_k=1, group=8, num_warps=8, num_stages=3)),
)

# Decode-shape alternatives of the warpgroup-MMA kernel (each merged over CONFIGS["decode"]): its default and the two
# fastest of the bench's sweep at N = K = 8192, kept as the baseline the small-M kernel must beat.
SWEEP: list[dict] = [
    dict(kernel="mma"),
    dict(kernel="mma", block_n=64, block_k=128, split_k=4, num_warps=4, num_stages=4),
    dict(kernel="mma", block_n=128, block_k=128, split_k=4, num_warps=8, num_stages=4),
]


def config_for(m: int, layout: str) -> dict:
    """The warpgroup-MMA kernel's configuration for ``m`` tokens on weights in ``layout``."""
    if layout == "lanes":
        return next(cfg for limit, cfg in LANES_CONFIGS if limit is None or m <= limit)
    return CONFIGS[shape_class(m)]


def shape_class(m: int) -> str:
    if m <= 16:
        return "decode"
    if m <= 64:
        return "small"
    if m <= 1024:
        return "medium"
    return "large"


def unsupported(x, w, w_scale, bias=None, layout="rows", static_weights=False) -> str | None:
    if layout not in MXFP4_LAYOUTS or (layout == "lanes" and x.shape[-1] % 128):
        return f"layout {layout!r} with K={x.shape[-1]}"  # the reference raises the error
    if x.dim() != 2 or w.dim() != 2 or w_scale.dim() != 2:
        return "mxfp4_mm takes 2-D x, w and w_scale"
    m, k = x.shape
    n = w.shape[0]
    if k % MX_GROUP or w.shape[1] * 2 != k or tuple(w_scale.shape) != (n, k // MX_GROUP):
        return f"shapes x {tuple(x.shape)}, w {tuple(w.shape)}, w_scale {tuple(w_scale.shape)} do not match"
    if w.dtype != torch.uint8 or w_scale.dtype not in (torch.uint8, getattr(torch, "float8_e8m0fnu", torch.uint8)):
        return "w must be uint8 and w_scale uint8 (e8m0)"
    if not (w.is_contiguous() and w_scale.is_contiguous()) or x.stride(1) != 1:
        return "w and w_scale must be contiguous, x K-contiguous"
    if x.device.type == "cuda" and not triton_interpreting() and x.dtype != torch.bfloat16:
        return f"the GPU kernel multiplies in bf16; x is {x.dtype}"
    return None


@triton.jit
def _decode_pair(words, SHIFT: tl.constexpr, EXACT: tl.constexpr):
    """Nibbles j, j+4 of each word (j = SHIFT / 4) -> two values ``code * 2**-126`` (bf16, or fp32
    with the same bits in its upper half when ``EXACT``)."""
    t = words >> SHIFT
    bits = ((t & 0x00070007) << 6) | ((t & 0x00080008) << 12)
    if EXACT:  # the interpreter's bf16 -> fp32 cast loses bf16 subnormals (code 0.5); shift the bits instead
        low = (bits << 16).to(tl.float32, bitcast=True)
        high = (bits & -65536).to(tl.float32, bitcast=True)
    else:
        low = bits.to(tl.int16).to(tl.bfloat16, bitcast=True)
        high = (bits >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return tl.join(high, low)  # [..., 2]: element j + 4, element j (the order the MMA fragment takes)


@triton.jit
def decode_mxfp4_tile(words, e, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EXACT: tl.constexpr,
                      SHIFT: tl.constexpr):
    """``words [BLOCK_N, BLOCK_K/32, 4]`` int32 (8 codes each) and ``e [BLOCK_N, BLOCK_K/32]`` e8m0 ->
    the weight tile ``[BLOCK_N, BLOCK_K]`` times ``2**-SHIFT``, K in the MMA order (bf16, or fp32 when
    ``EXACT``).  Reusable by any kernel that streams MXFP4 weights (the MoE experts' grouped GEMM)."""
    # [N, G, 4 (word c), 2 (l: element j+4 or j), 2 (j bit 0), 2 (j bit 1)]
    v = tl.join(tl.join(_decode_pair(words, 0, EXACT), _decode_pair(words, 4, EXACT)),
                tl.join(_decode_pair(words, 8, EXACT), _decode_pair(words, 12, EXACT)))
    if EXACT:
        scale = ((e.to(tl.int32) + (127 - SHIFT - 1)) << 23).to(tl.float32, bitcast=True)
    else:
        scale = ((e.to(tl.int16) + (127 - SHIFT - 1)) << 7).to(tl.bfloat16, bitcast=True)
    v = v * scale[:, :, None, None, None, None]
    # K order fed to the MMA: 8 j + 2 c + l
    return tl.reshape(tl.permute(v, (0, 1, 5, 4, 2, 3)), (BLOCK_N, BLOCK_K))


@triton.jit
def to_mma_order(x, BLOCK_K: tl.constexpr, BLOCK_M: tl.constexpr):
    """An activation tile ``[BLOCK_K, BLOCK_M]`` in natural K order -> the K order of
    ``decode_mxfp4_tile``: natural ``k = 8 c + 4 h + j`` (h = 1 for element j+4), MMA order
    ``8 j + 2 c + (1 - h)``."""
    G: tl.constexpr = BLOCK_K // 32
    x = tl.permute(tl.reshape(x, (G, 4, 2, 2, 2, BLOCK_M)), (0, 3, 4, 1, 5, 2))  # [G, b, a, c, M, h]
    x_j, x_j4 = tl.split(x)
    return tl.reshape(tl.permute(tl.join(x_j4, x_j), (0, 1, 2, 3, 5, 4)), (BLOCK_K, BLOCK_M))


@triton.jit
def decode_lanes_tile(runs, e, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EXACT: tl.constexpr,
                      SHIFT: tl.constexpr):
    """Weights in the ``"lanes"`` order: ``runs [BLOCK_N, BLOCK_K/128, 16]`` int32 (each 128-code block's 4 lane
    runs: run ``c`` holds word ``c`` of the block's 4 scale groups, whose byte ``p`` is the pair at ``8 p + 2 c``)
    and ``e [BLOCK_N, BLOCK_K/32]`` -> the weight tile ``[BLOCK_N, BLOCK_K]`` times ``2**-SHIFT`` in natural K
    order, which is the order of the MMA's register operand: lane ``c`` of a quad holds pairs ``2 c + 8 p``."""
    G: tl.constexpr = BLOCK_K // 32
    words = tl.reshape(tl.permute(tl.reshape(runs, (BLOCK_N, G // 4, 4, 4)), (0, 1, 3, 2)), (BLOCK_N, G * 4))
    e = tl.reshape(tl.broadcast_to(e[:, :, None], (BLOCK_N, G, 4)), (BLOCK_N, G * 4))
    v = decode_words(words, e, SHIFT, EXACT, LANES=True)  # [N, (group, c), code 2 p + l]
    return tl.reshape(tl.permute(tl.reshape(v, (BLOCK_N, G, 4, 4, 2)), (0, 1, 3, 2, 4)), (BLOCK_N, BLOCK_K))


@triton.jit
def _mxfp4_mm_kernel(
    w_ptr, s_ptr, x_ptr, out_ptr, ws_ptr, bias_ptr,
    N, M, stride_xm, stride_om,
    K: tl.constexpr, K_SPLIT: tl.constexpr, SPLIT_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
    EXACT: tl.constexpr, SHIFT: tl.constexpr, EVEN_N: tl.constexpr, EVEN_K: tl.constexpr, LANES: tl.constexpr,
):
    G: tl.constexpr = BLOCK_K // 32
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    tile_n, tile_m = grouped_tile(pid, tl.cdiv(N, BLOCK_N), tl.cdiv(M, BLOCK_M), GROUP)

    offs_n = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_n = offs_n < N
    mask_m = offs_m < M
    groups = tl.arange(0, G)
    word_in_group = tl.arange(0, 4)
    kk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + offs_n.to(tl.int64)[:, None, None] * (K // 8)
    s_rows = s_ptr + offs_n.to(tl.int64)[:, None] * (K // 32)
    x_cols = x_ptr + offs_m.to(tl.int64)[None, :] * stride_xm
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for step in range(0, K_SPLIT, BLOCK_K):
        k0 = pid_k * K_SPLIT + step
        g = k0 // 32 + groups  # scale groups of this step
        mask_g = g < K // 32
        if LANES:  # a 128-code block's 16 words: lane run c holds word c of its 4 groups j
            blocks = k0 // 128 + tl.arange(0, G // 4)
            word_off = blocks[None, :, None] * 16 + tl.arange(0, 16)[None, None, :]
            mask_w = (blocks < K // 128)[None, :, None]
        else:
            word_off = g[None, :, None] * 4 + word_in_group[None, None, :]
            mask_w = mask_g[None, :, None]
        if EVEN_N and EVEN_K:  # no masks: the common shapes stream the weight unpredicated
            words = tl.load(w_rows + word_off)
            e = tl.load(s_rows + g[None, :])
        else:
            words = tl.load(w_rows + word_off, mask=mask_n[:, None, None] & mask_w, other=0)
            e = tl.load(s_rows + g[None, :], mask=mask_n[:, None] & mask_g[None, :], other=0)
        if LANES:
            w_tile = decode_lanes_tile(words, e, BLOCK_N, BLOCK_K, EXACT, SHIFT)
        else:
            w_tile = decode_mxfp4_tile(words, e, BLOCK_N, BLOCK_K, EXACT, SHIFT)
        k = k0 + kk
        if EVEN_K:
            x = tl.load(x_cols + k[:, None], mask=mask_m[None, :], other=0.0)  # [BLOCK_K, BLOCK_M]
        else:
            x = tl.load(x_cols + k[:, None], mask=(k < K)[:, None] & mask_m[None, :], other=0.0)
        if not LANES:
            x = to_mma_order(x, BLOCK_K, BLOCK_M)
        if EXACT:
            acc = tl.dot(w_tile, x.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(w_tile, x.to(tl.bfloat16), acc)
    acc = acc * (2.0 ** SHIFT)
    out_offs = offs_m.to(tl.int64)[None, :] * stride_om + offs_n.to(tl.int64)[:, None]
    mask = mask_n[:, None] & mask_m[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[:, None]
        tl.store(out_ptr + out_offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(ws_ptr + pid_k.to(tl.int64) * M * N + out_offs, acc, mask=mask)


def mxfp4_mm(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None = None,
             config: dict | None = None, layout: str = "rows", static_weights: bool = False) -> torch.Tensor:
    """``static_weights``: see ``__init__``.  ``config`` overrides the configuration; its ``"kernel"``
    (``"small_m"`` or ``"mma"``) picks the kernel, by default the small-M kernel up to ``SMALL_M_MAX`` tokens (for
    ``"lanes"`` weights only where its sm_90 ring variant runs; the warpgroup-MMA kernel reads both layouts)."""
    m, k = x.shape
    n = w.shape[0]
    if layout not in MXFP4_LAYOUTS:
        raise ValueError(f"unknown MXFP4 layout {layout!r}; known: {', '.join(MXFP4_LAYOUTS)}")
    if x.stride(1) != 1:  # the kernels read a row's K as consecutive elements
        x = x.contiguous()
    config = dict(config or {})
    kernel = config.pop("kernel", "small_m" if m <= SMALL_M_MAX else "mma")
    if kernel == "small_m" and (layout == "rows" or ring_serves(x, n, config)):
        return mxfp4_mm_small_m(x, w, w_scale, bias, config, layout=layout, static_weights=static_weights)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return out
    cfg = dict(config_for(m, layout), **{key: v for key, v in config.items() if key in CONFIGS["decode"]})
    block_k = cfg["block_k"]
    if layout == "lanes" and block_k % 128:
        raise ValueError(f"weights in the 'lanes' layout need K steps of whole 128-code blocks, got block_k={block_k}")
    tiles = triton.cdiv(n, cfg["block_n"]) * triton.cdiv(m, cfg["block_m"])
    k_iters = triton.cdiv(k, block_k)
    split = cfg["split_k"]
    if split == "auto":
        split = pick_split_k(tiles, k_iters, x.device)
    split = max(1, min(int(split), k_iters))
    k_split = triton.cdiv(k_iters, split) * block_k
    split = triton.cdiv(k, k_split)
    ws = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if split > 1 else out
    _mxfp4_mm_kernel[(tiles, split)](
        w.view(torch.int32), w_scale.view(torch.uint8), x, out, ws, bias if bias is not None else out,
        n, m, x.stride(0), out.stride(0),
        K=k, K_SPLIT=k_split, SPLIT_K=split, HAS_BIAS=bias is not None,
        BLOCK_N=cfg["block_n"], BLOCK_M=cfg["block_m"], BLOCK_K=block_k, GROUP=cfg["group"],
        EXACT=triton_interpreting(), SHIFT=_SHIFT, EVEN_N=n % cfg["block_n"] == 0, EVEN_K=k_split * split == k,
        LANES=layout == "lanes", num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if split > 1:
        reduce_splits(ws, out, bias)
    return out
