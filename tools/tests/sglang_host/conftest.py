"""Fixtures of the SGLang end-to-end bench's tests.  Tests marked ``sglang`` start SGLang servers: they need an
installed SGLang (the nox sessions ``sglang-<version>`` set ``ATOM_SGLANG_REQUIRED=1``, which turns a missing SGLang
into an error instead of a skip)."""

from __future__ import annotations

import importlib.util
import os

import pytest

HAVE_SGLANG = importlib.util.find_spec("sglang") is not None
# As a user launching SGLang with ATOM's classes has it: the bench must keep it out of the `sglang` server's
# environment (the served-by check of each server's log catches a leak).
os.environ["SGLANG_EXTERNAL_MODEL_PACKAGE"] = "atom_sglang.models"


def pytest_configure(config):
    config.addinivalue_line("markers", "sglang: needs an installed SGLang")


def pytest_collection_modifyitems(config, items):
    if HAVE_SGLANG:
        return
    if os.environ.get("ATOM_SGLANG_REQUIRED") == "1":
        raise pytest.UsageError("ATOM_SGLANG_REQUIRED=1 but SGLang is not installed")
    for item in items:
        if "sglang" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="SGLang is not installed"))


@pytest.fixture(scope="session")
def tiny_qwen3(tmp_path_factory) -> str:
    """A tiny random Qwen3ForCausalLM checkpoint with its tokenizer files (``atom make-tiny``)."""
    from atom_core.tiny import make_tiny

    return str(make_tiny("Qwen3ForCausalLM", tmp_path_factory.mktemp("tiny") / "Qwen3ForCausalLM", seed=1))
