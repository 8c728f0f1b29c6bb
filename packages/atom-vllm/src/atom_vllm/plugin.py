"""The ``vllm.general_plugins`` entry point: register ATOM's implementation of every catalog architecture.

vLLM calls :func:`register` in every process it starts (the main process, its registry-inspection
subprocess, the engine core and each worker), so it is idempotent and cheap: it registers
``"atom_vllm.models:<Arch>"`` *strings* (vLLM imports and inspects the classes lazily, in a subprocess),
imports no model code and never touches CUDA.  It also puts ATOM's paged-attention backend in vLLM's CUSTOM
attention-backend slot (a class path, imported only when ``--attention-backend CUSTOM`` selects it; vLLM's own
choice stays the default): :mod:`atom_vllm.attention_backend`.  It is off when ``ATOM_DISABLE_VLLM_PLUGIN=1``, or when
vLLM's own ``VLLM_PLUGINS`` list does not name ``atom``.

Only this function's errors reach the user: vLLM logs (and otherwise ignores) a plugin whose *module*
fails to import, so this module imports nothing beyond the standard library at load.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

DISABLE_ENV = "ATOM_DISABLE_VLLM_PLUGIN"
MODELS_MODULE = "atom_vllm.models"
ATTENTION_BACKEND = "atom_vllm.attention_backend.AtomAttentionBackend"

_registered: dict[str, str] | None = None


def disabled() -> bool:
    from atom_core.env import env_flag  # standard library only

    return env_flag(DISABLE_ENV)


def register() -> dict[str, str]:
    """Register every catalog architecture the adapter can serve; returns ``{arch: "module:Class"}``."""
    global _registered
    if disabled():
        logger.info("ATOM's vLLM plugin is disabled (%s is set): vLLM runs its own models", DISABLE_ENV)
        return {}
    if _registered is not None:
        return _registered

    from atom_core.versions import check_requirements

    check_requirements("atom-vllm")  # an atom-core outside atom-vllm's range: an error naming both versions
    from atom_vllm import compat
    from atom_vllm.capabilities import plan

    version = compat.check_vllm_version()
    from vllm import ModelRegistry

    served, skipped = plan()
    registered = {}
    for arch in served:
        target = f"{MODELS_MODULE}:{arch}"
        ModelRegistry.register_model(arch, target)
        registered[arch] = target
    for arch, reason in skipped.items():
        logger.warning("ATOM does not serve %s under vLLM yet (%s); vLLM's own implementation is used", arch, reason)
    logger.info("ATOM registered %d architectures with vLLM %s: %s", len(registered), version, ", ".join(registered))
    if compat.register_custom_attention_backend(ATTENTION_BACKEND):
        logger.info("ATOM's attention backend is vLLM's %s backend (--attention-backend %s to use it)",
                    compat.CUSTOM_ATTENTION_BACKEND, compat.CUSTOM_ATTENTION_BACKEND)
    _registered = registered
    return registered
