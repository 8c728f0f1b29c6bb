"""Compile ATOM's quantization kernels for sm_90 without a GPU and report what the compiler produced
(run as a script, with TRITON_INTERPRET unset, by test_sm90_compile.py).  Prints one JSON object:
case -> {"shared": bytes, "ptx_div_rn": bool, "sass": {opcode: count}, "loop_sass": {opcode: count inside
loops}, "before_wait": {opcode: count before the first griddepcontrol.wait (ACQBULK)}, "registers": n, "spill_bytes":
local + stack bytes per thread}."""

import collections
import json
import os
import re
import subprocess
import sys
import tempfile

import triton

from atom_kernels.ops.fp8_gemm import BLOCKWISE_CONFIGS as FP8_BLOCK_CONFIGS
from atom_kernels.ops.fp8_gemm import CONFIGS as FP8_CONFIGS
from atom_kernels.ops.fp8_gemm import _fp8_gemm_kernel
from atom_kernels.ops.fused_moe.triton_quant import (
    _moe_down_quant_kernel,
    _moe_up_quant_kernel,
    k_split,
    loads_in_mma_rows,
    quant_config_for,
)
from atom_kernels.ops.mxfp4_mm.decode import chunk_groups
from atom_kernels.ops.mxfp4_mm.planner import DEFAULT as SMALL_M_DEFAULT
from atom_kernels.ops.mxfp4_mm.planner import plan
from atom_kernels.ops.mxfp4_mm.triton import CONFIGS as MX_CONFIGS
from atom_kernels.ops.mxfp4_mm.triton import _mxfp4_mm_kernel
from atom_kernels.ops.mxfp4_mm.triton_small_m import _mxfp4_small_m_kernel
from atom_kernels.ops.quant_fp8.triton import _quant_groups_kernel, _quant_rows_kernel
from atom_kernels.ops.rms_norm.triton import _rms_norm_kernel
from atom_kernels.ops.silu_and_mul.triton import _silu_and_mul_kernel

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def compile_sm90(fn, signature, constexprs, divisible, num_warps=4, num_stages=3, launch_pdl=False):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(signature)
    attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in divisible}
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, "num_stages": num_stages,
                                                                          "launch_pdl": launch_pdl})


def report(compiled) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        text = subprocess.run([os.path.join(BIN, "cuobjdump"), "-sass", cubin.name], capture_output=True, text=True).stdout
        usage = subprocess.run([os.path.join(BIN, "cuobjdump"), "-res-usage", cubin.name], capture_output=True,
                               text=True).stdout
    listing = [(int(m.group(1), 16), m.group(2), m.group(3)) for m in
               re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^\n]*)", text)]
    ops = collections.Counter(op for _, op, _ in listing)
    loop_ops = collections.Counter()  # inside any loop: from a backward branch's target up to the branch
    half_operands = 0  # bf16x2 multiplies in a loop taking one half of a register as both lanes (R.H0_H0 / R.H1_H1)
    for addr, op, rest in listing:
        target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if target and int(target.group(1), 16) < addr:
            body = [(o, r) for a, o, r in listing if int(target.group(1), 16) <= a <= addr]
            loop_ops.update(o for o, _ in body)
            half_operands += sum(o.startswith("HMUL2") and bool(re.search(r"\.H([01])_H\1\b", r)) for o, r in body)
    wait = next((addr for addr, op, _ in listing if op == "ACQBULK"), None)  # griddepcontrol.wait (PDL)
    never = {int(m.group(1), 16) for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+@!PT\s", text)}  # padding
    before_wait = collections.Counter(op for addr, op, _ in listing if wait is not None and addr < wait
                                      and addr not in never)
    res = {k: int(v) for k, v in re.findall(r"(REG|STACK|LOCAL):(\d+)", usage)}
    named = collections.Counter(m.group(1) for m in re.finditer(r"BAR\.SYNC\.DEFER_BLOCKING (0x[0-9a-f]+), 0x80 ;", text))
    return {"shared": compiled.metadata.shared, "ptx_div_rn": "div.rn.f32" in compiled.asm["ptx"], "sass": dict(ops),
            "loop_sass": dict(loop_ops), "before_wait": dict(before_wait), "half_operands": half_operands,
            "registers": res.get("REG"), "spill_bytes": res.get("STACK", 0) + res.get("LOCAL", 0),
            "warps": compiled.metadata.num_warps, "warpgroup_barriers": dict(named)}


QUANT_ROWS_SIG = {"x_ptr": "*bf16", "x_stride": "i64", "q_ptr": "*fp8e4nv", "q_stride": "i64", "s_ptr": "*fp32",
                  "static_ptr": "*fp32", "K": "constexpr", "STATIC": "constexpr", "BLOCK": "constexpr"}
QUANT_GROUPS_SIG = {"x_ptr": "*bf16", "x_stride": "i64", "q_ptr": "*fp8e4nv", "q_stride": "i64", "s_ptr": "*fp32",
                    "s_stride": "i64", "K": "i32", "group_size": "i32", "num_groups": "i32", "GROUP": "constexpr",
                    "GROUPS": "constexpr"}
FP8_SIG = {
    "a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "c_ptr": "*bf16", "ws_ptr": "*fp32", "as_ptr": "*fp32", "bs_ptr": "*fp32",
    "bias_ptr": "*bf16", "P": "i32", "Q": "i32", "stride_ap": "i32", "stride_bq": "i32", "stride_cp": "i32",
    "stride_cq": "i32", "stride_as_p": "i32", "stride_as_k": "i32", "stride_bs_q": "i32", "stride_bs_k": "i32",
    **{name: "constexpr" for name in ("K", "K_SPLIT", "BLOCKWISE", "A_SCALE_DIV", "B_SCALE_DIV", "HAS_BIAS",
                                       "BIAS_ON_P", "SPLIT_K", "BLOCK_P", "BLOCK_Q", "BLOCK_K", "GROUP")},
}
MX_SIG = {
    "w_ptr": "*i32", "s_ptr": "*u8", "x_ptr": "*bf16", "out_ptr": "*bf16", "ws_ptr": "*fp32", "bias_ptr": "*bf16",
    "N": "i32", "M": "i32", "stride_xm": "i32", "stride_om": "i32",
    **{name: "constexpr" for name in ("K", "K_SPLIT", "SPLIT_K", "HAS_BIAS", "BLOCK_N", "BLOCK_M", "BLOCK_K", "GROUP",
                                       "EXACT", "SHIFT", "EVEN_N", "EVEN_K", "LANES")},
}


MOE_UP_SIG = {
    "x_ptr": "*fp8e4nv", "x_stride": "i32", "xs_ptr": "*fp32", "xs_stride": "i32", "w_ptr": "*fp8e4nv",
    "w_stride_e": "i32", "w_stride_n": "i32", "s_ptr": "*fp32", "s_stride_e": "i32", "s_stride_n": "i32",
    "act_ptr": "*bf16", "ws_ptr": "*fp32", "sorted_ptr": "*i32", "block_experts_ptr": "*i32", "num_pairs": "i32",
    "num_row_blocks": "i32", "b_ptr": "*bf16", "b_stride_e": "i32",
    **{name: "constexpr" for name in ("TOP_K", "H", "I", "FORMAT", "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "EXACT",
                                       "SHIFT", "C", "SPLIT_K", "K_SPLIT", "MMA_ROWS")},
}
MOE_DOWN_SIG = {
    "a_ptr": "*fp8e4nv", "a_stride": "i32", "as_ptr": "*fp32", "as_stride": "i32", "w_ptr": "*fp8e4nv",
    "w_stride_e": "i32", "w_stride_n": "i32", "s_ptr": "*fp32", "s_stride_e": "i32", "s_stride_n": "i32",
    "out_ptr": "*bf16", "weights_ptr": "*fp32", "sorted_ptr": "*i32", "block_experts_ptr": "*i32", "num_pairs": "i32",
    "num_row_blocks": "i32", "b_ptr": "*bf16", "b_stride_e": "i32",
    **{name: "constexpr" for name in ("H", "I", "FORMAT", "BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "EXACT", "SHIFT",
                                       "C", "SPLIT_K", "K_SPLIT", "MMA_ROWS")},
}


def _mxfp4_signature(sig: dict) -> dict:
    """The MXFP4 expert kernels: int32 words, e8m0 bytes, bf16 activations (the scale args unused)."""
    out = dict(sig, w_ptr="*i32", s_ptr="*u8")
    for name in ("x_ptr", "xs_ptr", "a_ptr", "as_ptr"):
        if name in out:
            out[name] = "*bf16"
    return out


def moe_cases():
    """Qwen3-30B-A3B's expert shapes (H 2048, I 768) with the decode and large tiles, both formats."""
    for shape_class in ("decode", "large"):
        for fmt, fmt_name in ((0, "fp8"), (1, "mxfp4")):
            cfg = quant_config_for(1 if shape_class == "decode" else 1 << 20, 128, fmt)
            for kernel, sig, tile, extra in ((_moe_up_quant_kernel, MOE_UP_SIG, cfg.up, {"TOP_K": 8}),
                                             (_moe_down_quant_kernel, MOE_DOWN_SIG, cfg.down, {})):
                sig = sig if fmt == 0 else _mxfp4_signature(sig)
                block_k = 128 if fmt == 0 else tile.block_k
                k = 2048 if extra else 768
                c = 1 if fmt == 0 else chunk_groups(k, block_k)
                splits, per_split = k_split(k, tile, block_k)
                constexprs = dict(H=2048, I=768, FORMAT=fmt, BLOCK_M=cfg.block_m, BLOCK_N=tile.block_n,
                                  BLOCK_K=block_k, GROUP_M=cfg.group_m, EXACT=False, SHIFT=32, C=c, SPLIT_K=splits,
                                  K_SPLIT=per_split, MMA_ROWS=fmt == 1 and loads_in_mma_rows(tile), **extra)
                divisible = [name for name in sig if name.endswith("_ptr") or "stride" in name]
                yield f"moe_{'up' if extra else 'down'}_{fmt_name}_{shape_class}", (
                    lambda k=kernel, s=sig, c=constexprs, d=divisible, t=tile: compile_sm90(k, s, c, d, t.num_warps,
                                                                                            t.num_stages))


SMALL_M_SIG = {
    "w_ptr": "*i32", "s_ptr": "*u8", "x_ptr": "*bf16", "out_ptr": "*bf16", "ws_ptr": "*fp32", "lock_ptr": "*i32",
    "bias_ptr": "*bf16", "N": "i32", "M": "i32", "stride_xm": "i32", "stride_om": "i32",
    **{name: "constexpr" for name in ("K", "K_SPLIT", "SPLIT_K", "C", "HAS_BIAS", "REDUCE", "WGMMA", "MMA_ROWS", "BLOCK_N",
                                       "BLOCK_M", "BLOCK_K", "EXACT", "SHIFT", "EVEN_N", "EVEN_K")},
}


def small_m_cases():
    """The small-M kernel's default on the bench's two shapes (N = K = 8192; gpt-oss' 5760 x 2880, a ragged
    last K step) with both reductions, and its mma.sync arrangement."""
    import torch

    for name, (n, k), over in (("small_m_8192", (8192, 8192), {}), ("small_m_2880", (5760, 2880), {"reduce": "pass"}),
                               ("small_m_sync", (8192, 8192), {"mma": "sync", "block_n": 128, "num_stages": 2})):
        p = plan(1, n, k, torch.device("cpu"), dict(SMALL_M_DEFAULT, split_k=4, **over))
        constexprs = dict(K=k, K_SPLIT=p["k_split"], SPLIT_K=p["split"], C=p["c"], HAS_BIAS=True,
                          REDUCE=int(p["reduce"] == "in_kernel"), WGMMA=p["mma"] == "wgmma", MMA_ROWS=p["mma_rows"],
                          BLOCK_N=p["block_n"],
                          BLOCK_M=16, BLOCK_K=p["block_k"], EXACT=False, SHIFT=32, EVEN_N=n % p["block_n"] == 0,
                          EVEN_K=p["k_split"] * p["split"] == k)
        divisible = ["w_ptr", "s_ptr", "x_ptr", "out_ptr", "ws_ptr", "stride_xm", "stride_om", "N"]
        yield name, (lambda c=constexprs, p=p, d=divisible: compile_sm90(_mxfp4_small_m_kernel, SMALL_M_SIG, c, d,
                                                                         p["num_warps"], p["num_stages"]))


def small_m_ring_cases():
    """The small-M kernel with its loads as asynchronous copies (Gluon), as ``gluon_small_m.launch_ring`` launches
    it for N = K = 8192: 8-wide MMA (up to 8 tokens) and 16-wide, 2 stages, one warpgroup and two; weights in the
    checkpoint's byte order and in the "lanes" one; with programmatic dependent launch (its default), with
    ``static_weights``, with the scales resident (copied once per program: the default on lanes weights), and with the
    split-K partials 16 bytes per thread (``VEC_SUM``: the default where N % 16 == 0)."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from atom_kernels.ops.mxfp4_mm.gluon_small_m import MAX_REGISTERS, _mxfp4_small_m_ring_kernel

    signature = {name: kind for name, kind in SMALL_M_SIG.items() if kind != "constexpr"}
    for name, block_m, warps, lanes, static, resident, vec in (
            ("m8", 8, 4, False, False, False, False), ("m16", 16, 4, False, False, False, False),
            ("m16_w8", 16, 8, False, False, False, False),
            ("lanes_m8", 8, 4, True, False, False, False), ("lanes_m16", 16, 4, True, False, False, False),
            ("lanes_m8_static", 8, 4, True, True, False, False), ("lanes_m8_resident", 8, 4, True, False, True, False),
            ("lanes_m16_resident", 16, 4, True, False, True, False),
            ("lanes_m16_w8_resident", 16, 8, True, False, True, False),
            ("lanes_m8_static_resident", 8, 4, True, True, True, False),
            ("lanes_m16_resident_vec_sum", 16, 4, True, False, True, True),
            ("lanes_m8_w8_resident_vec_sum", 8, 8, True, False, True, True),
            ("lanes_m8_resident_s3", 8, 4, True, False, True, False),
            ("lanes_m16_resident_vec_sum_xc", 16, 4, True, False, True, True),
            ("lanes_m16_resident_vec_sum_s3", 16, 4, True, False, True, True),
            ("lanes_m16_resident_vec_sum_xc_s3", 16, 4, True, False, True, True),
            ("lanes_m16_resident_vec_sum_xc_s3_steps16", 16, 4, True, False, True, True)):
        steps = 16 if name.endswith("_steps16") else 8
        constexprs = dict(K=8192, K_SPLIT=256 * steps, SPLIT_K=32 // steps, HAS_BIAS=True, BLOCK_N=16 * warps, BLOCK_M=block_m,
                          BLOCK_K=256, STAGES=3 if "_s3" in name else 2, SHIFT=32, EVEN_N=True, LANES=lanes, PDL=True,
                          STATIC_WEIGHTS=static,
                          RESIDENT_SCALES=resident, VEC_SUM=vec, X_CONTIGUOUS="_xc" in name, PARTS=1)
        sig = dict(signature, **{name: "constexpr" for name in constexprs})
        names = list(sig)
        attrs = {(names.index(n),): [["tt.divisibility", 16]] for n in
                 ("w_ptr", "s_ptr", "x_ptr", "out_ptr", "ws_ptr", "lock_ptr", "stride_xm", "stride_om", "N")}

        def build(c=constexprs, s=sig, a=attrs, w=warps):
            from triton.backends.compiler import GPUTarget

            src = GluonASTSource(fn=_mxfp4_small_m_ring_kernel, signature=s, constexprs=c, attrs=a)
            return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": w, "launch_pdl": True,
                                                                                   "maxnreg": MAX_REGISTERS})

        yield f"small_m_ring_{name}", build

    # K parts (the 16-wide tile's default where the call is one wave): 4 warp-specialized warpgroups per program
    parts = dict(K=8192, K_SPLIT=8192, SPLIT_K=1, HAS_BIAS=True, BLOCK_N=64, BLOCK_M=16, BLOCK_K=256, STAGES=2, SHIFT=32,
                 EVEN_N=True, LANES=True, PDL=True, STATIC_WEIGHTS=True, RESIDENT_SCALES=True, VEC_SUM=True,
                 X_CONTIGUOUS=True, PARTS=4)
    parts_sig = dict(signature, **{name: "constexpr" for name in parts})
    parts_names = list(parts_sig)
    parts_attrs = {(parts_names.index(n),): [["tt.divisibility", 16]] for n in
                   ("w_ptr", "s_ptr", "x_ptr", "out_ptr", "ws_ptr", "lock_ptr", "stride_xm", "stride_om", "N")}

    def build_parts():
        from triton.backends.compiler import GPUTarget

        src = GluonASTSource(fn=_mxfp4_small_m_ring_kernel, signature=parts_sig, constexprs=parts, attrs=parts_attrs)
        return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "launch_pdl": True,
                                                                               "maxnreg": MAX_REGISTERS})

    yield "small_m_ring_lanes_m16_parts", build_parts


RMS_NORM_SIG = {"x_ptr": "*bf16", "x_stride": "i32", "res_ptr": "*bf16", "res_stride": "i32", "sum_ptr": "*bf16",
                "sum_stride": "i32", "out_ptr": "*bf16", "out_stride": "i32", "w_ptr": "*bf16", "hidden": "i32",
                "eps": "fp32", "weight_offset": "fp32", "HAS_RESIDUAL": "constexpr", "BLOCK": "constexpr",
                "PDL": "constexpr"}
SILU_SIG = {"x_ptr": "*bf16", "x_stride": "i32", "out_ptr": "*bf16", "out_stride": "i32", "inter": "i32",
            "BLOCK": "constexpr", "PDL": "constexpr"}


def pdl_cases():
    """The decode-path kernels that feed a GEMM, launched with programmatic dependent launch (as on sm_90)."""
    yield "rms_norm_pdl", lambda: compile_sm90(_rms_norm_kernel, RMS_NORM_SIG, {"HAS_RESIDUAL": True, "BLOCK": 8192,
                                                                                "PDL": True}, [], 8, launch_pdl=True)
    yield "silu_and_mul_pdl", lambda: compile_sm90(_silu_and_mul_kernel, SILU_SIG, {"BLOCK": 1024, "PDL": True}, [],
                                                   4, launch_pdl=True)


ALIGN_COUNT_SIG = {"topk_ids_ptr": "*i32", "map_ptr": "*i32", "local_ptr": "*i32", "rank_ptr": "*i32",
                   "counts_ptr": "*i32", "num_pairs": "i32", "num_experts": "i32", "chunk_tiles": "i32",
                   "HAS_MAP": "constexpr", "PAIR_TILE": "constexpr", "EXPERTS_P2": "constexpr", "USE_WHILE": "constexpr",
                   "PDL": "constexpr"}
ALIGN_PREFIX_SIG = {"counts_ptr": "*i32", "totals_ptr": "*i32", "num_chunks": "i32", "CHUNK_STEP": "constexpr",
                    "EXPERT_BLOCK": "constexpr", "EXPERTS_P2": "constexpr", "USE_WHILE": "constexpr", "PDL": "constexpr"}
ALIGN_PLACE_SIG = {"local_ptr": "*i32", "rank_ptr": "*i32", "counts_ptr": "*i32", "totals_ptr": "*i32",
                   "sorted_ptr": "*i32", "block_experts_ptr": "*i32", "num_padded_ptr": "*i32", "num_pairs": "i32",
                   "num_blocks": "i32", "num_tiles": "i32", "chunk_tiles": "i32", "PAIR_TILE": "constexpr",
                   "EXPERTS_P2": "constexpr", "BLOCK_M": "constexpr", "ROWS": "constexpr", "USE_WHILE": "constexpr",
                   "PDL": "constexpr"}
ALIGN_SINGLE_SIG = {"topk_ids_ptr": "*i32", "map_ptr": "*i32", "sorted_ptr": "*i32", "block_experts_ptr": "*i32",
                    "num_padded_ptr": "*i32", "num_pairs": "i32", "num_experts": "i32", "num_blocks": "i32",
                    "HAS_MAP": "constexpr", "PAIR_TILE": "constexpr", "CHUNK_TILES": "constexpr",
                    "EXPERTS_P2": "constexpr", "BLOCK_M": "constexpr", "ROWS": "constexpr", "PDL": "constexpr"}
ALIGN_EXPERTS = (8, 16, 32, 64, 128, 256, 512)


def moe_align_cases():
    """The MoE alignment kernels with the tiles ``moe_align.triton.plan`` picks for 65536 tokens x top-10 (the
    multi-chunk path, whose constexprs are the same at every token count) and 256 pairs (the single launch), per
    expert count, launched with PDL as on sm_90."""
    from atom_kernels.ops.moe_align.triton import (
        _align_count_kernel,
        _align_place_kernel,
        _align_prefix_kernel,
        _align_single_chunk_kernel,
        plan,
    )

    for experts in ALIGN_EXPERTS:
        for block_m in (16, 128):
            p = plan(65536 * 10, experts, block_m)
            tiles = dict(PAIR_TILE=p.pair_tile, EXPERTS_P2=p.experts_p2, USE_WHILE=False, PDL=True)
            if block_m == 16:
                yield f"moe_align_count_e{experts}", (lambda c=dict(tiles, HAS_MAP=True), w=p.num_warps: compile_sm90(
                    _align_count_kernel, ALIGN_COUNT_SIG, c, [], w, launch_pdl=True))
                yield f"moe_align_prefix_e{experts}", (lambda p=p: compile_sm90(
                    _align_prefix_kernel, ALIGN_PREFIX_SIG, dict(CHUNK_STEP=p.chunk_step, EXPERT_BLOCK=p.expert_block,
                                                                 EXPERTS_P2=p.experts_p2, USE_WHILE=False, PDL=True),
                    [], 4, launch_pdl=True))
            yield f"moe_align_place_e{experts}_m{block_m}", (lambda c=dict(tiles, BLOCK_M=block_m, ROWS=p.rows),
                                                             w=p.num_warps: compile_sm90(_align_place_kernel,
                                                                                         ALIGN_PLACE_SIG, c, [], w,
                                                                                         launch_pdl=True))
            s = plan(256, experts, block_m)
            yield f"moe_align_single_e{experts}_m{block_m}", (lambda s=s: compile_sm90(
                _align_single_chunk_kernel, ALIGN_SINGLE_SIG,
                dict(HAS_MAP=True, PAIR_TILE=s.pair_tile, CHUNK_TILES=s.chunk_tiles, EXPERTS_P2=s.experts_p2,
                     BLOCK_M=s.block_m, ROWS=s.rows, PDL=True), [], s.num_warps, launch_pdl=True))


def _signature(fn, ints: set[str], floats: set[str], dtypes: dict[str, str]) -> dict:
    """``fn``'s signature for ASTSource: tensors ``*<dtype>`` (``dtypes``, default fp32), ``ints`` i32, ``floats`` fp32,
    constexprs as such."""
    import inspect

    out = {}
    for name, param in inspect.signature(fn.fn).parameters.items():
        if param.annotation is not inspect.Parameter.empty and "constexpr" in str(param.annotation):
            out[name] = "constexpr"
        elif name in ints:
            out[name] = "i32"
        elif name in floats:
            out[name] = "fp32"
        else:
            out[name] = dtypes.get(name, "*fp32")
    return out


def attention_cases():
    """The split-K attention kernels with runtime sequence and split counts (``_splitk``): paged attention's decode and
    prefill tiles, written directly or split, the combine, and MLA decode (bf16, as the hosts run them)."""
    import torch

    from atom_kernels.ops._splitk import _combine_kernel
    from atom_kernels.ops._triton_common import dot_dtype, dot_precision
    from atom_kernels.ops.mla_decode.triton import _split_kernel as mla_split
    from atom_kernels.ops.paged_attention.triton import SEQ_BLOCK
    from atom_kernels.ops.paged_attention.triton import _split_kernel as paged_split

    dot, prec = dot_dtype(torch.bfloat16), dot_precision(torch.bfloat16)
    bf16 = {n: "*bf16" for n in ("q_ptr", "k_ptr", "v_ptr", "cache_ptr", "sinks_ptr", "out_ptr")}
    ints = {"bt_ptr", "lens_ptr", "qsl_ptr"}
    paged_sig = _signature(paged_split, {"sq_t", "sq_h", "sk_blk", "sk_tok", "sk_h", "sv_blk", "sv_tok", "sv_h", "sbt_b",
                                         "so_t", "so_h", "so_s", "slse_t", "slse_h", "num_seqs", "splits", "window"},
                           {"scale", "soft_cap"}, {**bf16, **{n: "*i32" for n in ints}})
    for tile, (block_m, block_q) in (("decode", (16, 4)), ("prefill", (64, 16))):
        for direct in (True, False):
            constexprs = dict(G=4, GP2=4, BLOCK_Q=block_q, BLOCK_M=block_m, D=128, BD=128, PAGE=16, BLOCK_N=64,
                              SEQ_BLOCK=SEQ_BLOCK, HAS_SINKS=False, SOFT_CAP=False, WINDOW=False, HAS_K_SCALE=False,
                              HAS_V_SCALE=False, DIRECT=direct, DOT=dot, PREC=prec, USE_WHILE=False, STAGES=2)
            sig = {**paged_sig, "o_ptr": "*bf16" if direct else "*fp32"}  # the output, or the fp32 parts
            yield f"paged_attention_{tile}_{'direct' if direct else 'split'}", (
                lambda c=constexprs, s=sig: compile_sm90(paged_split, s, c, ["q_ptr", "k_ptr", "v_ptr"]))
    combine_sig = _signature(_combine_kernel, {"sp_r", "sp_h", "sp_s", "slse_r", "slse_h", "so_r", "so_h", "H", "splits"},
                             set(), {"out_ptr": "*bf16"})
    yield "splitk_combine", lambda: compile_sm90(_combine_kernel, combine_sig,
                                                 dict(W=128, BW=128, MAX_SPLITS_P2=32, USE_WHILE=False), [])
    mla_sig = _signature(mla_split, {"sq_b", "sq_h", "sc_blk", "sc_tok", "sbt_b", "so_b", "so_h", "so_s", "slse_b",
                                     "slse_h", "H", "splits"}, {"scale_log2"},
                         {**bf16, "bt_ptr": "*i32", "lens_ptr": "*i32"})
    yield "mla_decode_split", lambda: compile_sm90(mla_split, mla_sig, dict(
        L=512, R=64, BL=512, BR=64, PAGE=64, HEAD_GROUPS=8, BLOCK_H=16, BLOCK_N=32, DIRECT=False, DOT=dot, PREC=prec,
        USE_WHILE=False, STAGES=2), ["q_ptr", "cache_ptr"])


def cases():
    yield from attention_cases()
    yield from pdl_cases()
    yield from moe_align_cases()
    yield from small_m_cases()
    yield from small_m_ring_cases()
    yield from moe_cases()
    yield "quant_rows", lambda: compile_sm90(_quant_rows_kernel, QUANT_ROWS_SIG, {"K": 8192, "STATIC": False, "BLOCK": 4096},
                                             ["x_ptr", "q_ptr"], 8)
    yield "quant_groups", lambda: compile_sm90(_quant_groups_kernel, QUANT_GROUPS_SIG, {"GROUP": 128, "GROUPS": 16},
                                               ["x_ptr", "q_ptr"])
    for shape_class in ("decode", "large"):
        for blockwise in (False, True):
            cfg = (FP8_BLOCK_CONFIGS if blockwise else FP8_CONFIGS)[shape_class]
            split = 4 if cfg["split_k"] == "auto" else 1
            constexprs = dict(K=8192, K_SPLIT=8192 // split, BLOCKWISE=blockwise, A_SCALE_DIV=128 if cfg["swap"] else 1,
                              B_SCALE_DIV=1 if cfg["swap"] else 128, HAS_BIAS=True, BIAS_ON_P=cfg["swap"], SPLIT_K=split,
                              BLOCK_P=cfg["block_p"], BLOCK_Q=cfg["block_q"], BLOCK_K=128 if blockwise else cfg["block_k"],
                              GROUP=cfg["group"])
            divisible = ["a_ptr", "b_ptr", "c_ptr", "stride_ap", "stride_bq"]
            yield f"fp8_{'block' if blockwise else 'rowwise'}_{shape_class}", (
                lambda c=constexprs, g=cfg, d=divisible: compile_sm90(_fp8_gemm_kernel, FP8_SIG, c, d, g["num_warps"],
                                                                      g["num_stages"]))
        cfg = MX_CONFIGS[shape_class]
        split = 2 if cfg["split_k"] == "auto" else 1
        for lanes in (False, True):
            constexprs = dict(K=8192, K_SPLIT=8192 // split, SPLIT_K=split, HAS_BIAS=False, BLOCK_N=cfg["block_n"],
                              BLOCK_M=cfg["block_m"], BLOCK_K=cfg["block_k"], GROUP=cfg["group"], EXACT=False, SHIFT=32,
                              EVEN_N=True, EVEN_K=True, LANES=lanes)
            yield f"mxfp4_{shape_class}{'_lanes' if lanes else ''}", (
                lambda c=constexprs, g=cfg: compile_sm90(_mxfp4_mm_kernel, MX_SIG, c, ["w_ptr", "s_ptr", "x_ptr", "out_ptr",
                                                                                       "ws_ptr", "stride_xm", "stride_om", "N"],
                                                         g["num_warps"], g["num_stages"]))


if __name__ == "__main__":
    out = {}
    for name, build in cases():
        try:
            out[name] = report(build())
        except Exception as err:  # reported per case, the test names the one that failed
            out[name] = {"error": f"{type(err).__name__}: {err}"[:2000]}
    json.dump(out, sys.stdout)
