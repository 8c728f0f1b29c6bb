"""Kernel benchmarks: ATOM's kernels side by side with their peers and the physical floor.

Run on a GPU machine: ``python -m atom_tools.kernels SUITE [SUITE ...] --out results.json``.
Each suite is a module in this package exposing ``run(ctx) -> list[dict]``: one row per
(case, implementation) with the time and the figures the floor is computed from.
"""
