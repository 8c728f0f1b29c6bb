"""Environment switches (``ATOM_DEBUG``, ``ATOM_DISABLE_VLLM_PLUGIN``, ``ATOM_TAKE_OVER``, ...): one rule for each kind.

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


def env_items(name: str) -> tuple[str, ...]:
    """The comma-separated items of ``name`` (``ATOM_TAKE_OVER=Qwen3ForCausalLM,LlamaForCausalLM``), each stripped of
    spaces, empty ones dropped; ``()`` when it is unset or empty. What the items may be is the reader's to check."""
    return tuple(item.strip() for item in os.environ.get(name, "").split(",") if item.strip())
