"""The ``mrope`` kernel suite (atom_tools.kernels.mrope) at toy sizes, timing stubbed, and its sweep naming only
the kernels and shape classes atom-kernels has."""

import itertools

import pytest
import torch

from atom_kernels.ops.mrope import triton as mrope_triton


def test_quick_sweep_names_known_kernels_and_shape_classes():
    import atom_tools.kernels.mrope as suite

    for config in itertools.chain(*suite.QUICK_SWEEP.values()):
        assert config.kernel in mrope_triton.KERNELS, config
    assert set(suite.QUICK_SWEEP) <= set(mrope_triton.CONFIGS)


def test_bench_suite_plumbing(device, monkeypatch):
    """The GPU bench's plumbing (inputs, sweep, transformers peers, rows) on tiny sizes, timing stubbed,
    so a GPU run is not spent finding a typo."""
    pytest.importorskip("transformers")
    import atom_tools.kernels.mrope as suite

    monkeypatch.setattr(suite.timing, "measure", lambda fn, **kw: [fn(), {"us": 1.0, "graph": True}][1])
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    monkeypatch.setattr(suite, "SWEEP_BLOCK_H", (4,))
    monkeypatch.setattr(suite, "SWEEP_WARPS", (4,))
    monkeypatch.setattr(suite, "L2_DEFEAT_BYTES", 1)  # one input copy
    ctx = {"copy_bytes_per_s": 4e12}
    for case, fused in ((suite.CASES[1], False), (suite.CASES[2], True)):
        rows = suite.bench_case(case, 8, fused, ctx, device=device.type)
        assert not [r for r in rows if "error" in r], rows
        impls = [r["impl"] for r in rows]
        assert {"atom-triton", "hf-eager", "hf-compile", "atom-triton-best", "floor"} <= set(impls)
        best = next(r for r in rows if r["impl"] == "atom-triton-best")
        assert best["floor_us"] == pytest.approx(best["bytes"] / 4e12 * 1e6)


def test_bench_quick_run_narrowed_by_environment(device, monkeypatch):
    """``--quick`` with the case and peer filters the decisive GPU run uses: only the chosen case, the shipped
    config and the quick set of its shape class (both kernels), eager transformers only."""
    pytest.importorskip("transformers")
    import atom_tools.kernels.mrope as suite

    monkeypatch.setattr(suite.timing, "measure", lambda fn, **kw: [fn(), {"us": 1.0, "graph": True}][1])
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: pytest.fail("the compile peer was filtered out"))
    monkeypatch.setattr(suite, "TOKENS", (4,))
    monkeypatch.setattr(suite, "L2_DEFEAT_BYTES", 1)
    monkeypatch.setenv(suite.CASES_ENV, "qwen3.5+qknorm")
    monkeypatch.setenv(suite.PEERS_ENV, "eager")
    rows = suite.run({"copy_bytes_per_s": 4e12, "quick": True, "device": device.type})
    assert not [r for r in rows if "error" in r], rows
    assert {r["case"] for r in rows} == {"qwen3.5+qknorm"}
    swept = [r["config"] for r in rows if r["impl"] == "atom-triton"]
    shape = mrope_triton.shape_class(256, 64, True)
    assert swept == [vars(c) for c in dict.fromkeys([mrope_triton.CONFIGS[shape], *suite.QUICK_SWEEP[shape]])]
    assert {r["impl"] for r in rows} == {"atom-triton", "hf-eager", "atom-triton-best", "floor"}
    best = next(r for r in rows if r["impl"] == "atom-triton-best")
    assert set(best["best_us_by_kernel"]) == {"chunks", "pairs"}
