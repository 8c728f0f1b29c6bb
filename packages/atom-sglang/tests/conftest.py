"""Fixtures for atom-sglang's tests.

Tests marked ``sglang`` need an installed SGLang (the nox sessions ``sglang-<version>`` provide one and set
``ATOM_SGLANG_REQUIRED=1``, which turns a missing SGLang into an error instead of a skip).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from atom_core import catalog
from atom_core.tiny import make_tiny

HAVE_SGLANG = importlib.util.find_spec("sglang") is not None
# As a user launches SGLang: the variable is set before SGLang's model registry is first imported (it is
# read then, once per process).  Tests that need it unset run in a fresh subprocess (_sglang_env.run_fresh).
os.environ["SGLANG_EXTERNAL_MODEL_PACKAGE"] = "atom_sglang.models"
# These tests check ATOM's classes inside SGLang, which on the CPU are not the default (do no harm: SGLang keeps its
# own class where ATOM has no measured fast path, atom_core.takeover): forced on here and in every process the tests
# start.  Tests of the default unset it for themselves.
os.environ["ATOM_TAKE_OVER"] = "all"
# SGLang keeps the GDN conv state in bf16 unless told otherwise, whatever the model's dtype; the fp32 parity
# tests keep it in fp32 (the SSM state is fp32 by default).
os.environ["SGLANG_MAMBA_CONV_DTYPE"] = "float32"
REQUIRED = os.environ.get("ATOM_SGLANG_REQUIRED") == "1"


def pytest_configure(config):
    config.addinivalue_line("markers", "sglang: needs an installed SGLang")
    config.addinivalue_line("markers", "server: SGLang's OpenAI server on the demo model (the newest SGLang session only)")
    config.addinivalue_line("markers", "bench_servers: the end-to-end bench through two CPU servers (the session of "
                                       "the GPU bundle's SGLang only)")


def pytest_collection_modifyitems(config, items):
    if HAVE_SGLANG:
        return
    if REQUIRED:
        raise pytest.UsageError("ATOM_SGLANG_REQUIRED=1 but SGLang is not installed")
    skip = pytest.mark.skip(reason="SGLang is not installed")
    for item in items:
        if "sglang" in item.keywords:
            item.add_marker(skip)


def reference_missing(arch: str) -> str | None:
    """Why the installed transformers (the release's own pin) cannot write ``arch``'s tiny checkpoint nor be its
    reference: it lacks the architecture (transformers 5.12.1, pinned by SGLang 0.5.17-0.5.21, has no Kimi-K2.5).
    None when it has it."""
    import transformers

    spec = catalog.get(arch)
    try:
        spec.hf_model_class()
    except (ImportError, AttributeError):
        name = spec.hf_class.partition(":")[2]
        return f"transformers {transformers.__version__} has no {name} (no reference, no tiny checkpoint)"
    return None


# What SGLang's pools need of a tiny checkpoint beyond the catalog's: its DSA pool holds 128-wide indexer keys only.
TINY_FOR_SGLANG = {arch: {"index_head_dim": 128} for arch, spec in catalog.ARCHITECTURES.items()
                   if catalog.SPARSE_ATTENTION in spec.capabilities}


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory):
    """``arch -> dir`` of a tiny random checkpoint for every catalog architecture atom-sglang serves and the installed
    transformers has (:func:`reference_missing`)."""
    from atom_sglang import capabilities

    served, _ = capabilities.plan()
    root = tmp_path_factory.mktemp("tiny")
    return {arch: str(with_full_attention_interval(make_tiny(arch, root / arch, seed=1, **TINY_FOR_SGLANG.get(arch, {}))))
            for arch in served if reference_missing(arch) is None}


def _rotates_rotary_dim(config) -> bool:
    rotary_dim = getattr(config, "rotary_dim", None)
    factor = (getattr(config, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0)
    return rotary_dim is None or factor * config.head_dim == rotary_dim


def _glm_indexer_rotates_interleaved(config) -> bool:
    from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa

    return not hasattr(modeling_glm_moe_dsa, "apply_rotary_pos_emb")  # the half-split rotation its indexer used


# arch -> (does the installed transformers model a checkpoint's config as the published checkpoints mean it?, why
# not). transformers 5.12.1 (SGLang 0.5.17-0.5.21's pin), where 5.19 does as ATOM and the published checkpoints do:
# - MiniMax-M2: reads no `rotary_dim` and rotates the whole head (5.19: partial_rotary_factor);
# - GLM-5: its indexer rotates half-split, where GLM-5's config says `indexer_rope_interleave` (transformers #46842).
FAITHFUL_REFERENCE = {
    "MiniMaxM2ForCausalLM": (_rotates_rotary_dim, "reads no rotary_dim: it rotates the whole head, MiniMax-M2's "
                                                   "checkpoints (and ATOM) rotate rotary_dim of it"),
    "GlmMoeDsaForCausalLM": (_glm_indexer_rotates_interleaved, "indexer rotates half-split; GLM-5's indexer "
                                                               "rotates interleaved pairs (indexer_rope_interleave)"),
}


def reference_unfaithful(arch: str, path: str) -> str | None:
    """Why the installed transformers is no reference for ``arch``'s checkpoint at ``path``, or None."""
    import transformers

    if arch not in FAITHFUL_REFERENCE:
        return None
    faithful, why = FAITHFUL_REFERENCE[arch]
    if faithful(transformers.AutoConfig.from_pretrained(path)):
        return None
    return f"transformers {transformers.__version__}'s {arch} {why}"


def checkpoint_or_skip(arch: str, tiny_checkpoints: dict[str, str]) -> str:
    """``arch``'s tiny checkpoint, or a skip naming why there is none."""
    if arch not in tiny_checkpoints:
        pytest.skip(reference_missing(arch) or f"atom-sglang does not serve {arch} (see atom_sglang.capabilities)")
    return tiny_checkpoints[arch]


def with_full_attention_interval(path: Path) -> Path:
    """Hybrid checkpoints as published carry ``full_attention_interval``, which SGLang's own config classes
    (Qwen3NextConfig...) read to plan their state pool; transformers turns it into ``layer_types`` and drops
    it when saving a config, so the tiny checkpoints get it back from their ``layer_types``."""
    config_path = Path(path) / "config.json"
    config = json.loads(config_path.read_text())
    for cfg in (config, config.get("text_config") or {}):
        types = cfg.get("layer_types") or []
        if "linear_attention" in types and "full_attention_interval" not in cfg:
            interval = types.index("full_attention") + 1
            assert all((t == "full_attention") == ((i + 1) % interval == 0) for i, t in enumerate(types)), types
            cfg["full_attention_interval"] = interval
    config_path.write_text(json.dumps(config, indent=2))
    return Path(path)


@pytest.fixture(scope="session")
def cpu_runtime(tiny_checkpoints):
    """SGLang's runtime on the CPU (see _sglang_env.start_cpu_runtime), once per test session."""
    from _sglang_env import start_cpu_runtime, stop_cpu_runtime

    start_cpu_runtime(next(iter(tiny_checkpoints.values())))
    yield
    stop_cpu_runtime()
