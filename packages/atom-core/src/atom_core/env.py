"""Boolean environment switches (``ATOM_DEBUG``, ``ATOM_DISABLE_VLLM_PLUGIN``, ...): one rule for all of them.

Standard library only, so the adapters' plugin entry points can import it at load.
"""

from __future__ import annotations

import os

from atom_core.errors import UsageError

ON = frozenset({"1", "true", "yes", "on"})
OFF = frozenset({"", "0", "false", "no", "off"})


def env_flag(name: str) -> bool:
    """Whether the switch ``name`` is on: ``1/true/yes/on`` turn it on, unset or ``0/false/no/off`` leave it off
    (case and surrounding spaces ignored). Any other value is a :class:`UsageError` naming the variable."""
    value = os.environ.get(name, "").strip().lower()
    if value in ON:
        return True
    if value in OFF:
        return False
    raise UsageError(f"{name}={os.environ[name]!r} is not a switch value: use 1/true/yes/on or 0/false/no/off")
