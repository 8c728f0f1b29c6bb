"""The small-M MXFP4 planner: launch parameters of a call (``plan``) and which kernel may serve it.

Pure functions of shapes, the device and the configuration, so the CPU tests check every rule. ``plan`` merges a
configuration over ``DEFAULT`` and fills in the split-K count, the ring depth and K parts; ``ring_applies`` says whether
the sm_90 ring kernel (``gluon_small_m``) may run a plan (otherwise the register-load kernel of ``triton_small_m`` does).
The constants below are H200 measurements' conclusions; what was tried and not kept is in docs/performance-notes.md.
"""

from __future__ import annotations

import functools

import torch
import triton

from atom_kernels.dispatch import triton_interpreting
from atom_kernels.formats import MX_GROUP
from atom_kernels.ops.mxfp4_mm.decode import chunk_groups

SMALL_M_MAX = 16  # tokens; one 16-row MMA tile

# The ring is 3 slots deep where programs are long enough to use it (at least 8 K steps) and 4 programs still fit on an
# SM: the 8-wide tile (up to 8 tokens) always; the 16-wide tile only on "lanes" weights and at most 16 steps (3 x 16 KB of
# slots + resident scales). Elsewhere 2: at 16 tokens with 28+ steps a third slot leaves room for 3 programs per SM.
DEEP_RING = dict(stages=3, max_tile_tokens=8, min_steps=8, max_wide_steps=16)
# Split-K of the 16-wide tile (9-16 tokens) under "auto" where the partials are summed one column per thread (no
# ``vec_sum``): at most 8 splits. More splits made the last program's sum the longest part of the call.
WIDE_TILE_MAX_SPLIT = 8
# K parts (9-16 tokens, "lanes" weights, resident scales, where the call is one wave of one program per SM): a program
# is 4 warp-specialized warpgroups, each summing a quarter of its K range through its own ring of 2 slots, added in shared
# memory; this replaces the split-K sum through global memory (~1.8 us of the 16-token call). Up to 8 tokens one
# warpgroup per program stays faster back to back.
K_PARTS = 4
K_PARTS_STAGES = 2
# Split-K partials stored and summed 4 columns (16 bytes) per thread (``vec_sum``) where N % 16 keeps every row of
# partials 16-byte aligned; with a ragged N the one-column sum is faster.
VEC_SUM_ALIGN = 16
# Default configuration and the alternatives the bench sweeps (each merged over DEFAULT):
#   mma: "sync" (tokens as the A operand, mma.sync) or "wgmma" (weights as the A operand from registers: warpgroup MMA
#        when block_n % 64 == 0 and num_warps % 4 == 0); block_n: output columns per program; block_k: K per loop step;
#   split_k: "auto" or a count; waves: programs per SM that "auto" aims for; reduce: "in_kernel" (arrival counters, one
#   kernel) or "pass" (a second kernel); loads: "ring" (``gluon_small_m`` where ``ring_applies``) or "registers";
#   stages: ring slots ("auto": ``ring_stages``); narrow_m: the 8-wide MMA tile up to 8 tokens; pdl: programmatic
#   dependent launch; resident_scales: a program's whole scale slice copied once; parts: K parts ("auto": ``K_PARTS``
#   where they apply).
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


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _sm_count(device: torch.device) -> int:
    return _num_sms(device.index or 0) if device.type == "cuda" else 8


def pick_split(tiles: int, k_iters: int, device: torch.device, waves: int) -> int:
    """About ``waves`` programs per SM (any count, not only powers of two), each with >= 2 K steps."""
    return max(1, min(waves * _sm_count(device) // max(tiles, 1), k_iters // 2))


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
    4-byte copies; on the checkpoint's "rows" byte order only with the 8-wide tile (up to 8 tokens): with the 16-wide
    tile that loop is not correct on the GPU (an illegal memory access at 16 x 8192 x 8192 on an H100, non-finite
    outputs at 13 and 16 tokens on an H200), so those calls take the register-load kernel."""
    parts = p.get("parts", 1)
    if p.get("layout") == "rows" and p.get("tile_tokens", 16) > 8:
        return False
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
                parts=parts, layout=layout, tile_tokens=tile_tokens)


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


