"""ATOM's environment switches (``ATOM_DEBUG``, ``ATOM_TAKE_OVER``, ``ATOM_KERNEL_BACKEND``, ...): one rule for each
kind, and one check of all of them at start.

:func:`env_flag` reads a boolean switch (``ATOM_DEBUG``, ``ATOM_DISABLE_VLLM_PLUGIN``, ...).
:func:`check_environment` checks every switch ATOM reads (:data:`BOOLEAN_SWITCHES`, :data:`CHOICE_SWITCHES`,
``ATOM_KERNEL_BACKEND``) and raises a :class:`UsageError` naming the first bad one; the ``atom`` command runs
it before any command and every model runs it when it is built (whatever the host), so a misspelt value is
reported before anything is loaded.

Standard library only at import, so the adapters' plugin entry points can import it at load.
"""

from __future__ import annotations

import os

from atom_core.errors import UsageError

ON = frozenset({"1", "true", "yes", "on"})
OFF = frozenset({"", "0", "false", "no", "off"})

# every boolean switch ATOM reads, and what it does
BOOLEAN_SWITCHES = {
    "ATOM_DEBUG": "errors of the atom command print their traceback too",
    "ATOM_DISABLE_VLLM_PLUGIN": "vLLM runs its own model classes",
    "ATOM_VLLM_ALLOW_UNSUPPORTED": "atom-vllm loads on a vLLM outside its tested range",
    "ATOM_VLLM_COMPILE_HYBRID": "vLLM compiles ATOM's hybrid (Gated DeltaNet) classes too (see docs/vllm.md)",
    "ATOM_AITER_MXFP4_A4W4": "AITER's MXFP4 GEMM may quantize activations too (ROCm)",
}
# switches that take one of a few values
CHOICE_SWITCHES = {"ATOM_MXFP4_LAYOUT": ("auto", "rows")}
KERNEL_BACKEND = "ATOM_KERNEL_BACKEND"  # parsed and checked by atom_kernels.dispatch
TAKE_OVER_ENV = "ATOM_TAKE_OVER"  # which architectures ATOM's classes take over from a host (atom_core.takeover)
ALL, NONE = "all", "none"


def env_flag(name: str) -> bool:
    """Whether the switch ``name`` is on: ``1/true/yes/on`` turn it on, unset or ``0/false/no/off`` leave it off
    (case and surrounding spaces ignored). Any other value is a :class:`UsageError` naming the variable."""
    value = os.environ.get(name, "").strip().lower()
    if value in ON:
        return True
    if value in OFF:
        return False
    raise UsageError(f"{name}={os.environ[name]!r} is not a switch value: use 1/true/yes/on or 0/false/no/off")


def env_choice(name: str) -> str:
    """The value of the switch ``name`` (one of :data:`CHOICE_SWITCHES`' values; unset: the first)."""
    choices = CHOICE_SWITCHES[name]
    value = os.environ.get(name, "").strip() or choices[0]
    if value not in choices:
        raise UsageError(f"{name}={os.environ[name]!r}: expected one of {', '.join(choices)}")
    return value


def check_environment(device_type: str | None = None) -> None:
    """Check every ATOM switch set in the environment; ``device_type`` (``"cpu"``/``"cuda"``): also that the
    kernel backends ``ATOM_KERNEL_BACKEND`` asks for can run there.  A :class:`UsageError` naming the variable."""
    for name in BOOLEAN_SWITCHES:
        env_flag(name)
    for name in CHOICE_SWITCHES:
        env_choice(name)
    env_take_over()
    value = os.environ.get(KERNEL_BACKEND)
    if value is not None:
        from atom_kernels import dispatch

        try:
            dispatch.check_override(value, device_type)
        except ValueError as err:
            raise UsageError(str(err)) from None


def env_items(name: str) -> tuple[str, ...]:
    """The comma-separated items of ``name`` (``ATOM_TAKE_OVER=Qwen3ForCausalLM,LlamaForCausalLM``), each stripped of
    spaces, empty ones dropped; ``()`` when it is unset or empty. What the items may be is the reader's to check."""
    return tuple(item.strip() for item in os.environ.get(name, "").split(",") if item.strip())


def env_take_over() -> str | frozenset[str] | None:
    """``ATOM_TAKE_OVER`` read: None (unset: :mod:`atom_core.takeover`'s table decides), ``"all"``, ``"none"``, or a set
    of catalog architectures.  Any other value is a :class:`UsageError` naming the variable and the item."""
    items = env_items(TAKE_OVER_ENV)
    if not items:
        return None
    lowered = [item.lower() for item in items]
    if len(items) == 1 and lowered[0] in (ALL, NONE):
        return lowered[0]
    from atom_core import catalog

    unknown = [item for item in items if item not in catalog.ARCHITECTURES]
    if unknown:
        raise UsageError(f"{TAKE_OVER_ENV}={','.join(items)}: {', '.join(unknown)} is not a catalog architecture; use "
                         f"'{ALL}', '{NONE}' or a comma-separated list of: {', '.join(catalog.ARCHITECTURES)}")
    return frozenset(items)
