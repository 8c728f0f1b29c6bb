"""The ``mla`` kernel suite (atom_tools.kernels.mla) at toy sizes, timing stubbed."""

import sys
import types


def test_mla_suite_runs(device, monkeypatch):
    """The GPU bench's code paths at toy sizes (timing replaced by one call): a row per implementation, the
    kernel's error against the reference, the reference skipped past its size limit."""
    import atom_tools.kernels.mla as suite

    monkeypatch.setattr(suite, "HEADS", (16,))
    monkeypatch.setattr(suite, "BATCHES", (2,))
    monkeypatch.setattr(suite, "CONTEXTS", (40, 300))
    monkeypatch.setattr(suite, "LATENT", 64)
    monkeypatch.setattr(suite, "PAGE", 16)
    monkeypatch.setattr(suite, "REFERENCE_MAX_TOKENS", 100)
    monkeypatch.setattr(suite.timing, "measure", lambda fn, **kw: (fn(), {"us": 1.0, "graph": False})[1])

    def missing_peer(inputs):
        raise ImportError("no vllm here")

    # peers from a --peers module: the reference standing in for a working one, and one that cannot be imported
    module = types.SimpleNamespace(PEERS={"mla": {"peer": lambda inputs: suite.mla_reference.mla_decode,
                                                  "gone": missing_peer}})
    monkeypatch.setitem(sys.modules, "fake_mla_peers", module)
    rows = suite.run({"device": str(device), "copy_bytes_per_s": 4e12, "peers": ["fake_mla_peers"]})
    assert [(r["context"], r["impl"]) for r in rows] == [
        (40, "gone"), (40, "atom-triton"), (40, "torch-reference"), (40, "peer"),
        (300, "torch-reference"), (300, "gone"), (300, "atom-triton"), (300, "peer")]
    assert rows[1]["rel_err"] < 2e-2 and rows[1]["peer_rel_err_to_atom"] < 2e-2
    assert rows[0]["error"] == "ImportError: no vllm here" and all("error" not in r for r in rows if r["impl"] != "gone")
    assert rows[4]["skipped"] and rows[6]["floor_us"] > 0
