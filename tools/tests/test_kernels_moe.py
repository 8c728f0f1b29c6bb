"""The ``moe`` kernel suite (atom_tools.kernels.moe) at toy sizes, timing stubbed."""

def test_moe_suite_runs(device, monkeypatch):
    """The GPU benchmark's code paths at toy sizes (timing replaced by one call): every row is
    produced, the kernel matches the reference, the floor is computed."""
    import atom_tools.kernels.moe as suite

    monkeypatch.setattr(suite, "EXPERTS", 8)
    monkeypatch.setattr(suite, "TOP_K", 2)
    monkeypatch.setattr(suite, "HIDDEN", 64)
    monkeypatch.setattr(suite, "INTER", 32)
    monkeypatch.setattr(suite, "TOKENS", (3,))
    monkeypatch.setattr(suite, "ROTATE", 2)
    monkeypatch.setattr(suite, "median_us", lambda fn, **kw: (fn(), 1.0)[1])
    monkeypatch.setenv("ATOM_KERNEL_BACKEND", "triton")
    rows = suite.run({"device": str(device), "copy_bytes_per_s": 4e12, "bf16_flops_per_s": 7e14, "quick": True})
    impls = [r["impl"] for r in rows]
    assert impls == ["atom-triton", "atom-triton-best", "torch-reference", "cublas-dense-bf16", "atom-routing", "atom-align"]
    assert rows[0]["rel_err"] < 2e-2 and "error" not in rows[0]
    assert rows[0]["floor_kind"] == "bytes" and rows[0]["floor_us"] > 0
