"""The routing bench suite runs end to end (CPU, Triton interpreter, a stand-in timer), so the GPU run it exists
for does not fail on a typo; the timed numbers come from the GPU run."""

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real suite")
def test_routing_bench_rows(monkeypatch):
    from atom_kernels.bench import routing

    monkeypatch.setattr(routing.timing, "measure", lambda fn, **kw: (fn(), {"us": 2.0, "graph": False})[1])
    monkeypatch.setattr(routing, "TOKENS", (3,))
    rows = routing.run({"device": "cpu", "copy_bytes_per_s": 4e12, "quick": False})
    assert [(r["case"], r["impl"]) for r in rows] == [
        (case, impl) for case in routing.CASES for impl in ("atom-triton", "torch-reference", "vllm")]
    for r in rows:
        if r["impl"] == "vllm":  # no vLLM here: a row saying why, never a crash
            assert r["error"].startswith(("ModuleNotFoundError", "ImportError")), r
            continue
        assert r["ids_match"] == 1.0 and r["weight_err"] < 1e-5, r
        assert r["us"] == 2.0 and r["floor_us"] > 0 and r["ratio_to_floor"] > 0


def test_agreement_counts_sets_not_order():
    from atom_kernels.bench.routing import _agreement

    want = (torch.tensor([[0.5, 0.3], [0.6, 0.4]]), torch.tensor([[1, 2], [3, 4]], dtype=torch.int32))
    got = (torch.tensor([[0.3, 0.5], [0.6, 0.4]]), torch.tensor([[2, 1], [3, 5]], dtype=torch.int32))
    assert _agreement(got, want) == {"ids_match": 0.5, "weight_err": 0.0}
