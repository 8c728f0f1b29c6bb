"""The quant bench suite runs end to end (CPU, Triton interpreter, tiny shapes, a stand-in timer), so the
one GPU run it exists for does not fail on a typo; the timed numbers come from the GPU run."""

import pytest


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the GPU runs the real suite")
def test_quant_bench_rows(monkeypatch):
    from atom_kernels.ops import fp8_gemm
    from atom_kernels.ops.mxfp4_mm import triton as mxfp4_triton
    from atom_tools.kernels import quant

    monkeypatch.setattr(quant, "measure", lambda fn, **kw: (fn(), {"us": 10.0, "graph": False})[1])
    monkeypatch.setattr(quant, "SHAPES", {"8192x8192": (64, 128)})
    monkeypatch.setattr(quant, "TOKENS", (1, 20))
    monkeypatch.setattr(quant, "L2_BYTES", 1 << 14)
    monkeypatch.setattr(quant, "QUANT_CASES", ((3, 256, None), (3, 256, 128)))
    monkeypatch.setattr(fp8_gemm, "SWEEP", fp8_gemm.SWEEP[:2])
    monkeypatch.setattr(mxfp4_triton, "SWEEP", mxfp4_triton.SWEEP[:2])
    monkeypatch.setattr(quant, "MOE_SHAPE", (4, 2, 256, 128))
    from atom_kernels.ops.fused_moe import triton_quant

    monkeypatch.setattr(triton_quant, "QUANT_SWEEP", triton_quant.QUANT_SWEEP[:1])
    ctx = {"device": "cpu", "copy_bytes_per_s": 4e12, "bf16_flops_per_s": 7e14, "quick": False}
    rows = quant.run(ctx)
    errors = [r for r in rows if "error" in r and r["impl"] != "cublaslt-scaled_mm"]  # no cuBLASLt on a CPU
    assert not errors, errors
    ops = {(r["op"], r["impl"]) for r in rows if "op" in r and "us" in r}
    assert {("gemm", "bf16-cublas"), ("fp8-rowwise", "atom-triton"), ("fp8-block", "atom-triton"),
            ("mxfp4", "atom-triton"), ("mxfp4", "atom-triton sweep"), ("quant_fp8", "atom-triton"),
            ("fused_moe", "atom-triton bf16"), ("fused_moe", "atom-triton fp8-block"), ("fused_moe", "atom-triton mxfp4")} <= ops
    target = [r for r in rows if r.get("summary") == "mxfp4-vs-bf16"]
    assert [r["M"] for r in target] == [1] and target[0]["speedup_default"] == 1.0
    assert all(r["floor_us"] > 0 for r in rows if "floor_us" in r)


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the GPU runs the real suite")
def test_mxfp4_bench_rows(monkeypatch):
    """The decode-size MXFP4 suite (the run that picks the small-M kernel's default): every configuration
    times and checks its error, the summary compares the default and the best with bf16."""
    from atom_kernels.ops.mxfp4_mm import planner
    from atom_kernels.ops.mxfp4_mm import triton as mma_triton
    from atom_tools.kernels import mxfp4

    monkeypatch.setattr(mxfp4, "measure", lambda fn, **kw: (fn(), {"us": 10.0, "graph": False})[1])
    monkeypatch.setattr(mxfp4, "SHAPES", {"tiny": (96, 320)})
    monkeypatch.setattr(mxfp4, "L2_BYTES", 1 << 14)
    monkeypatch.setattr(mxfp4, "MOE_CASES", {"tiny": (4, 2, 64, 64)})
    monkeypatch.setattr(planner, "SWEEP", [{}, {"mma": "wgmma", "block_n": 64}, {"reduce": "pass", "split_k": 2, "block_k": 128}])
    monkeypatch.setattr(mma_triton, "SWEEP", mma_triton.SWEEP[:1])
    rows = mxfp4.run({"device": "cpu", "copy_bytes_per_s": 4e12, "quick": True})
    assert not [r for r in rows if "error" in r]
    timed = [r for r in rows if r.get("op") == "mxfp4" and "pair_us" not in r]
    assert {r["impl"] for r in timed} == {"atom-triton", "small-m sweep", "mma sweep"} and len(timed) == 2 * 4
    assert all(r["rel_err"] < 1e-2 for r in timed)  # bf16 output of the same product
    after = [r for r in rows if "pair_us" in r]  # the default and cuBLAS after ATOM's RMSNorm and a plain kernel
    assert sorted(r["impl"] for r in after) == sorted(2 * [f"{impl} after {p}" for impl in ("atom-triton", "bf16-cublas")
                                                           for p in ("plain copy", "rms_norm")])
    assert all(r["us"] == r["pair_us"] - r["predecessor_us"] for r in after)
    assert {r["case"] for r in rows if r.get("op") == "fused_moe"} == {"tiny"}
    target = [r for r in rows if r.get("summary") == "mxfp4-vs-bf16"]
    assert [r["M"] for r in target] == [1, 16] and target[0]["speedup_default"] == 1.0
    assert target[0]["atom_triton_after_rms_norm_us"] == 0.0 and "bf16_cublas_after_plain_copy_us" in target[0]


def test_mxfp4_sweep_rows_take_the_layout_their_kernel_reads(monkeypatch):
    """A sweep configuration the ring kernel serves is timed in the layers' byte order (as the default is), one the
    register-load kernel serves in the checkpoint's (the only one it reads)."""
    import torch

    from atom_kernels.ops.mxfp4_mm import planner
    from atom_tools.kernels import mxfp4

    monkeypatch.setattr(planner, "ring_serves", lambda x, n, cfg: dict(planner.DEFAULT, **cfg)["loads"] == "ring")
    x = torch.zeros(1, 256)
    assert mxfp4.sweep_layout({"stages": 3}, x, 64, "lanes") == "lanes"
    assert mxfp4.sweep_layout({"loads": "registers"}, x, 64, "lanes") == "rows"
    assert mxfp4.sweep_layout({"stages": 3}, x, 64, "rows") == "rows"


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the GPU runs the real suite")
def test_gpt_oss_moe_bench_rows(monkeypatch):
    """gpt-oss' MoE suite end to end at tiny shapes: bf16 and MXFP4 experts (biases, clamped SwiGLU), the sweep at
    decode sizes only, and the MXFP4-vs-bf16 summary with the 1.5x target at T <= 64."""
    from atom_kernels.ops.fused_moe import triton_quant
    from atom_tools.kernels import moe_gpt_oss

    monkeypatch.setattr(moe_gpt_oss, "measure", lambda fn, **kw: (fn(), {"us": 10.0, "graph": False})[1])
    monkeypatch.setattr(moe_gpt_oss, "CASES", {"tiny": (4, 2, 96, 64)})
    monkeypatch.setattr(moe_gpt_oss, "TOKENS", (1, 80))
    monkeypatch.setattr(triton_quant, "QUANT_SWEEP", triton_quant.QUANT_SWEEP[:1])
    rows = moe_gpt_oss.run({"device": "cpu", "copy_bytes_per_s": 4e12, "bf16_flops_per_s": 7e14})
    assert not [r for r in rows if "error" in r]
    timed = [(r["impl"], r["tokens"]) for r in rows if r.get("op") == "fused_moe"]
    assert sorted(timed) == sorted([("atom-triton bf16", 1), ("atom-triton mxfp4", 1), ("atom-triton mxfp4 sweep", 1),
                                    ("atom-triton bf16", 80), ("atom-triton mxfp4", 80)])
    assert all(r["rel_err"] < 5e-2 for r in rows if r.get("op") == "fused_moe")
    summary = {r["tokens"]: r for r in rows if r.get("summary") == "mxfp4-vs-bf16"}
    assert summary[1]["target"] == 1.5 and summary[1]["speedup_default"] == 1.0 and summary[80]["target"] is None
