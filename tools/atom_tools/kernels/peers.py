"""Peers: other projects' kernels a suite times beside ATOM's.

atom-kernels imports no serving framework, so the host frameworks' kernels come from modules the adapters ship
(``atom_tools.kernel_peers_vllm``), named on the command line: ``python -m atom_tools.kernels --peers
atom_tools.kernel_peers_vllm attention``.  Such a module has ``PEERS: {suite: {peer name: maker}}``; what a maker takes
and returns is the suite's own contract (its docstring says).  The module names travel in the run's context
(``ctx["peers"]``) so the JSON records which peers were offered.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def for_suite(ctx: dict, suite: str) -> dict[str, Callable]:
    """Every maker the ``ctx["peers"]`` modules offer for ``suite``, in the order the modules are named."""
    makers: dict[str, Callable] = {}
    for module_name in ctx.get("peers", ()):
        offered = getattr(importlib.import_module(module_name), "PEERS", None)
        if not isinstance(offered, dict):
            raise TypeError(f"peer module {module_name} has no PEERS dict (suite -> {{name: maker}})")
        makers.update(offered.get(suite, {}))
    return makers
