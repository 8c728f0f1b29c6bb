"""Gated DeltaNet kernels on the GPU, side by side with flash-linear-attention 0.6.0 and the floor.

Cases (Qwen3-Next-80B linear-attention shapes: H=16, HV=32, K=V=128, bf16 activations, fp32 state):

* ``decode N=1/64/256``: one token per sequence, state pool updated in place.  Floor = state bytes read
  + written (plus the few activation bytes) over the measured copy bandwidth.  Timed by CUDA-graph
  replay, rotating over enough distinct slots per replay that the states come from HBM, not L2.
  Targets: N=256 within 1.15x of the floor and faster than fla's fused recurrent; N=1 under 15 µs.
* ``prefill 1x8192`` and ``prefill 8x4096``: chunked prefill from zero state, final states written to
  the pool, q/k through SiLU as the conv output the layer passes (correlated keys stress the WY inverse).
  fla is timed eagerly (its varlen path is not graph-capturable); ATOM eagerly (the row compared with
  fla) and by graph replay.  Target: faster than fla's ``chunk_gated_delta_rule``.  Each row carries
  ``rel_err_vs_ref``: its output against the "solve" mode with IEEE merges (A through memory, forward
  substitution), so a fast config that computes something else shows; the kernel breakdown of the best config
  follows.
* ``conv update`` / ``conv prefill`` / ``rms_norm_gated``: the small ops of the layer against their floors
  (``--quick`` times only their chosen configs).

Every Triton config of the sweep is a row (``"sweep": true``); the best per case is repeated as
``impl="atom best"`` with its config, so one GPU run picks the CONFIGS entries.  fla rows are skipped
(with a row saying why) when ``fla`` does not import.
"""

from __future__ import annotations

import functools
import itertools
import os
from typing import Any

import torch

from atom_kernels.gdn import K_MAJOR, STATE_LAYOUTS, ssm_state_shape
from atom_kernels.ops.causal_conv1d import triton as conv_triton
from atom_kernels.ops.causal_conv1d_update import triton as conv_update_triton
from atom_kernels.ops.chunk_gated_delta_rule import triton as chunk_triton
from atom_kernels.ops.fused_recurrent_gated_delta_rule import triton as decode_triton
from atom_kernels.ops.rms_norm_gated import triton as norm_triton
from atom_tools.kernels.timing import measure

H, HV, K, V = 16, 32, 128, 128
CONV_DIM = 2 * H * K + HV * V
ACT = torch.bfloat16
L2_DEFEAT_BYTES = 256 << 20  # bytes touched per graph replay, well above the H200's 50 MB L2
DEVICE = "cuda"
MAX_TILE_PER_THREAD = 128  # decode configs holding more fp32 state elements per thread would spill
ACCURACY_BOUND = 2e-2  # relative error of a prefill config's bf16 output vs the first version's (the tests' bf16 bound)


def _fla():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    except Exception as err:  # noqa: BLE001 - any import failure means "no fla here"
        return None, f"{type(err).__name__}: {err}"
    import fla

    return (chunk_gated_delta_rule, fused_recurrent_gated_delta_rule, getattr(fla, "__version__", "?")), None


def _time(fn, *, rotate: int = 1, eager: bool = False) -> dict | Exception:
    """``measure``: CUDA-graph replay of >= 20 calls (``rotate`` distinct inputs cycled), or eager calls;
    the exception instead when the call fails."""
    try:
        if eager:
            return measure(fn, use_graph=False, calls_per_graph=3, reps=15)
        return measure(fn, calls_per_graph=max(20, rotate))
    except Exception as err:  # noqa: BLE001 - reported as an error row
        return err


def _row(case: str, impl: str, timing: dict | Exception, nbytes: int, ctx: dict, flops: float = 0.0, **extra: Any) -> dict:
    """One result row; a timing that failed (a config that does not compile, a peer that breaks) becomes an
    error row, so one bad config never loses the rest of the suite."""
    if isinstance(timing, Exception):
        return {"case": case, "impl": impl, "error": f"{type(timing).__name__}: {str(timing)[:300]}", **extra}
    us = timing["us"]
    floor_us = nbytes / ctx["copy_bytes_per_s"] * 1e6
    row = {"case": case, "impl": impl, "us": us, "graph": timing["graph"], "bytes": nbytes,
           "TBps": nbytes / (us * 1e-6) / 1e12, "floor_us": floor_us, "ratio_to_floor": us / floor_us,
           "samples_us": timing.get("samples_us")}
    if flops:
        row["flops"] = flops
        row["TFLOPs"] = flops / (us * 1e-6) / 1e12
    row.update(extra)
    return row


def _best(rows: list[dict], case: str, impl: str = "atom best", **match: Any) -> dict | None:
    """The fastest sweep row of ``case`` (matching ``match``); rows whose output disagrees with the IEEE "solve"
    mode beyond the bf16 tolerance never count as best."""
    mine = [r for r in rows if r["case"] == case and r.get("sweep") and "us" in r
            and r.get("rel_err_vs_ref", 0.0) <= ACCURACY_BOUND and all(r.get(k) == v for k, v in match.items())]
    if not mine:
        return None
    best = dict(min(mine, key=lambda r: r["us"]))
    best["impl"], best["sweep"] = impl, False
    return best


def kernel_breakdown(fn, case: str) -> list[dict]:
    """GPU time of each kernel of one call (torch.profiler), to see where a multi-kernel op spends it."""
    try:
        from torch.profiler import ProfilerActivity, profile

        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                fn()
            torch.cuda.synchronize()
        return [{"case": case, "impl": "kernel breakdown", "kernel": e.key, "us": e.device_time_total / e.count,
                 "calls_per_op": e.count / 5} for e in prof.key_averages() if e.device_time_total > 0]
    except Exception as err:  # noqa: BLE001 - the breakdown is a diagnostic, never fatal
        return [{"case": case, "impl": "kernel breakdown", "error": repr(err)}]


def _inputs(num_tokens: int, gen: torch.Generator, silu_qk: bool = False):
    """q, k, v as views into one packed projection (as the layer passes them), a, b, A_log, dt_bias.
    ``silu_qk``: q/k through SiLU, like the conv output they come from (positive-mean, correlated keys)."""
    proj = torch.randn(num_tokens, CONV_DIM, device=DEVICE, dtype=ACT, generator=gen)
    if silu_qk:
        proj[:, : 2 * H * K] = torch.nn.functional.silu(proj[:, : 2 * H * K])
    q = proj[:, : H * K].view(num_tokens, H, K)
    k = proj[:, H * K : 2 * H * K].view(num_tokens, H, K)
    v = proj[:, 2 * H * K :].view(num_tokens, HV, V)
    ab = torch.randn(num_tokens, 2 * HV, device=DEVICE, dtype=ACT, generator=gen)
    A_log = torch.empty(HV, device=DEVICE).uniform_(1, 16, generator=gen).log()
    dt_bias = torch.ones(HV, device=DEVICE)
    return q, k, v, ab[:, :HV], ab[:, HV:], A_log, dt_bias


class _Cycle:
    """Calls ``fns`` in turn: graph replays of a rotation touch different memory each call."""

    def __init__(self, fns):
        self.fns, self.i = fns, 0

    def __call__(self):
        fn = self.fns[self.i % len(self.fns)]
        self.i += 1
        return fn()


# ------------------------------------------------------------------------------------------- decode
DECODE_SWEEP = [dict(BV=bv, num_warps=w) for bv, w in itertools.product([8, 16, 32, 64, 128], [1, 2, 4, 8])
                if K * bv // (32 * w) <= MAX_TILE_PER_THREAD]


def decode_rows(ctx: dict, fla) -> list[dict]:
    rows: list[dict] = []
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    for n in (1, 64, 256):
        rows += _decode_case(ctx, fla, n, gen)
    return rows


def _decode_case(ctx: dict, fla, n: int, gen: torch.Generator) -> list[dict]:
    rows: list[dict] = []
    case = f"decode N={n}"
    sweep = DECODE_SWEEP[::3] if ctx.get("quick") else DECODE_SWEEP
    state_bytes = n * HV * K * V * 4
    rot = max(1, min(64, L2_DEFEAT_BYTES // state_bytes))
    q, k, v, a, b, A_log, dt_bias = _inputs(n, gen)
    nbytes = 2 * state_bytes + n * (2 * H * K + 2 * HV * V + 2 * HV) * 2
    out = torch.empty(n, HV, V, device=DEVICE, dtype=ACT)

    def call(pool, slots, layout, cfg):
        return decode_triton.launch(q, k, v, a, b, A_log, dt_bias, pool, slots, out, scale=K**-0.5, state_layout=layout,
                                    use_qk_l2norm=True, num_accepted_tokens=None, config=cfg)

    for layout in STATE_LAYOUTS:
        pool = torch.randn(n * rot, *ssm_state_shape(layout, HV, K, V), device=DEVICE) * 0.1
        slot_sets = [torch.arange(r * n, (r + 1) * n, device=DEVICE) for r in range(rot)]
        for cfg in sweep:
            calls = [functools.partial(call, pool, slots, layout, cfg) for slots in slot_sets]
            timing = _time(_Cycle(calls), rotate=rot)
            rows.append(_row(case, f"atom triton {layout}", timing, nbytes, ctx, sweep=True, config=cfg, layout=layout))
    default_cfg = decode_triton.CONFIGS[decode_triton.shape_class(n, HV)]
    rows += [{**r, "impl": f"atom default {r['layout']}", "sweep": False} for r in rows if r.get("config") == default_cfg]
    rows += [r for r in (_best(rows, case, f"atom best {lay}", layout=lay) for lay in STATE_LAYOUTS) if r]
    rows += [r for r in [_best(rows, case)] if r]
    if fla is not None:
        _, fla_recurrent, version = fla
        states = torch.randn(rot, n, HV, K, V, device=DEVICE) * 0.1
        q4, k4, v4 = (t.unsqueeze(1) for t in (q, k, v))  # [N, 1, heads, dim]
        a3, b3 = a.unsqueeze(1), b.unsqueeze(1)

        def fla_call(r):
            return fla_recurrent(q4, k4, v4, g=a3, beta=b3, A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True,
                                 use_beta_sigmoid_in_kernel=True, use_qk_l2norm_in_kernel=True, initial_state=states[r],
                                 output_final_state=True)

        timing = _time(_Cycle([functools.partial(fla_call, r) for r in range(rot)]), rotate=rot)
        rows.append(_row(case, f"fla {version} fused_recurrent", timing, nbytes, ctx, sweep=False))
    return rows


# ------------------------------------------------------------------------------------------- prefill
# One knob changed from the shape class's default at a time (a coordinate sweep; knobs act on separate kernels).
PREFILL_SWEEP = {
    "intra": ["fused", "solve"],
    "intra_warps": [1, 2, 4],
    "intra_BK": [32, 64],
    "inverse": ["subst", "double"],
    "inv_prec": ["tf32", "ieee"],
    "state_BV": [16, 32, 64],
    "state_warps": [2, 4, 8],
    "state_stages": [1, 2, 3],
    "out_BV": [32, 64, 128],
    "out_warps": [4, 8],
}
# --quick: the candidates that decide the defaults, few enough to compile in seconds
PREFILL_QUICK = {  # the intra_* and inverse knobs only change the "fused"/"solve" kernels
    "intra": ["fused", "solve"],
    "intra_warps": [1, 2],
    "inverse": ["subst", "double"],
    "state_BV": [32],
    "state_stages": [2, 3],
    "out_BV": [64, 128],
}


# ATOM_GDN_BENCH_FOCUS=1: only the shipped default against the other intra-chunk modes (the one decision a
# short GPU run can afford); ATOM_GDN_BENCH_PARTS narrows the run to some of "decode", "prefill", "small" (default all).
PREFILL_FOCUS = {"intra": ["fused", "solve"]}
FOCUS_ENV, PARTS_ENV = "ATOM_GDN_BENCH_FOCUS", "ATOM_GDN_BENCH_PARTS"
PARTS = ("decode", "prefill", "small")


def prefill_configs(base: dict, quick: bool) -> list[dict]:
    """The default, then one knob changed at a time."""
    configs = [dict(base)]
    sweep = PREFILL_FOCUS if os.environ.get(FOCUS_ENV) else PREFILL_QUICK if quick else PREFILL_SWEEP
    for knob, values in sweep.items():
        for value in values:
            if value != base[knob]:
                configs.append({**base, knob: value})
    return configs


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def prefill_flops(num_tokens: int) -> float:
    """Matrix-product FLOPs of the chunked algorithm (chunk 64), per token and value head, times both."""
    c = chunk_triton.BT
    per = 2 * c * K + 2 * c * (K + V) + 4 * K * V + 2 * c * K + 2 * K * V + 2 * c * V
    return float(per * num_tokens * HV)


def prefill_rows(ctx: dict, fla) -> list[dict]:
    rows: list[dict] = []
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    for num_seqs, seq_len in ((1, 8192), (8, 4096)):
        rows += _prefill_case(ctx, fla, num_seqs, seq_len, gen)
    return rows


def _prefill_case(ctx: dict, fla, num_seqs: int, seq_len: int, gen: torch.Generator) -> list[dict]:
    rows: list[dict] = []
    case = f"prefill {num_seqs}x{seq_len}"
    T = num_seqs * seq_len
    q, k, v, a, b, A_log, dt_bias = _inputs(T, gen, silu_qk=True)
    cu = torch.arange(num_seqs + 1, device=DEVICE, dtype=torch.int32) * seq_len
    slots = torch.arange(num_seqs, device=DEVICE)
    pool = torch.zeros(num_seqs, HV, K, V, device=DEVICE)
    # activations read once, output written once, final states written: what any implementation moves
    nbytes = T * (2 * H * K + HV * V + 2 * HV + HV * V) * 2 + num_seqs * HV * K * V * 4
    flops = prefill_flops(T)

    def call(cfg):
        return chunk_triton.chunk_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, pool, cu, slots, None,
                                                   state_layout=K_MAJOR, config=cfg)

    base = chunk_triton.CONFIGS[chunk_triton.shape_class(num_seqs, HV)]
    # every config's output against A through memory by forward substitution with IEEE merges: a fast variant
    # that computes the wrong thing must show here, not only in the tests
    ref_out = call({**base, "intra": "solve", "inverse": "subst", "inv_prec": "ieee"}).clone()
    for cfg in prefill_configs(base, ctx.get("quick", False)):
        timing = _time(functools.partial(call, cfg), eager=True)
        extra = {} if isinstance(timing, Exception) else {"rel_err_vs_ref": _rel_err(call(cfg), ref_out)}
        rows.append(_row(case, "atom triton (eager)", timing, nbytes, ctx, flops, sweep=True, config=cfg,
                         default=cfg == base, **extra))
    best = _best(rows, case)
    if best:
        rows.append(best)
        best_call = functools.partial(call, best["config"])
        timing = _time(best_call)
        rows.append(_row(case, "atom best (graph replay)", timing, nbytes, ctx, flops, sweep=False, config=best["config"]))
        rows += kernel_breakdown(best_call, case)
    if fla is not None:
        fla_chunk, _, version = fla
        cu_long = cu.long()
        cu_cpu = cu_long.cpu()
        q4, k4, v4, a3, b3 = (t.unsqueeze(0) for t in (q, k, v, a, b))

        def fla_call():
            return fla_chunk(q4, k4, v4, g=a3, beta=b3, A_log=A_log, dt_bias=dt_bias, use_gate_in_kernel=True,
                             use_beta_sigmoid_in_kernel=True, use_qk_l2norm_in_kernel=True, initial_state=None,
                             output_final_state=True, cu_seqlens=cu_long, cu_seqlens_cpu=cu_cpu)

        timing = _time(fla_call, eager=True)
        extra = {} if isinstance(timing, Exception) else {"rel_err_vs_ref": _rel_err(fla_call()[0][0], ref_out)}
        rows.append(_row(case, f"fla {version} chunk (eager)", timing, nbytes, ctx, flops, sweep=False, **extra))
        rows += [dict(r, impl="fla kernel breakdown") for r in kernel_breakdown(fla_call, case)]
    return rows


# ------------------------------------------------------------------------------------------- small ops
def small_op_rows(ctx: dict) -> list[dict]:
    rows: list[dict] = []
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    weight = torch.randn(CONV_DIM, 4, device=DEVICE, dtype=ACT, generator=gen)
    for n in (1, 64, 256):
        rows += _conv_update_case(ctx, n, weight, gen)
    rows += _conv_prefill_case(ctx, 8192, weight, gen)
    for T in (256, 8192):
        o, z = (torch.randn(T, HV, V, device=DEVICE, dtype=ACT, generator=gen) for _ in range(2))
        w = torch.randn(V, device=DEVICE, dtype=ACT, generator=gen)
        timing = _time(functools.partial(norm_triton.rms_norm_gated, o, z, w, 1e-6))
        rows.append(_row(f"rms_norm_gated T={T}", "atom triton", timing, 3 * T * HV * V * 2, ctx, sweep=False))
    return rows


def _conv_update_case(ctx: dict, n: int, weight: torch.Tensor, gen: torch.Generator) -> list[dict]:
    rows: list[dict] = []
    case = f"conv update N={n}"
    x = torch.randn(n, CONV_DIM, device=DEVICE, dtype=ACT, generator=gen)
    pool = torch.randn(n, 3, CONV_DIM, device=DEVICE, dtype=ACT, generator=gen).transpose(1, 2)
    slots = torch.arange(n, device=DEVICE)
    nbytes = n * CONV_DIM * (2 + 2 + 3 * 2 * 2)  # x in, out, state read + written
    sweep = [dict(BD=bd, num_warps=warps) for bd, warps in itertools.product([128, 256, 512, 1024], [1, 2, 4])]
    for cfg in [conv_update_triton.CONFIGS["default"]] if ctx.get("quick") else sweep:  # quick: chosen already
        timing = _time(functools.partial(conv_update_triton.causal_conv1d_update, x, weight, None, pool, slots, config=cfg))
        rows.append(_row(case, "atom triton", timing, nbytes, ctx, sweep=True, config=cfg))
    return rows + [r for r in [_best(rows, case)] if r]


def _conv_prefill_case(ctx: dict, T: int, weight: torch.Tensor, gen: torch.Generator) -> list[dict]:
    rows: list[dict] = []
    case = f"conv prefill 1x{T}"
    x = torch.randn(T, CONV_DIM, device=DEVICE, dtype=ACT, generator=gen)
    pool = torch.zeros(1, 3, CONV_DIM, device=DEVICE, dtype=ACT).transpose(1, 2)
    cu = torch.tensor([0, T], device=DEVICE, dtype=torch.int32)
    slots = torch.zeros(1, dtype=torch.long, device=DEVICE)
    sweep = [dict(BT=bt, BD=bd, num_warps=warps) for bt, bd, warps in itertools.product([16, 32, 64], [64, 128, 256], [4, 8])]
    for cfg in [conv_triton.CONFIGS["default"]] if ctx.get("quick") else sweep:  # quick: chosen already
        timing = _time(functools.partial(conv_triton.causal_conv1d, x, weight, None, pool, cu, slots, None, config=cfg))
        rows.append(_row(case, "atom triton", timing, 2 * T * CONV_DIM * 2, ctx, sweep=True, config=cfg))
    return rows + [r for r in [_best(rows, case)] if r]


def _find(rows: list[dict], case: str, impl: str) -> dict | None:
    """The row of ``case`` whose impl is ``impl`` ("fla": any fla timing row)."""
    def hit(r: dict) -> bool:
        name = str(r.get("impl", ""))
        return (name.startswith("fla ") and "breakdown" not in name) if impl == "fla" else name == impl
    return next((r for r in rows if r.get("case") == case and "us" in r and hit(r)), None)


def target_rows(rows: list[dict]) -> list[dict]:
    """The issue's targets, each with the measured numbers and whether it is met (None: not measured)."""
    out = []

    def target(name: str, met, **numbers):
        out.append({"case": "target", "impl": name, "met": met, **numbers})

    n256, fla256 = _find(rows, "decode N=256", "atom best"), _find(rows, "decode N=256", "fla")
    target("decode N=256 within 1.15x of the floor", None if n256 is None else n256["ratio_to_floor"] <= 1.15,
           ratio=n256 and n256["ratio_to_floor"], us=n256 and n256["us"], floor_us=n256 and n256["floor_us"])
    target("decode N=256 faster than fla fused_recurrent", None if not (n256 and fla256) else n256["us"] < fla256["us"],
           atom_us=n256 and n256["us"], fla_us=fla256 and fla256["us"])
    n1 = _find(rows, "decode N=1", "atom best")
    target("decode N=1 under 15 us (graph replay)", None if n1 is None else n1["us"] < 15.0 and n1["graph"],
           us=n1 and n1["us"])
    for case in ("prefill 1x8192", "prefill 8x4096"):
        mine, theirs = _find(rows, case, "atom best"), _find(rows, case, "fla")
        target(f"{case} faster than fla chunk_gated_delta_rule", None if not (mine and theirs) else mine["us"] < theirs["us"],
               atom_us=mine and mine["us"], fla_us=theirs and theirs["us"])
    return out


def run(ctx: dict) -> list[dict]:
    fla, why = _fla()
    rows: list[dict] = []
    if fla is None:
        rows.append({"case": "all", "impl": "fla", "skipped": f"flash-linear-attention not importable: {why}"})
    parts = [p.strip() for p in os.environ.get(PARTS_ENV, ",".join(PARTS)).split(",") if p.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"{PARTS_ENV}: unknown parts {sorted(unknown)}; known: {PARTS}")
    producers = {"decode": decode_rows, "prefill": prefill_rows, "small": lambda c, _fla: small_op_rows(c)}
    with torch.inference_mode():
        for part in parts:
            rows += producers[part](ctx, fla)
    return rows + target_rows(rows)
