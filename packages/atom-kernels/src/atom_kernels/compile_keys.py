"""What Triton's GPU JIT would compile for each launch, recorded while the kernels run in the interpreter.

A Triton kernel is compiled once per *specialization key*: its constexpr values and, for every other integer
argument not named in ``do_not_specialize``, whether it is 1 or a multiple of 16, and for every tensor argument not
named in ``do_not_specialize_on_alignment``, whether its address is a multiple of 16 bytes (Triton's
``native_specialize_impl``, called here as the JIT calls it).  A size that changes from step to step (a token or
sequence count, a stride that is one), or a per-sequence tensor sliced at a step-dependent offset (a host's prefill
sequences behind its decode ones), therefore compiles a new variant the first time each class appears, in the
middle of serving.  :func:`recording` collects the keys of every launch; :func:`size_specializations` names the
arguments whose class changed between launches that agree on every constexpr."""

from __future__ import annotations

import collections
import contextlib
import inspect

import torch
import triton.language as tl
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend
from triton.runtime.interpreter import InterpretedFunction


def _specialized(value, specialize: bool, align: bool) -> tuple:
    return tuple(native_specialize_impl(BaseBackend, value, False, specialize, align))


def launch_key(kernel: InterpretedFunction, args: tuple, kwargs: dict) -> tuple:
    """``((name, "const" | "int" | "ptr", value), ...)`` of one launch of ``kernel``."""
    signature = inspect.signature(kernel.fn)
    bound = signature.bind_partial(*args, **{k: v for k, v in kwargs.items() if k in signature.parameters})
    names = list(signature.parameters)

    def named(option: str) -> set[str]:
        return {names[n] if isinstance(n, int) else n for n in kernel.kwargs.get(option) or ()}

    fixed, unaligned = named("do_not_specialize"), named("do_not_specialize_on_alignment")
    key = []
    for name, value in bound.arguments.items():
        annotation = signature.parameters[name].annotation
        if annotation is tl.constexpr or annotation == "tl.constexpr":
            key.append((name, "const", repr(value)))
        elif isinstance(value, int) and not isinstance(value, bool):
            key.append((name, "int", _specialized(value, name not in fixed, name not in fixed)))
        elif isinstance(value, torch.Tensor):  # its dtype and whether its address is 16-byte aligned
            key.append((name, "ptr", _specialized(value, True, name not in unaligned)))
    return tuple(key)


@contextlib.contextmanager
def recording(launch: bool = True):
    """``{kernel name: {launch key}}`` of every Triton launch inside the block (interpreter only).  With
    ``launch=False`` the kernels do not run (their outputs keep whatever their buffers held): enough for the keys
    of code that never reads a kernel's output back to the host, at none of the interpreter's cost."""
    keys: dict[str, set] = collections.defaultdict(set)
    original = InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        keys[self.fn.__qualname__].add(launch_key(self, args, kwargs))
        return original(self, *args, grid=grid, warmup=warmup, **kwargs) if launch else None

    InterpretedFunction.run = run
    try:
        yield keys
    finally:
        InterpretedFunction.run = original


def size_specializations(keys: dict[str, set]) -> dict[str, list[str]]:
    """Per kernel, the integer and tensor arguments whose specialization differs between launches with equal
    constexprs."""
    out = {}
    for kernel, launches in sorted(keys.items()):
        by_constexprs = collections.defaultdict(list)
        for key in launches:
            by_constexprs[tuple(k for k in key if k[1] == "const")].append({n: v for n, kind, v in key if kind != "const"})
        varying = {name for group in by_constexprs.values() if len(group) > 1
                   for name in group[0] if len({str(g.get(name)) for g in group}) > 1}
        if varying:
            out[kernel] = sorted(varying)
    return out
