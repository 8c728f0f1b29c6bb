"""Causal depthwise conv1d for decode: Tq new tokens per sequence against its conv state, updated in place.

``causal_conv1d_update(x, weight, bias, conv_state, slots, activation="silu") -> out``

* ``x``: ``[N * Tq, D]`` (token ``n * Tq + t`` is the t-th new token of sequence n; last dim contiguous);
* ``weight``: ``[D, W]``; ``bias``: ``[D]`` or None; ``conv_state``: the pool ``[slots, D, W - 1]`` (any
  strides), oldest input first; ``slots``: ``[N]``.

Each output is the conv1d of the window ending at that token (earlier inputs from the state), then SiLU
(``activation="silu"``) or nothing (None); the state then holds the last ``W - 1`` inputs.  A negative
slot is padding: zero outputs, state untouched.  CUDA-graph capturable.
"""

from atom_kernels.dispatch import register_op

causal_conv1d_update = register_op("causal_conv1d_update", __name__)
