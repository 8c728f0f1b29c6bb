"""The routing bench suite runs end to end (CPU, Triton interpreter, a stand-in timer), so the GPU run it exists
for does not fail on a typo; the timed numbers come from the GPU run."""

import sys
import types

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real suite")
def test_routing_bench_rows(monkeypatch):
    from atom_tools.kernels import routing

    monkeypatch.setattr(routing.timing, "measure", lambda fn, **kw: (fn(), {"us": 2.0, "graph": False})[1])
    monkeypatch.setattr(routing, "TOKENS", (3,))

    def missing(case, bias):
        raise ImportError("no such kernel here")

    # peers from a --peers module: the reference under another name (a working peer) and one that cannot be imported
    module = types.SimpleNamespace(PEERS={"routing": {"again": routing.backend("reference"), "gone": missing}})
    monkeypatch.setitem(sys.modules, "fake_routing_peers", module)
    rows = routing.run({"device": "cpu", "copy_bytes_per_s": 4e12, "quick": False, "peers": ["fake_routing_peers"]})
    assert [(r["case"], r["impl"]) for r in rows] == [
        (case, impl) for case in routing.CASES for impl in ("atom-triton", "torch-reference", "again", "gone")]
    for r in rows:
        if r["impl"] == "gone":  # a peer that cannot be imported: a row saying why, never a crash
            assert r["error"] == "ImportError: no such kernel here", r
            continue
        assert r["ids_match"] == 1.0 and r["weight_err"] < 1e-5, r
        assert r["us"] == 2.0 and r["floor_us"] > 0 and r["ratio_to_floor"] > 0


def test_agreement_counts_sets_not_order():
    from atom_tools.kernels.routing import _agreement

    want = (torch.tensor([[0.5, 0.3], [0.6, 0.4]]), torch.tensor([[1, 2], [3, 4]], dtype=torch.int32))
    got = (torch.tensor([[0.3, 0.5], [0.6, 0.4]]), torch.tensor([[2, 1], [3, 5]], dtype=torch.int32))
    assert _agreement(got, want) == {"ids_match": 0.5, "weight_err": 0.0}


def test_cli_refuses_unknown_suite_and_peer_module_before_any_gpu_work(capsys):
    from atom_tools.kernels.__main__ import main

    with pytest.raises(SystemExit):
        main(["attentoin", "--out", "x.json"])
    assert "unknown suite(s): attentoin" in capsys.readouterr().err
    with pytest.raises(ModuleNotFoundError, match="no_such_peers"):
        main(["attention", "--peers", "no_such_peers", "--out", "x.json"])
