"""The attention bench suite runs end to end (CPU, Triton interpreter, tiny shapes, a stand-in timer), so the GPU
run it exists for does not fail on a typo; the timed numbers come from the GPU run."""

import sys
import types

import pytest


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the GPU runs the real suite")
def test_attention_bench_rows(monkeypatch):
    from atom_tools.kernels import attention

    monkeypatch.setattr(attention, "measure", lambda fn, **kw: (fn(), {"us": 10.0, "graph": False})[1])
    monkeypatch.setattr(attention, "HEADS", 8)
    monkeypatch.setattr(attention, "KV_HEADS", 2)
    monkeypatch.setattr(attention, "DIM", 32)
    monkeypatch.setattr(attention, "BATCHES", (1, 3))
    monkeypatch.setattr(attention, "CONTEXTS", (40,))
    monkeypatch.setattr(attention, "PREFILL", ((2, 8, 0), (2, 8, 20), (1, 24, 0)))
    monkeypatch.setattr(attention, "L2_DEFEAT_BYTES", 1 << 16)

    def gone(case):
        return "unavailable: no such kernel here"

    def broken(case):
        raise RuntimeError("set-up failed")

    # peers from a --peers module: SDPA again under another name (a working peer), one unavailable, one broken
    module = types.SimpleNamespace(PEERS={"attention": {"again": attention.sdpa_peer, "gone": gone, "broken": broken}})
    monkeypatch.setitem(sys.modules, "fake_attention_peers", module)
    ctx = {"device": "cpu", "copy_bytes_per_s": 4e12, "bf16_flops_per_s": 7e14, "quick": False}
    rows = attention.run({**ctx, "peers": ["fake_attention_peers"]})
    assert [r["case"] for r in rows] == ["decode-b1-new1-ctx40", "decode-b3-new1-ctx40", "prefill-b2-new8-ctx8",
                                         "prefill-b2-new8-ctx28", "prefill-b1-new24-ctx24"]
    for r in rows:
        assert r["atom_us"] == 10.0 and r["sdpa_us"] == 10.0 and r["atom_over_sdpa"] == 1.0, r
        assert r["atom_err"] < 5e-2 and r["sdpa_err"] < 5e-2 and r["again_err"] == r["sdpa_err"], r
        assert r["floor_us"] > 0 and r["atom_GBps"] > 0 and r["atom_splits"] >= 1
        assert r["atom_over_again"] == 1.0 and r["gone_us"] == "unavailable: no such kernel here"
        assert r["broken_us"] == "error: RuntimeError: set-up failed" and "atom_over_broken" not in r
    assert rows[0]["copies"] > 1  # small caches are cycled over copies
    prefill = [r for r in rows if r["case"].startswith("prefill")]
    assert "sweep_us" not in rows[0] and all(r["sweep_best"] in r["sweep_us"] for r in prefill)
    assert all(len(r["sweep_us"]) == len(attention.PREFILL_SWEEP) and r["sweep_err"] < 5e-2 for r in prefill)
    assert all(us == 10.0 for r in prefill for us in r["sweep_us"].values())  # every configuration ran
    plain = attention.run(ctx)  # no --peers: ATOM and SDPA only
    assert not [key for key in plain[0] if key.startswith(("again", "gone", "broken"))]
