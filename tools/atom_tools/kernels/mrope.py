"""MRoPE on q and k: ATOM's Triton kernel (every launch config of the sweep, and the best) side by side
with transformers' eager implementation, the same under ``torch.compile``, and the floor.

Cases: Qwen3-VL (interleaved sections, head 128) and Qwen2.5-VL (chunked sections, head 128) with 32 q
and 4 kv heads; Qwen3.5 (interleaved, head 256, rotary 64, 16 q and 4 kv heads); each at T = 1024 and
16384, rotation alone and (for the models that have one) fused with the per-head q/k RMSNorm before
it.  bf16, positions ``[3, T]`` of an image-like prompt.  Times are medians of CUDA-graph replays
(``graph`` says whether capture worked) cycling over enough input copies to defeat the L2 cache.

Floors (bytes / measured copy bandwidth): ``floor_us`` counts what the op must move — the rotated dims
of q and k read and written once (the whole heads when the norm is fused); ``floor_qk_us`` counts whole
q and k read and written once.  They differ only under partial rotary (Qwen3.5).
Targets: ``ratio_to_floor <= 1.3`` at T = 16384 and under 15 µs at T = 1024.

Kernel configs: the full sweep times both kernels (``chunks``, ``pairs``) over block_h x num_warps; with
``--quick`` the shipped config plus the handful per shape class in :data:`QUICK_SWEEP`.  Two environment
variables narrow a run to what is being decided: ``ATOM_MROPE_BENCH_CASES`` (comma-separated case labels
as the rows name them, e.g. ``qwen3.5+qknorm,qwen3.5``; default all) and ``ATOM_MROPE_BENCH_PEERS``
(``eager,compile`` by default; ``eager`` skips the ``torch.compile`` peer and its compile time, empty
skips both).
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass

import torch

from atom_kernels.ops.mrope import triton as mrope_triton
from atom_tools.kernels import timing

L2_DEFEAT_BYTES = 256 << 20  # cycle over enough input copies that one replay streams this much
TARGET_RATIO_LARGE, TARGET_US_SMALL = 1.3, 15.0


@dataclass(frozen=True)
class Case:
    name: str
    hf_module: str  # transformers.models.<hf_module>.modeling_<hf_module>
    hf_rope: str  # its text rotary-embedding class
    hf_norm: str | None  # its per-head q/k RMSNorm class (None: the model has no q/k norm)
    num_heads: int
    num_kv_heads: int
    head_size: int
    rotary_dim: int
    section: tuple[int, int, int]
    interleaved: bool
    zero_centered: bool  # the norm's weight is stored as w - 1 (Qwen3.5)
    gated_q: bool  # q heads interleaved with an output gate in q_proj's rows (Qwen3.5)


CASES = [
    Case("qwen3-vl", "qwen3_vl", "Qwen3VLTextRotaryEmbedding", "Qwen3VLTextRMSNorm", 32, 4, 128, 128, (24, 20, 20),
         True, False, False),
    Case("qwen2.5-vl", "qwen2_5_vl", "Qwen2_5_VLRotaryEmbedding", None, 32, 4, 128, 128, (16, 24, 24),
         False, False, False),
    Case("qwen3.5", "qwen3_5", "Qwen3_5TextRotaryEmbedding", "Qwen3_5RMSNorm", 16, 4, 256, 64, (11, 11, 10),
         True, True, True),
]
TOKENS = (1024, 16384)
SWEEP_BLOCK_H = (1, 2, 4, 8, 16, 32)
SWEEP_WARPS = (1, 2, 4, 8)
_C = mrope_triton.Config
# --quick: per shape class, the "chunks" kernel around 8-32 elements per thread and the best "pairs" config
# of the 2026-11-30 H200 sweep as the control.
QUICK_SWEEP: dict[str, tuple[mrope_triton.Config, ...]] = {
    "norm-xwide": (_C(2, 1), _C(4, 1), _C(4, 2), _C(8, 2), _C(8, 4), _C(4, 2, "pairs")),  # Qwen3.5 + q/k norm
    "rope-narrow": (_C(4, 1), _C(8, 2), _C(16, 2), _C(16, 4), _C(8, 2, "pairs")),  # Qwen3.5 rope alone
    "norm-wide": (_C(4, 1), _C(4, 2), _C(8, 2), _C(8, 4), _C(8, 2, "pairs")),  # Qwen3-VL + q/k norm
    "rope-wide": (_C(4, 1), _C(8, 2), _C(16, 2), _C(16, 4), _C(8, 2, "pairs")),  # Qwen3-VL, Qwen2.5-VL
}
PEERS_ENV, CASES_ENV = "ATOM_MROPE_BENCH_PEERS", "ATOM_MROPE_BENCH_CASES"
MAX_POSITION = 32768


def image_positions(num_tokens: int, device) -> torch.Tensor:
    """``[3, T]``: a text prefix, one image of a 64-wide merged grid filling most of the prompt, text after."""
    prefix, width = min(16, num_tokens // 4), 64
    rows = max(0, (num_tokens - 2 * prefix) // width)
    pos = torch.arange(num_tokens, device=device).repeat(3, 1)
    image = torch.arange(rows * width, device=device)
    pos[0, prefix : prefix + rows * width] = prefix
    pos[1, prefix : prefix + rows * width] = prefix + image // width
    pos[2, prefix : prefix + rows * width] = prefix + image % width
    tail = prefix + rows * width
    pos[:, tail:] = torch.arange(num_tokens - tail, device=device) + prefix + max(rows, width)
    return pos


def _cos_sin_cache(case: Case, device) -> torch.Tensor:
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, case.rotary_dim, 2, dtype=torch.float32) / case.rotary_dim))
    angles = torch.arange(MAX_POSITION, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(device)


def _hf_modules(case: Case, device):
    import importlib

    module = importlib.import_module(f"transformers.models.{case.hf_module}.modeling_{case.hf_module}")
    config_module = importlib.import_module(f"transformers.models.{case.hf_module}.configuration_{case.hf_module}")
    config_class = {
        "qwen3_vl": "Qwen3VLTextConfig", "qwen2_5_vl": "Qwen2_5_VLTextConfig", "qwen3_5": "Qwen3_5TextConfig",
    }[case.hf_module]
    rope = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": list(case.section),
            "mrope_interleaved": case.interleaved, "partial_rotary_factor": case.rotary_dim / case.head_size}
    config = getattr(config_module, config_class)(
        hidden_size=case.num_heads * case.head_size, num_attention_heads=case.num_heads,
        num_key_value_heads=case.num_kv_heads, head_dim=case.head_size, max_position_embeddings=MAX_POSITION,
        rope_parameters=rope,
    )
    rotary = getattr(module, case.hf_rope)(config).to(device)
    norms = [getattr(module, case.hf_norm)(case.head_size, 1e-6).to(device, torch.bfloat16) for _ in range(2)
             ] if case.hf_norm else []
    return rotary, module.apply_rotary_pos_emb, norms


class Inputs:
    """Copies of one step's projection rows (q|k|v, or q+gate|k|v for Qwen3.5), cycled per call."""

    def __init__(self, case: Case, num_tokens: int, device, copies: int):
        q_width = case.num_heads * case.head_size * (2 if case.gated_q else 1)
        kv_width = case.num_kv_heads * case.head_size
        self.rows = [torch.randn(num_tokens, q_width + 2 * kv_width, device=device, dtype=torch.bfloat16)
                     for _ in range(copies)]
        self.case, self.q_width, self.kv_width, self.index = case, q_width, kv_width, 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """q ``[T, Hq, D]`` and k ``[T, Hk, D]`` views into the next copy."""
        rows = self.rows[self.index]
        self.index = (self.index + 1) % len(self.rows)
        case, d = self.case, self.case.head_size
        q = rows[:, : self.q_width].view(rows.shape[0], case.num_heads, -1)[..., :d]
        k = rows[:, self.q_width : self.q_width + self.kv_width].view(rows.shape[0], case.num_kv_heads, d)
        return q, k


def _configs(case: Case, fused: bool, quick: bool) -> list[mrope_triton.Config]:
    """The shipped config of this shape class, then the quick set, or every sweep point of both kernels with
    2..64 elements per thread."""
    shape = mrope_triton.shape_class(case.head_size, case.rotary_dim, fused)
    if quick:
        candidates = QUICK_SWEEP.get(shape, ())
    else:
        touched = case.head_size if fused else case.rotary_dim
        candidates = [mrope_triton.Config(block_h, warps, kernel)
                      for kernel, block_h, warps in itertools.product(mrope_triton.KERNELS, SWEEP_BLOCK_H, SWEEP_WARPS)
                      if 2 <= block_h * touched / (warps * 32) <= 64 and block_h <= case.num_heads]
    configs = [mrope_triton.CONFIGS[shape]]
    configs.extend(c for c in candidates if c not in configs)
    return configs


def run(ctx: dict) -> list[dict]:
    rows: list[dict] = []
    wanted = {name.strip() for name in os.environ.get(CASES_ENV, "").split(",") if name.strip()}
    for case, num_tokens, fused in itertools.product(CASES, TOKENS, (False, True)):
        if (fused and case.hf_norm is None) or (wanted and _label(case, fused) not in wanted):
            continue
        rows.extend(bench_case(case, num_tokens, fused, ctx, device=ctx.get("device", "cuda")))
    return rows


def _label(case: Case, fused: bool) -> str:
    return f"{case.name}{'+qknorm' if fused else ''}"


def _peers() -> tuple[str, ...]:
    """The transformers peers to time: ``hf-eager`` and/or ``hf-compile`` (see the module docstring)."""
    chosen = {name.strip() for name in os.environ.get(PEERS_ENV, "eager,compile").split(",") if name.strip()}
    return tuple(f"hf-{name}" for name in ("eager", "compile") if name in chosen)


def _compiled(fn):
    """``torch.compile(fn)`` for one (case, T): dynamo's caches are cleared first, because every case's step
    shares one code object and past its recompile limit dynamo would silently run the later cases eagerly."""
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def bench_case(case: Case, num_tokens: int, fused: bool, ctx: dict, device: str = "cuda") -> list[dict]:
    """Rows for one (case, T, fused?): every swept config, transformers eager and compiled, best, floor."""
    copy_bw = ctx["copy_bytes_per_s"]
    heads = case.num_heads + case.num_kv_heads
    touched = case.head_size if fused else case.rotary_dim
    op_bytes = 2 * num_tokens * heads * touched * 2  # bf16, read + written
    qk_bytes = 2 * num_tokens * heads * case.head_size * 2
    copies = max(1, min(32, math.ceil(L2_DEFEAT_BYTES / qk_bytes)))
    inputs = Inputs(case, num_tokens, device, copies)
    positions = image_positions(num_tokens, device)
    cache = _cos_sin_cache(case, device)
    offset = 1.0 if case.zero_centered else 0.0
    q_weight, k_weight = (torch.randn(case.head_size, device=device, dtype=torch.bfloat16) * 0.1 if fused else None
                          for _ in range(2))
    base = dict(case=_label(case, fused), T=num_tokens,
                heads=f"{case.num_heads}/{case.num_kv_heads}", head_size=case.head_size, rotary_dim=case.rotary_dim,
                layout="interleaved" if case.interleaved else "chunked", bytes=op_bytes,
                floor_us=op_bytes / copy_bw * 1e6, floor_qk_us=qk_bytes / copy_bw * 1e6)
    rows: list[dict] = []

    def row(impl: str, us: float, **extra) -> None:
        rows.append(dict(base, impl=impl, us=us, TBps=op_bytes / (us * 1e-6) / 1e12,
                         ratio_to_floor=us / base["floor_us"], **extra))

    def measure(fn) -> dict:
        return timing.measure(fn, calls_per_graph=max(copies, 20))

    def atom(config: mrope_triton.Config):
        def step():
            q, k = inputs.next()
            mrope_triton.launch(positions, q, k, cache, case.head_size, case.section, case.interleaved,
                                q_weight, k_weight, 1e-6, offset, config)
        return step

    sweep = []
    for config in _configs(case, fused, ctx.get("quick", False)):
        try:
            timed = measure(atom(config))
        except Exception as err:  # a config that does not compile is reported, not fatal
            rows.append(dict(base, impl="atom-triton", config=vars(config), error=f"{type(err).__name__}: {err}"))
            continue
        sweep.append((timed["us"], config))
        row("atom-triton", timed["us"], graph=timed["graph"], config=vars(config))

    peers = {}
    try:
        rotary, apply_rope, norms = _hf_modules(case, device)
        pos_ids = positions[:, None, :]  # [3, batch, T]

        def hf_step(q, k):
            q, k = q.transpose(0, 1)[None], k.transpose(0, 1)[None]  # transformers' [B, H, T, D] views
            if fused:
                q, k = norms[0](q), norms[1](k)
            cos, sin = rotary(q, pos_ids)
            return apply_rope(q, k, cos, sin)

        impls = {"hf-eager": lambda: hf_step, "hf-compile": lambda: _compiled(hf_step)}
        for name in _peers():
            fn = impls[name]()
            timed = measure(lambda fn=fn: fn(*inputs.next()))
            peers[f"{name.replace('-', '_')}_us"] = timed["us"]
            row(name, timed["us"], graph=timed["graph"])
    except Exception as err:  # the peers missing must not lose ATOM's numbers
        rows.append(dict(base, impl="hf", error=f"{type(err).__name__}: {err}"))

    if sweep:
        shipped = mrope_triton.CONFIGS[mrope_triton.shape_class(case.head_size, case.rotary_dim, fused)]
        best_us, best = min(sweep, key=lambda item: item[0])
        meets = best_us / base["floor_us"] <= TARGET_RATIO_LARGE if num_tokens >= 16384 else best_us < TARGET_US_SMALL
        best_by_kernel = {kernel: min(us for us, c in sweep if c.kernel == kernel)
                          for kernel in mrope_triton.KERNELS if any(c.kernel == kernel for _, c in sweep)}
        row("atom-triton-best", best_us, config=vars(best), shipped_config=vars(shipped),
            shipped_us=next((us for us, c in sweep if c == shipped), None), meets_target=meets,
            ratio_to_floor_qk=best_us / base["floor_qk_us"], best_us_by_kernel=best_by_kernel, **peers)
    row("floor", base["floor_us"])
    return rows
