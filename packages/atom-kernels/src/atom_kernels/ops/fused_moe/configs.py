"""Tile configurations of the Triton fused-MoE kernels, keyed by shape class.

The class is chosen from the mean number of tokens per expert (``T*k / E``): at one token per expert
the kernels stream weights (memory-bound, small row blocks, deep pipelines); at hundreds they are
GEMMs (large tiles).  ``python -m atom_tools.kernels moe`` sweeps ``SWEEP`` and reports every
configuration per case, so one GPU run picks these numbers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GemmTile:
    """``split_k``: programs sharing each output tile's K range (fp32 partials summed in split order by the next
    kernel); only the quantized-expert kernels take it, where few experts leave the GPU with too few programs."""

    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1


@dataclass(frozen=True)
class MoeKernelConfig:
    """``block_m``: rows (token-expert pairs) per program and the padding unit of each expert's run;
    ``up``: the gate|up GEMM (N = I, K = H); ``down``: the down GEMM (N = H, K = I);
    ``group_m``: row blocks walked together per column tile (L2 reuse of weight tiles)."""

    block_m: int
    up: GemmTile
    down: GemmTile
    group_m: int = 8

    def name(self) -> str:
        def tile(t: GemmTile) -> str:
            return f"{t.block_n}x{t.block_k}w{t.num_warps}s{t.num_stages}" + (f"k{t.split_k}" if t.split_k > 1 else "")

        return f"m{self.block_m}-up{tile(self.up)}-down{tile(self.down)}-g{self.group_m}"


# (upper bound of tokens per expert, class name); the last class takes everything larger.
SHAPE_CLASSES: tuple[tuple[float, str], ...] = ((1.0, "decode"), (8.0, "small"), (64.0, "medium"), (float("inf"), "large"))

CONFIGS: dict[str, MoeKernelConfig] = {
    "decode": MoeKernelConfig(16, GemmTile(32, 128, 4, 4), GemmTile(64, 128, 4, 4), group_m=1),
    "small": MoeKernelConfig(16, GemmTile(64, 128, 4, 3), GemmTile(128, 128, 4, 3), group_m=1),
    "medium": MoeKernelConfig(32, GemmTile(64, 128, 4, 3), GemmTile(128, 64, 4, 4), group_m=8),
    "large": MoeKernelConfig(64, GemmTile(128, 64, 8, 4), GemmTile(128, 64, 4, 4), group_m=8),
}

# Candidates the benchmark times for each class (the default first).  The gate|up kernel computes two
# accumulators (gate and up) per column tile, so its block_n covers half the columns of a plain GEMM's.
SWEEP: dict[str, tuple[MoeKernelConfig, ...]] = {
    "decode": (
        CONFIGS["decode"],
        MoeKernelConfig(16, GemmTile(32, 64, 4, 5), GemmTile(64, 64, 4, 5), group_m=1),
        MoeKernelConfig(16, GemmTile(32, 256, 4, 2), GemmTile(64, 256, 4, 2), group_m=1),
        MoeKernelConfig(16, GemmTile(16, 256, 2, 4), GemmTile(32, 128, 2, 5), group_m=1),
        MoeKernelConfig(16, GemmTile(64, 128, 4, 3), GemmTile(128, 128, 4, 3), group_m=1),
    ),
    "small": (
        CONFIGS["small"],
        MoeKernelConfig(16, GemmTile(32, 128, 4, 4), GemmTile(64, 128, 4, 4), group_m=1),
        MoeKernelConfig(16, GemmTile(64, 64, 4, 5), GemmTile(128, 64, 4, 4), group_m=16),
        MoeKernelConfig(32, GemmTile(64, 128, 4, 3), GemmTile(128, 128, 4, 3), group_m=4),
    ),
    "medium": (
        CONFIGS["medium"],
        MoeKernelConfig(32, GemmTile(128, 128, 4, 2), GemmTile(256, 128, 4, 2), group_m=16),
        MoeKernelConfig(16, GemmTile(64, 128, 4, 4), GemmTile(128, 128, 4, 3), group_m=8),
        MoeKernelConfig(64, GemmTile(64, 64, 4, 4), GemmTile(128, 64, 4, 4), group_m=8),
    ),
    "large": (
        CONFIGS["large"],
        MoeKernelConfig(128, GemmTile(128, 64, 8, 4), GemmTile(256, 64, 8, 4), group_m=16),
        MoeKernelConfig(128, GemmTile(64, 64, 8, 4), GemmTile(256, 64, 8, 4), group_m=8),
        MoeKernelConfig(128, GemmTile(128, 64, 8, 3), GemmTile(128, 64, 8, 3), group_m=8),
        MoeKernelConfig(64, GemmTile(64, 128, 4, 3), GemmTile(128, 128, 8, 3), group_m=8),
    ),
}


def shape_class(num_pairs: int, num_experts: int) -> str:
    per_expert = num_pairs / max(num_experts, 1)
    for bound, name in SHAPE_CLASSES:
        if per_expert <= bound:
            return name
    return SHAPE_CLASSES[-1][1]


def config_for(num_pairs: int, num_experts: int) -> MoeKernelConfig:
    return CONFIGS[shape_class(num_pairs, num_experts)]


SHARED_MEMORY_BUDGET = 200 * 1024  # bytes per block (H100/H200 allow 227 KiB; leave room for the epilogue)


def _fit(tile: GemmTile, block_m: int, weight_tiles: int, elem_bytes: int) -> GemmTile:
    """``tile`` with as many pipeline stages as fit the shared-memory budget (at least 1)."""
    per_stage = (block_m * tile.block_k + weight_tiles * tile.block_k * tile.block_n) * elem_bytes
    stages = max(1, min(tile.num_stages, SHARED_MEMORY_BUDGET // per_stage))
    return tile if stages == tile.num_stages else GemmTile(tile.block_n, tile.block_k, tile.num_warps, stages, tile.split_k)


def fit_shared_memory(cfg: MoeKernelConfig, elem_bytes: int) -> MoeKernelConfig:
    """The tiles were sized for 2-byte activations; wider elements (fp32) get fewer pipeline stages."""
    up = _fit(cfg.up, cfg.block_m, 2, elem_bytes)  # gate and up weight tiles
    down = _fit(cfg.down, cfg.block_m, 1, elem_bytes)
    return cfg if (up, down) == (cfg.up, cfg.down) else MoeKernelConfig(cfg.block_m, up, down, cfg.group_m)
