"""``silu_and_mul(x)``: ``x = [gate | up]`` along the last dim, returns ``silu(gate) * up``."""

from atom_kernels.dispatch import register_op

silu_and_mul = register_op("silu_and_mul", __name__)
