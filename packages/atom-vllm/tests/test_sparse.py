"""atom-vllm's sparse attention layer (:mod:`atom_vllm.sparse`, :mod:`sparse_probe`) built on vLLM's CPU platform: a
vLLM attention layer registered in the forward context under its name, reporting one latent row plus indexer key of
the model's dtype per token in blocks of the config's size, refusing a duplicate name and an FP8 cache in one line.
And what the compatibility table says: vLLM's own registry has every catalog architecture with sparse attention, and
vLLM's CPU platform selects no backend of its own for a sparse latent layer, so vLLM's own DeepSeek-V3.2 / GLM-5 cannot
run on a CPU host.  (The vLLM-built forward of ATOM's classes: test_construct.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import HERE

pytestmark = pytest.mark.construct


@pytest.fixture(scope="module")
def probed(tmp_path_factory, vllm_cache) -> dict:
    out = tmp_path_factory.mktemp("sparse") / "probe.json"
    env = {**os.environ, "VLLM_CACHE_ROOT": vllm_cache}
    proc = subprocess.run([sys.executable, str(HERE / "sparse_probe.py"), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and out.is_file(), proc.stderr[-6000:]
    return json.loads(out.read_text())


def test_sparse_layer_cache_spec(probed):
    from sparse_probe import BLOCK_SIZE, INDEX_DIM, KV_LORA_RANK, ROPE

    row = KV_LORA_RANK + ROPE + INDEX_DIM
    assert probed["spec"] == {"class": "MLAAttentionSpec", "block_size": BLOCK_SIZE, "num_kv_heads": 1,
                              "head_size": row, "dtype": "torch.float32"}
    assert probed["layer_base"] and probed["backend"] == {"mla": True, "shape": [3, BLOCK_SIZE, row]}


def test_sparse_layer_registered_once(probed):
    assert probed["registered"], "the layer is not in vLLM's forward context under its name"
    assert "duplicate layer name" in (probed["refusals"]["duplicate"] or ""), probed["refusals"]


def test_sparse_layer_refuses_an_fp8_cache(probed):
    assert "kv_cache_dtype=fp8" in (probed["refusals"]["fp8_cache"] or ""), probed["refusals"]


def test_vllm_serves_the_sparse_architectures(probed):
    assert probed["own_sparse_archs"] and all(probed["own_sparse_archs"].values()), probed["own_sparse_archs"]


def test_cpu_platform_has_no_sparse_backend(probed):
    """If a vLLM release adds a CPU sparse MLA backend this fails: the compatibility table then changes."""
    assert probed["sparse_backend"].startswith("NotImplementedError") and "not supported on CPU" in probed[
        "sparse_backend"], probed["sparse_backend"]
