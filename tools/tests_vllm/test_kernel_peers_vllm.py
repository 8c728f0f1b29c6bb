"""``atom_tools.kernel_peers_vllm``: vLLM's kernels offered to ``python -m atom_tools.kernels --peers``.  On a CPU machine
vLLM's CUDA kernels cannot run, so the suites must give each peer a row or cell saying why, never crash; the
timed numbers come from the GPU run."""

import pytest
import torch

from atom_tools import kernel_peers_vllm as kernel_peers
from atom_tools.kernels import attention, peers, routing
from atom_tools.kernels.__main__ import available_suites


def test_peers_name_real_suites():
    assert set(kernel_peers.PEERS) <= set(available_suites())
    assert peers.for_suite({"peers": ["atom_tools.kernel_peers_vllm"]}, "mla") == kernel_peers.PEERS["mla"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real suite")
def test_routing_suite_gives_vllm_a_row(monkeypatch):
    monkeypatch.setattr(routing.timing, "measure", lambda fn, **kw: (fn(), {"us": 2.0, "graph": False})[1])
    monkeypatch.setattr(routing, "TOKENS", (3,))
    rows = routing.run({"device": "cpu", "copy_bytes_per_s": 4e12, "peers": ["atom_tools.kernel_peers_vllm"]})
    vllm_rows = [r for r in rows if r["impl"] == "vllm"]
    assert [r["case"] for r in vllm_rows] == list(routing.CASES)
    for r in vllm_rows:  # vLLM's routing ops are CUDA kernels: a row with the reason, or agreeing numbers
        assert "error" in r or (r["ids_match"] == 1.0 and r["weight_err"] < 1e-5), r


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU runs the real suite")
def test_attention_suite_gives_vllm_cells(monkeypatch):
    monkeypatch.setattr(attention, "measure", lambda fn, **kw: (fn(), {"us": 10.0, "graph": False})[1])
    monkeypatch.setattr(attention, "HEADS", 8)
    monkeypatch.setattr(attention, "KV_HEADS", 2)
    monkeypatch.setattr(attention, "DIM", 32)
    monkeypatch.setattr(attention, "CONTEXTS", (40,))
    monkeypatch.setattr(attention, "QUICK_DECODE", ((1, 40),))
    monkeypatch.setattr(attention, "PREFILL", ((2, 8, 0), (2, 8, 20)))
    monkeypatch.setattr(attention, "L2_DEFEAT_BYTES", 1 << 16)
    rows = attention.run({"device": "cpu", "copy_bytes_per_s": 4e12, "bf16_flops_per_s": 7e14, "quick": True,
                          "peers": ["atom_tools.kernel_peers_vllm"]})
    assert [r["case"] for r in rows] == ["decode-b1-new1-ctx40", "prefill-b2-new8-ctx28"]
    for r in rows:
        for peer in ("fa3", "vllm_triton"):  # each peer: a timed cell within bf16 of fp32, or the reason it has none
            cell = r[f"{peer}_us"]
            assert cell == 10.0 and r[f"{peer}_err"] < 5e-2 if not isinstance(cell, str) else \
                cell.startswith(("unavailable", "error")), (peer, r)
