"""The quantization kernels compile for an H200 (sm_90) here, without a GPU: Triton 3.6 compiles
ahead of time for a given target with its own bundled ptxas (``sm90_compile.py``, run in a subprocess
because the tests' interpreter mode replaces the kernels).  The interpreter runs the kernels' Python;
this catches what only the GPU compiler rejects (layouts, FP8 MMA shapes, shared memory) and checks the
fast paths use the instructions they were designed around."""

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton

_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
pytestmark = [
    pytest.mark.skipif(not glob.glob(os.path.join(_BIN, "ptxas")), reason="triton ships no ptxas here"),
    pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel tests compile and run these kernels for real"),
    # one xdist worker runs them all (nox's `--dist loadgroup`), so `compiled` (over a minute) runs once
    pytest.mark.xdist_group("sm90"),
]
SMEM_LIMIT = 227 * 1024  # shared memory per block on H100/H200


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_CACHE_DIR=str(tmp_path_factory.mktemp("triton-cache")))
    script = Path(__file__).with_name("sm90_compile.py")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def _ok(compiled, name):
    case = compiled[name]
    assert "error" not in case, f"{name} does not compile for sm_90: {case.get('error')}"
    assert case["shared"] <= SMEM_LIMIT
    return case


@pytest.mark.parametrize("name", ["paged_attention_decode_direct", "paged_attention_decode_split",
                                  "paged_attention_prefill_direct", "paged_attention_prefill_split", "splitk_combine",
                                  "mla_decode_split"])
def test_split_k_attention_kernels_compile(compiled, name):
    """Runtime sequence and split counts (loops over them, not constexpr unrolls) compile for sm_90."""
    _ok(compiled, name)


def test_quant_fp8_kernels_compile(compiled):
    assert _ok(compiled, "quant_rows")["ptx_div_rn"]  # the reciprocal is IEEE division, as the reference's
    _ok(compiled, "quant_groups")


@pytest.mark.parametrize("name", ["fp8_rowwise_decode", "fp8_block_decode", "fp8_rowwise_large", "fp8_block_large"])
def test_fp8_gemm_compiles_to_fp8_wgmma(compiled, name):
    case = _ok(compiled, name)
    assert any(op.startswith("QGMMA") for op in case["sass"]), sorted(case["sass"])  # FP8 warpgroup MMA
    assert case["spill_bytes"] == 0, case  # block mode's two live fp32 tiles must fit in registers


@pytest.mark.parametrize("name", ["mxfp4_decode", "mxfp4_large"])
def test_mxfp4_mm_compiles_to_bf16_wgmma(compiled, name):
    sass = _ok(compiled, name)["sass"]
    assert any(op.startswith("HGMMA") for op in sass) and "HMUL2.BF16_V2" in sass, sorted(sass)
    if name == "mxfp4_decode":
        # the decoded weights feed the MMA from registers: no per-element shared-memory round trip
        assert sass.get("STS.U16", 0) <= 2


@pytest.mark.parametrize("shape_class", ["decode", "large"])
def test_mxfp4_mm_reads_lanes_in_natural_order(compiled, shape_class):
    """On "lanes" weights the warpgroup-MMA kernel decodes each byte into the pair its MMA lane holds, so the tile is in
    natural K order: the activations go to the MMA as loaded (no ldmatrix/stmatrix permutation, no 2-byte stores in
    the loop) and the loop is shorter than on the checkpoint's order (H200: 17 tokens 49 -> 31 us)."""
    rows, lanes = _ok(compiled, f"mxfp4_{shape_class}"), _ok(compiled, f"mxfp4_{shape_class}_lanes")
    loop = lanes["loop_sass"]
    assert any(op.startswith("HGMMA") for op in loop) and loop.get("HMUL2.BF16_V2", 0) >= 16, sorted(loop)
    moved = {op: n for op, n in loop.items() if op.startswith(("STSM", "LDSM"))}
    assert not moved and loop.get("STS.U16", 0) <= 1, moved  # (one 2-byte store: the scale row, as on rows)
    assert lanes["spill_bytes"] == 0
    assert sum(loop.values()) < 0.95 * sum(rows["loop_sass"].values()), (sum(loop.values()), rows["loop_sass"])


@pytest.mark.parametrize("name", [f"moe_{g}_{f}_{c}" for g in ("up", "down") for f in ("fp8", "mxfp4")
                                  for c in ("decode", "large")])
def test_quantized_moe_kernels_compile_to_wgmma(compiled, name):
    """The expert GEMMs on the warpgroup MMA, the weight stream pipelined through cp.async; MXFP4 words and scales
    loaded in the MMA operand's row order where one warpgroup holds whole 64-row tiles (the decode tiles), so nothing
    is stored to shared memory inside the K loop (from a plain [rows, K] load Triton moved every word through shared
    memory behind extra barriers)."""
    case = _ok(compiled, name)
    sass = case["sass"]
    mma = "QGMMA" if "_fp8_" in name else "HGMMA"
    assert any(op.startswith(mma) for op in sass), sorted(sass)
    assert any(op.startswith("LDGSTS") for op in sass)
    assert case["spill_bytes"] == 0, case
    if "_mxfp4_decode" in name:
        assert not any(op.startswith("STS") for op in case["loop_sass"]), case["loop_sass"]


@pytest.mark.parametrize("name", ["small_m_8192", "small_m_2880", "small_m_sync"])
def test_mxfp4_small_m_kernel_compiles(compiled, name):
    """The decode-size MXFP4 kernel: no spills, the PTX decode (prmt + bf16x2 multiply) feeding the intended
    MMA (the warpgroup MMA of the default "wgmma" arrangement, or mma.sync for "sync"), decoded values never stored to shared
    memory (in "sync" a few scale bytes are), and one load per thread's run of words.  In "wgmma" the raw words and scale bytes
    are loaded in the operand's layout: no shared-memory staging of them at all (it cost 25% on the H200)."""
    case = _ok(compiled, name)
    sass = case["sass"]
    assert case["spill_bytes"] == 0, case
    mma = "HMMA" if name.endswith("sync") else "HGMMA"
    assert any(op.startswith(mma) for op in sass), sorted(sass)
    assert sass.get("PRMT", 0) >= 4 and sass.get("HMUL2.BF16_V2", 0) >= 4, sorted(sass)
    assert sass.get("STS.U16", 0) <= 8 and sass.get("STS", 0) <= 8, sorted(sass)
    # one load per thread's run of C words: 16 bytes, or 8 where K / 32 is not a multiple of 4 (2880: C = 2)
    run_load = {"small_m_8192": "LDG.E.128", "small_m_2880": "LDG.E.64", "small_m_sync": "LDGSTS.E.BYPASS.128"}[name]
    assert sass.get(run_load, 0) > 0, sorted(sass)
    if not name.endswith("sync"):
        staged = {op: n for op, n in case["loop_sass"].items()
                  if op in ("STS.128", "LDS.128", "STS.64", "LDS.64", "STS.U8", "LDS.U8", "LDS.U16")}
        assert not staged, staged


def _per_step(case) -> dict:
    """The K loop's SASS per K step (counts divided by the steps in the loop body: the ring kernel's holds one step per
    ring slot, one warpgroup MMA group each, ``WARPGROUP.ARRIVE``; the loop's own control counts a fraction)."""
    loop = case["loop_sass"]
    steps = loop.get("WARPGROUP.ARRIVE", 0)
    assert steps >= 1, sorted(loop.items())
    return {op: n / steps for op, n in loop.items()}


@pytest.mark.parametrize("name", ["small_m_ring_m8", "small_m_ring_m16", "small_m_ring_m16_w8"])
def test_mxfp4_small_m_ring_kernel_compiles(compiled, name):
    """The asynchronous-copy variant (Gluon) on weights in the checkpoint's byte order: within its register cap (the
    loop body of 2 steps spills up to 88 bytes here; the serving layout, "lanes", below, does not spill), the weight runs
    copied 16 bytes at a time (cp.async, L1 bypassed) and read back 16 bytes at a time, the scales and activations
    copied asynchronously too (no plain global load in the K loop), the same PTX decode, the decoded tile handed to the
    warpgroup MMA without a shared-memory round trip (no shared-memory store in the loop), and one barrier per K step
    (the ring's: the slots are separate buffers)."""
    case = _ok(compiled, name)
    loop = _per_step(case)
    assert case["registers"] <= 128 and case["spill_bytes"] <= 88, case
    assert loop.get("BAR.SYNC.DEFER_BLOCKING") == 1, sorted(loop.items())
    assert loop.get("LDGSTS.E.BYPASS.128", 0) >= 4 and loop.get("LDS.128", 0) >= 4, sorted(loop)
    assert loop.get("LDGSTS.E", 0) >= 8, sorted(loop)  # 4-byte runs: activations and scale groups
    assert loop.get("PRMT", 0) >= 64 and loop.get("HMUL2.BF16_V2", 0) >= 64, sorted(loop)
    assert any(op.startswith("HGMMA") for op in loop), sorted(loop)
    stores = {op: n for op, n in loop.items() if op.startswith(("STS", "STSM"))}
    assert not stores, stores
    plain_loads = {op: n for op, n in loop.items() if op.startswith("LDG.E") and "STRONG" not in op}
    assert not plain_loads, plain_loads  # (the split-K reduction's .cg partial loads read as STRONG.GPU)


def test_mxfp4_small_m_ring_kernel_k_parts(compiled):
    """K parts: the program is 16 warps, 4 warp-specialized warpgroups, each running its own ring on a quarter of the K
    range with barriers of its own 128 threads (``bar.sync id, 128``: the warpgroups never wait for each other inside
    the loop), within the register cap and shared memory; the only local-memory traffic is the workers' hand-off of
    their arguments (56 bytes), outside the K loops."""
    case = _ok(compiled, "small_m_ring_lanes_m16_parts")
    assert case["warps"] == 16 and case["registers"] <= 128 and case["spill_bytes"] <= 64, case
    assert any(op.startswith("USETMAXREG") for op in case["sass"]), sorted(case["sass"])  # warp specialization
    assert len(case["warpgroup_barriers"]) >= 3 and min(case["warpgroup_barriers"].values()) >= 2, case
    assert sum(n for op, n in case["sass"].items() if op.startswith("HGMMA")) >= 4 * 16, case["sass"]  # each part's MMAs


def _lanes_decode_ops(loop: dict) -> tuple[int, int]:
    """(words decoded, integer instructions) per step of a loop decoding "lanes" words: 4 bf16x2 multiplies per word;
    masks, shifts and byte moves (the decode's 9 per word, plus the scale bytes' unpacking)."""
    integer = sum(n for op, n in loop.items() if op.startswith(("LOP3", "SHF", "IMAD.SHL", "PRMT")))
    return loop.get("HMUL2.BF16_V2", 0) // 4, integer


@pytest.mark.parametrize("name", ["small_m_ring_lanes_m8", "small_m_ring_lanes_m16"])
def test_mxfp4_small_m_ring_kernel_reads_lanes_layout(compiled, name):
    """With weights in the "lanes" byte order the activations are copied in natural K order, 16 bytes at a time
    (2 per thread and step at 8 tokens, 4 at 16, plus the 4 weight runs), leaving one 4-byte copy (the scales);
    each thread reads the 4 scale groups of its row blocks (LDS.32) and builds the multipliers in registers; the
    words decode in 9 integer instructions each (``formats.LANES_PAIR_TERMS``): still no shared-memory store, no
    shuffle and no spill in the loop."""
    case = _ok(compiled, name)
    loop = _per_step(case)
    assert case["spill_bytes"] == 0 and case["registers"] <= 128, case
    runs = 4 + (2 if name.endswith("m8") else 4)
    assert loop.get("LDGSTS.E.BYPASS.128", 0) == runs and loop.get("LDGSTS.E", 0) == 1, sorted(loop.items())
    words, integer = _lanes_decode_ops(loop)
    assert words >= 16 and integer <= 9 * words + 24, sorted(loop.items())  # the byte order's decode: 13 per word
    assert any(op.startswith("HGMMA") for op in loop), sorted(loop)
    moved = {op: n for op, n in loop.items() if op.startswith(("STS", "STSM", "SHFL"))}
    assert not moved, moved


@pytest.mark.parametrize("name", ["small_m_ring_lanes_m8_resident", "small_m_ring_lanes_m16_resident",
                                  "small_m_ring_lanes_m16_w8_resident", "small_m_ring_lanes_m8_resident_s3"])
def test_mxfp4_small_m_ring_kernel_resident_scales(compiled, name):
    """With the scales resident (each program copies its whole scale slice once, a row's 8 bytes per step in one
    8-byte copy, 8 steps), the K loop copies only weight runs and activations (16-byte copies), reads each step's scales
    as 8-byte rows (LDS.64) straight into the decode's registers (no layout conversion: no shared-memory store or
    shuffle), decodes each word in 9 integer instructions and unpacks the scales two per ``prmt`` (8 per step for 16
    words; ``SCALE_PAIR_ASM``), the multiplies taking their half of a pair in the operand (``HMUL2 ... .H0_H0``), one
    barrier per step, without spills; with 2 ring slots and with 3."""
    case = _ok(compiled, name)
    loop, sass = _per_step(case), case["sass"]
    assert case["spill_bytes"] == 0 and case["registers"] <= 128, case
    runs = 4 + (2 if "_m8" in name or "_w8" in name else 4)  # weight runs + activations (shared by 2 warpgroups)
    assert loop.get("LDGSTS.E.BYPASS.128", 0) == runs and not loop.get("LDGSTS.E", 0), sorted(loop.items())
    assert not loop.get("LDGSTS.E.64", 0) and sass.get("LDGSTS.E.64", 0) == 8, sorted(sass.items())
    assert loop.get("LDS.64", 0) >= 2 and loop.get("BAR.SYNC.DEFER_BLOCKING") == 1, sorted(loop.items())
    words, integer = _lanes_decode_ops(loop)
    assert words >= 16 and integer <= 9 * words + words // 2, sorted(loop.items())  # + 1 prmt per 2 scales
    assert case["half_operands"] == loop["HMUL2.BF16_V2"] * case["loop_sass"]["WARPGROUP.ARRIVE"], case["half_operands"]
    moved = {op: n for op, n in loop.items() if op.startswith(("STS", "STSM", "SHFL"))}
    assert not moved, moved


@pytest.mark.parametrize("name", ["small_m_ring_lanes_m16_resident_vec_sum", "small_m_ring_lanes_m8_w8_resident_vec_sum"])
def test_mxfp4_small_m_ring_kernel_vec_sum(compiled, name):
    """With ``VEC_SUM`` the split-K partials are stored and read back 16 bytes per thread (all 4 splits' loads of the
    sum in one straight run) and the bf16 output 8 bytes per thread; no 4-byte partial access is left, no spill."""
    case = _ok(compiled, name)
    sass = case["sass"]
    assert case["spill_bytes"] == 0 and case["registers"] <= 128, case
    stores = sass.get("STG.E.128", 0)
    assert stores >= 1 and not sass.get("STG.E", 0) and sass.get("STG.E.64", 0) == stores, sorted(sass.items())
    assert sass.get("LDG.E.128.STRONG.GPU", 0) == 4 * stores and not sass.get("LDG.E.STRONG.GPU", 0), sorted(sass.items())


@pytest.mark.parametrize("stages", ["", "_s3"])
def test_mxfp4_small_m_ring_kernel_contiguous_activations(compiled, stages):
    """Activation rows K apart (``X_CONTIGUOUS``, the usual case) give each thread's 4 rows one address plus constant
    offsets: at least 12 fewer loop instructions per K step at 16 tokens (4 runs x 64-bit address arithmetic), the same
    copies, no spill; and a 3-slot ring of the 16-wide tile (8-16 K steps, ``triton_small_m.ring_stages``; the resident
    scales grow with the steps) leaves room for 4 programs per SM (228 KB of shared memory, 1 KB of it reserved per
    program)."""
    strided = _ok(compiled, f"small_m_ring_lanes_m16_resident_vec_sum{stages}")
    contiguous = _ok(compiled, f"small_m_ring_lanes_m16_resident_vec_sum_xc{stages}")
    longest = [_ok(compiled, "small_m_ring_lanes_m16_resident_vec_sum_xc_s3_steps16")] if stages else []
    for case in (strided, contiguous, *longest):
        assert case["spill_bytes"] == 0 and case["registers"] <= 128, case
        assert 4 * (case["shared"] + 1024) <= 228 * 1024, case["shared"]
    fewer, before = _per_step(contiguous), _per_step(strided)
    assert sum(fewer.values()) <= sum(before.values()) - 12, (sum(fewer.values()), sum(before.values()))
    assert fewer["LDGSTS.E.BYPASS.128"] == before["LDGSTS.E.BYPASS.128"] == 8, sorted(fewer.items())


@pytest.mark.parametrize("name", ["rms_norm_pdl", "silu_and_mul_pdl", "small_m_ring_lanes_m8", "small_m_ring_lanes_m16",
                                  "small_m_ring_lanes_m8_static", "small_m_ring_lanes_m8_resident",
                                  "small_m_ring_lanes_m8_static_resident"])
def test_programmatic_dependent_launch(compiled, name):
    """Kernels launched with programmatic dependent launch let the next kernel launch (PREEXIT, from
    ``griddepcontrol.launch_dependents``) and wait for the previous one (ACQBULK, ``griddepcontrol.wait``) before any
    load of what it may have written; the MXFP4 ring kernel with ``static_weights`` copies exactly its first step's
    weight runs (four 16-byte copies) and scale bytes (one 4-byte copy, or with resident scales the whole slice: eight
    8-byte copies) before the wait, and nothing else."""
    case = _ok(compiled, name)
    sass, before = case["sass"], case["before_wait"]
    assert sass.get("ACQBULK") == 1 and sass.get("PREEXIT") == 1, sorted(sass)
    assert "PREEXIT" in before, before  # the next kernel may launch while this one waits
    loads = {op: n for op, n in before.items() if op.startswith(("LDG", "LDS", "ATOM", "RED"))}
    if name.endswith("_static"):
        assert loads == {"LDGSTS.E.BYPASS.128": 4, "LDGSTS.E": 1}, loads
    elif name.endswith("_static_resident"):
        assert loads == {"LDGSTS.E.BYPASS.128": 4, "LDGSTS.E.64": 8}, loads
    else:
        assert not loads, loads


ALIGN_EXPERTS = (8, 16, 32, 64, 128, 256, 512)


@pytest.mark.parametrize("experts", ALIGN_EXPERTS)
def test_moe_align_kernels_fit_at_host_sizes(compiled, experts):
    """The MoE alignment kernels at the tiles they take for 65536 tokens x top-10 (and the single launch at 256 pairs)
    compile within an H200 program's shared memory and without spills, within the bound ``plan`` states (the old
    count kernel's tile grew with the tokens: 16384 x top-8 x 128 experts asked for 262144 bytes)."""
    from atom_kernels.ops.moe_align.triton import plan

    names = [f"moe_align_count_e{experts}", f"moe_align_prefix_e{experts}"]
    names += [f"moe_align_{kernel}_e{experts}_m{m}" for kernel in ("place", "single") for m in (16, 128)]
    for name in names:
        case = _ok(compiled, name)
        assert case["spill_bytes"] == 0, (name, case["registers"], case["spill_bytes"])
        assert case["shared"] <= plan(65536 * 10, experts, 16).shared_memory_bound, (name, case["shared"])
        assert case["sass"].get("ACQBULK") == 1, name  # PDL: waits for the previous kernel
