"""The ``vllm.general_plugins`` entry point: register ATOM's implementation of every catalog architecture.

vLLM calls :func:`register` in every process it starts (the main process, its registry-inspection
subprocess, the engine core and each worker), so it is idempotent and cheap: it registers
``"atom_vllm.models:<Arch>"`` *strings* (vLLM imports and inspects the classes lazily, in a subprocess),
imports no model code and never touches CUDA.  Only the architectures ATOM takes over are registered: do no harm
(:mod:`atom_core.takeover`): on a platform where ATOM has no measured fast path vLLM keeps its own class, unless
``ATOM_TAKE_OVER`` forces ATOM's.  The decision is made alike in every process (a pure function of vLLM's platform,
the architecture and the environment) and logged through vLLM's own logger, so the server log names the class that
serves each architecture.  It also puts ATOM's paged-attention backend in vLLM's CUSTOM
attention-backend slot (a class path, imported only when ``--attention-backend CUSTOM`` selects it; vLLM's own
choice stays the default): :mod:`atom_vllm.attention_backend`.  It is off when ``ATOM_DISABLE_VLLM_PLUGIN=1``, or when
vLLM's own ``VLLM_PLUGINS`` list does not name ``atom``.

Only this function's errors reach the user: vLLM logs (and otherwise ignores) a plugin whose *module*
fails to import, so this module imports nothing beyond the standard library at load.
"""

from __future__ import annotations

import logging
import sys

DISABLE_ENV = "ATOM_DISABLE_VLLM_PLUGIN"
MODELS_MODULE = "atom_vllm.models"
ATTENTION_BACKEND = "atom_vllm.attention_backend.AtomAttentionBackend"
# The module vLLM runs as its registry-inspection subprocess (``python -m``): a helper process, its log is not the
# server's, so the plugin's lines go there at debug level only.
INSPECTION_MAIN = "vllm.model_executor.models.registry"

_registered: dict[str, str] | None = None


def vllm_logger() -> logging.Logger:
    """A logger under vLLM's own (``vllm.*``, what ``vllm.logger.init_logger`` names): vLLM's logging configuration
    gives only those a handler, so a plugin's lines under any other name never reach the server log.  Getting it
    imports nothing of vLLM's."""
    return logging.getLogger(f"vllm.{__name__}")


def _info(logger: logging.Logger, *args) -> None:
    """INFO in the processes whose log is the server's; DEBUG in vLLM's registry-inspection subprocess."""
    main = sys.modules.get("__main__")
    helper = getattr(getattr(main, "__spec__", None), "name", None) == INSPECTION_MAIN
    (logger.debug if helper else logger.info)(*args)


def disabled() -> bool:
    from atom_core.env import env_flag  # standard library only

    return env_flag(DISABLE_ENV)


def register() -> dict[str, str]:
    """Register every catalog architecture ATOM takes over; returns ``{arch: "module:Class"}``."""
    global _registered
    if disabled():
        _info(vllm_logger(), "ATOM's vLLM plugin is disabled (%s is set): vLLM runs its own models", DISABLE_ENV)
        return {}
    if _registered is not None:
        return _registered

    from atom_core.versions import check_requirements

    check_requirements("atom-vllm")  # an atom-core outside atom-vllm's range: an error naming both versions
    logger = vllm_logger()
    from atom_core import catalog, takeover
    from atom_vllm import compat
    from atom_vllm.capabilities import plan

    version = compat.check_vllm_version()
    from vllm import ModelRegistry

    served, skipped = plan()
    platform = compat.platform()
    # vLLM's built-in table (and other plugins'), read before ATOM registers anything
    decisions = takeover.decide_all("vllm", platform, served, ModelRegistry.get_supported_archs())
    registered = {}
    for decision in decisions:
        if decision.atom:
            target = f"{MODELS_MODULE}:{decision.arch}"
            ModelRegistry.register_model(decision.arch, target)
            registered[decision.arch] = target
    # a target's draft model (speculative decoding) is ATOM's where the target is: never ATOM's draft beside vLLM's target
    for draft in catalog.DRAFTS.values():
        if any(target in registered for target in draft.targets):
            for name in (draft.name, *draft.aliases):  # the names a draft checkpoint's config.json may give
                target = f"{MODELS_MODULE}:{name}"
                ModelRegistry.register_model(name, target)
                registered[name] = target
    for arch, reason in skipped.items():
        logger.warning("ATOM does not serve %s under vLLM yet (%s); vLLM's own implementation is used", arch, reason)
    for line in takeover.summary("vllm", platform, decisions):
        _info(logger, "%s (atom-vllm, vLLM %s)", line, version)
    if compat.register_custom_attention_backend(ATTENTION_BACKEND):
        _info(logger, "ATOM's attention backend is vLLM's %s backend (--attention-backend %s to use it)",
              compat.CUSTOM_ATTENTION_BACKEND, compat.CUSTOM_ATTENTION_BACKEND)
    _registered = registered
    return registered
