"""Backend choice for every op.

Order of preference: ``aiter`` (ROCm, when the ``aiter`` package imports) > ``torch`` (a vendor library
reached through torch, e.g. cuBLASLt's ``torch._scaled_mm``; GPU tensors only; only ops that declare it)
> ``triton`` (any GPU, or the CPU through ``TRITON_INTERPRET=1`` when asked for explicitly) >
``reference`` (plain torch, anywhere).

``ATOM_KERNEL_BACKEND`` overrides the choice: either one backend for every op (``triton``) or a
comma-separated list of ``op=backend`` pairs (``rms_norm=reference,silu_and_mul=triton``), optionally
with a default first (``triton,rms_norm=reference``).  A backend that is asked for but cannot run, an
unknown backend and an op name that is not a registered op are clear errors, never a silent substitute
(:func:`check_override` checks a value up front; ``atom_core.env.check_environment`` runs it at start).

Each backend module of an op exposes the op's function under the op's name and, optionally,
``unsupported(*args, **kwargs) -> str | None``: a pure precondition check.  When it returns a reason the
dispatcher moves on to the next backend in the order (fast paths fall back, they never fail).
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.util
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

logger = logging.getLogger(__name__)

BACKENDS: tuple[str, ...] = ("aiter", "torch", "triton", "reference")
# What an op has unless it declares otherwise (``torch`` is opt-in: few ops have a vendor library path).
DEFAULT_BACKENDS: tuple[str, ...] = ("aiter", "triton", "reference")
ENV_OVERRIDE = "ATOM_KERNEL_BACKEND"


class BackendUnavailable(RuntimeError):
    """A backend was requested explicitly but cannot run here."""


@functools.cache
def _aiter_present() -> bool:
    return torch.version.hip is not None and importlib.util.find_spec("aiter") is not None


@functools.cache
def _triton_present() -> bool:
    return importlib.util.find_spec("triton") is not None


# Values that turn a boolean switch on: atom_core.env's rule (which atom_core checks every ATOM_* switch with at
# start; atom_kernels cannot import it).  A test keeps the two sets equal.
SWITCH_ON = frozenset({"1", "true", "yes", "on"})


def switch_on(name: str) -> bool:
    """Whether the boolean switch ``name`` is on (``1/true/yes/on``, case and spaces ignored)."""
    return os.environ.get(name, "").strip().lower() in SWITCH_ON


def triton_interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def backend_unavailable_reason(backend: str, device_type: str) -> str | None:
    """Why ``backend`` cannot run tensors of ``device_type`` here (None when it can)."""
    if backend == "reference":
        return None
    if backend == "aiter":
        if device_type != "cuda":
            return "aiter runs only on GPU tensors"
        if not _aiter_present():
            return "aiter needs a ROCm build of torch and the aiter package"
        return None
    if backend == "torch":
        return None if device_type == "cuda" else "the torch backend runs only on GPU tensors"
    if backend == "triton":
        if not _triton_present():
            return "the triton package is not installed"
        if device_type == "cuda" or (device_type == "cpu" and triton_interpreting()):
            return None
        return f"triton cannot run {device_type} tensors (TRITON_INTERPRET=1 runs CPU tensors)"
    return f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}"


def parse_override(value: str | None, ops: Iterable[str] | None = None) -> tuple[str | None, dict[str, str]]:
    """``"triton,rms_norm=reference"`` -> (``"triton"``, ``{"rms_norm": "reference"}``).  A ``ValueError`` naming
    :data:`ENV_OVERRIDE` for an unknown backend, a malformed item, or (given ``ops``, the known op names) an op
    name that is not one of them (a misspelt op is an error, never silently ignored)."""
    default: str | None = None
    per_op: dict[str, str] = {}
    for item in (value or "").split(","):
        item = item.strip()
        if not item:
            continue
        if "=" in item:
            op, backend = (part.strip() for part in item.split("=", 1))
            if not op or not backend:
                raise ValueError(f"{ENV_OVERRIDE}={value!r}: {item!r} is not op=backend")
            per_op[op] = backend
        else:
            default = item
    for backend in [default, *per_op.values()]:
        if backend is not None and backend not in BACKENDS:
            raise ValueError(
                f"{ENV_OVERRIDE}={value!r} names unknown backend {backend!r}; known: {', '.join(BACKENDS)}"
            )
    if ops is not None:
        known = sorted(ops)
        for op in per_op:
            if op not in known:
                close = difflib.get_close_matches(op, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"{ENV_OVERRIDE}={value!r} names unknown op {op!r}{hint}; ops: {', '.join(known)}")
    return default, per_op


def check_override(value: str | None, device_type: str | None = None) -> None:
    """Everything :func:`parse_override` checks against the registered ops, and that each op named with a
    backend has it; with ``device_type`` (``"cpu"``/``"cuda"``), that every backend asked for can run there.
    A ``ValueError`` naming :data:`ENV_OVERRIDE` otherwise: run where a program starts, so a bad value is
    reported before any model is built."""
    default, per_op = parse_override(value, OPS)
    for name, backend in per_op.items():
        if backend not in OPS[name].backends:
            raise ValueError(f"{ENV_OVERRIDE}={value!r}: op {name!r} has no {backend!r} backend "
                             f"(it has {', '.join(OPS[name].backends)})")
    if device_type not in ("cpu", "cuda"):
        return
    for backend in dict.fromkeys(b for b in (default, *per_op.values()) if b is not None):
        reason = backend_unavailable_reason(backend, device_type)
        if reason is not None:
            raise ValueError(f"{ENV_OVERRIDE}={value!r} asks for {backend!r} on {device_type}: {reason}")


def candidate_backends(op: Op, device_type: str, override: str | None) -> tuple[str, ...]:
    """The backends to try, in order, for ``op`` on ``device_type`` under the given override."""
    default, per_op = parse_override(override, OPS)
    forced = per_op.get(op.name, default)
    if forced is not None:
        if forced not in op.backends:
            raise BackendUnavailable(f"op {op.name!r} has no {forced!r} backend (it has {', '.join(op.backends)})")
        reason = backend_unavailable_reason(forced, device_type)
        if reason is not None:
            raise BackendUnavailable(f"{ENV_OVERRIDE} asks for {forced!r} for op {op.name!r}: {reason}")
        # A forced fast path still falls back to the reference when a call breaks its preconditions.
        return (forced, "reference") if forced != "reference" else ("reference",)
    chosen = []
    for backend in op.backends:
        if backend == "triton" and device_type != "cuda":
            continue  # the interpreter is for tests, used only when asked for
        if backend_unavailable_reason(backend, device_type) is None:
            chosen.append(backend)
    return tuple(chosen)


@dataclass
class Op:
    """One public op: its name and the backends it has, each in ``<package>.<backend>``."""

    name: str
    package: str
    backends: tuple[str, ...]
    _impls: dict[str, tuple[Callable[..., Any], Callable[..., str | None] | None]] = field(
        default_factory=dict, repr=False
    )
    _plans: dict[tuple[str, str | None], tuple[str, ...]] = field(default_factory=dict, repr=False)
    # What a call becomes while torch.compile traces it: the same call through the op's ``torch.ops.atom``
    # custom op(s), which the compiler keeps opaque (:mod:`atom_kernels.library` sets it).
    traced: Callable[..., Any] | None = field(default=None, repr=False)

    def implementation(self, backend: str) -> tuple[Callable[..., Any], Callable[..., str | None] | None]:
        if backend not in self._impls:
            module = importlib.import_module(f"{self.package}.{backend}")
            self._impls[backend] = (getattr(module, self.name), getattr(module, "unsupported", None))
        return self._impls[backend]

    def plan(self, device_type: str) -> tuple[str, ...]:
        override = os.environ.get(ENV_OVERRIDE)
        key = (device_type, override)
        if key not in self._plans:
            self._plans[key] = candidate_backends(self, device_type, override)
        return self._plans[key]

    def resolve(self, *args: Any, **kwargs: Any) -> tuple[str, Callable[..., Any]]:
        """The backend that will run this call, and its function."""
        device_type = _device_type(args, kwargs)
        reasons = []
        for backend in self.plan(device_type):
            fn, unsupported = self.implementation(backend)
            reason = unsupported(*args, **kwargs) if unsupported is not None else None
            if reason is None:
                return backend, fn
            reasons.append(f"{backend}: {reason}")
            logger.debug("%s falls back from %s: %s", self.name, backend, reason)
        raise BackendUnavailable(f"no backend of {self.name!r} accepts this call ({'; '.join(reasons)})")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.traced is not None and torch.compiler.is_compiling():
            return self.traced(*args, **kwargs)
        return self.eager(*args, **kwargs)

    def eager(self, *args: Any, **kwargs: Any) -> Any:
        """The call run now: the first backend whose preconditions hold."""
        _, fn = self.resolve(*args, **kwargs)
        return fn(*args, **kwargs)

    def call_backend(self, backend: str, *args: Any, **kwargs: Any) -> Any:
        """Run one backend directly (tests and benchmarks)."""
        fn, _ = self.implementation(backend)
        return fn(*args, **kwargs)


def _device_type(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device.type
    return "cpu"


OPS: dict[str, Op] = {}


def register_op(name: str, package: str, backends: tuple[str, ...] = DEFAULT_BACKENDS) -> Op:
    """Declare an op; its backend modules are imported on first use."""
    op = Op(name=name, package=package, backends=tuple(b for b in BACKENDS if b in backends))
    OPS[name] = op
    return op


def describe(device_type: str) -> dict[str, str]:
    """Which backend each registered op resolves to first on ``device_type`` (for ``atom env``)."""
    table = {}
    for name, op in sorted(OPS.items()):
        try:
            table[name] = op.plan(device_type)[0]
        except (BackendUnavailable, ValueError) as err:
            table[name] = f"error: {err}"
    return table
