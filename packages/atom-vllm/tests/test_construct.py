"""Forced-CPU construction of every served architecture under vLLM, and vLLM's own weight loading
(DefaultModelLoader feeding its iterator to the wrapper's load_weights, then vLLM's coverage tracking):
every parameter written (each was NaN before), the returned set is every parameter, spot checks equal the
checkpoint, and each attention layer is vLLM's, registered under its layer name."""

from __future__ import annotations

import pytest
from test_plugin import assert_served_by_atom

from atom_core import catalog
from atom_core.config import DecoderConfig
from atom_core.tiny import tiny_config

pytestmark = pytest.mark.construct


def test_construct_and_load_every_architecture(tiny_models, probe):
    results = probe("construct", list(tiny_models.values()))
    assert_served_by_atom(results)
    assert sorted(r["arch"] for r in results) == sorted(tiny_models)
    for r in results:
        assert r["params"], r["arch"]
        assert r["returned"] == r["params"], f"{r['arch']}: load_weights returned {set(r['params']) ^ set(r['returned'])}"
        assert r["nan_params"] == [], f"{r['arch']}: never written: {r['nan_params']}"
        assert all(r["spot_checks"].values()), f"{r['arch']}: {r['spot_checks']}"
        layers = DecoderConfig.from_hf(tiny_config(r["arch"])).num_layers
        assert r["attention_layers"] == sorted(f"model.layers.{i}.self_attn.attn" for i in range(layers))
        assert catalog.get(r["arch"]).name == r["qualname"]
