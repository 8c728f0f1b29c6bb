"""DeepSeek sparse attention's indexer-key cache inside vLLM (:mod:`atom_vllm.sparse`, :mod:`sparse_cache_probe`):
built on vLLM's CPU platform, it is vLLM's own indexer-cache layer, registered in the forward context under the name
vLLM's DeepSeek-V3.2 gives it, reporting one ``head_dim`` key of the model's dtype per token in blocks of the
config's size.  And what the compatibility table says: vLLM's own registry serves every catalog architecture with
sparse attention (its class, since atom-vllm registers none of them), and vLLM's CPU platform selects no backend for a
sparse latent layer, so neither vLLM's class nor a DSA step can run on a CPU host."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import HERE

from atom_vllm.sparse import indexer_cache_name

pytestmark = pytest.mark.construct


@pytest.fixture(scope="module")
def probed(tmp_path_factory, vllm_cache) -> dict:
    out = tmp_path_factory.mktemp("sparse") / "probe.json"
    env = {**os.environ, "VLLM_CACHE_ROOT": vllm_cache}
    proc = subprocess.run([sys.executable, str(HERE / "sparse_cache_probe.py"), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and out.is_file(), proc.stderr[-6000:]
    return json.loads(out.read_text())


def test_indexer_cache_spec(probed):
    from sparse_cache_probe import BLOCK_SIZE, HEAD_DIM

    assert probed["spec"] == {"class": "MLAAttentionSpec", "block_size": BLOCK_SIZE, "num_kv_heads": 1,
                              "head_size": HEAD_DIM, "dtype": "torch.float32"}


def test_indexer_cache_registered_once(probed):
    assert probed["registered"], "the layer is not in vLLM's forward context under its name"
    assert probed["duplicate"] and "Duplicate layer name" in probed["duplicate"], probed["duplicate"]


def test_vllm_serves_the_sparse_architectures(probed):
    assert probed["own_sparse_archs"] and all(probed["own_sparse_archs"].values()), probed["own_sparse_archs"]


def test_cpu_platform_has_no_sparse_backend(probed):
    """If a vLLM release adds a CPU sparse MLA backend this fails: the compatibility table and the CPU limits of the
    construct/generate checks then change."""
    assert probed["sparse_backend"].startswith("NotImplementedError") and "not supported on CPU" in probed[
        "sparse_backend"], probed["sparse_backend"]


def test_indexer_cache_name():
    assert indexer_cache_name("model.layers.3.self_attn.attn") == "model.layers.3.self_attn.indexer.k_cache"
    with pytest.raises(ValueError, match="parent module"):
        indexer_cache_name("attn")
