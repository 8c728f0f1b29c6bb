"""The ``sglang.srt.plugins`` entry point (SGLang >= 0.5.11).

SGLang runs it in the launcher, the engine and each scheduler process.  It checks the installed SGLang
against the range atom-sglang supports (ci/pins.toml, shipped as ``_pins.py``).  SGLang catches and logs
whatever a plugin raises, so the refusal is also logged as an explicit error line, and the model
classes check again when SGLang builds them (that error is not swallowed).

Choosing ATOM's models stays the user's decision: ``SGLANG_EXTERNAL_MODEL_PACKAGE=atom_sglang.models``; even then
ATOM's class serves an architecture only where atom_core.takeover measured a fast path on the platform (do no harm),
unless ``ATOM_TAKE_OVER`` forces it (the package's import logs which class serves each architecture).  So does
ATOM's attention backend: the plugin registers it in SGLang's attention-backend registry and adds ``atom`` to the
``--attention-backend`` choices (:mod:`atom_sglang.attention_backend`); SGLang's default backend is unchanged.
"""

from __future__ import annotations

import logging
import os

from atom_sglang import compat

logger = logging.getLogger(__name__)

ENV = "SGLANG_EXTERNAL_MODEL_PACKAGE"
PACKAGE = "atom_sglang.models"


def register() -> None:
    from atom_core.versions import VersionMismatch, check_requirements

    try:
        check_requirements("atom-sglang")
    except VersionMismatch as error:
        logger.error("atom-sglang: %s", error)
        raise
    version = compat.installed_version()
    reason = compat.unsupported_reason(version)
    if reason is not None:
        logger.error("atom-sglang: %s", reason)
        raise compat.UnsupportedSGLangVersion(reason)
    from atom_sglang import attention_backend

    attention_backend.register()
    if os.environ.get(ENV) == PACKAGE:
        logger.info("atom-sglang: SGLang %s supported; ATOM's models are selected (%s=%s)", version, ENV, PACKAGE)
    else:
        logger.info("atom-sglang: SGLang %s supported; set %s=%s to run ATOM's models", version, ENV, PACKAGE)
