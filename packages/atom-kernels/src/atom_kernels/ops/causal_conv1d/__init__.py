"""Causal depthwise conv1d over packed sequences (the prefill of GDN's short convolution), saving each
sequence's last ``width - 1`` inputs as its conv state.

``causal_conv1d(x, weight, bias, conv_state, cu_seqlens, slots, has_initial_state=None, activation="silu") -> out``

* ``x``: ``[T, D]`` packed tokens (last dim contiguous); ``weight``: ``[D, W]``; ``bias``: ``[D]`` or None;
* ``conv_state``: the pool ``[slots, D, W - 1]`` (any strides), oldest input first;
* ``cu_seqlens``: ``[N + 1]`` token offsets of the N sequences; ``slots``: ``[N]`` their pool slots;
* ``has_initial_state``: ``[N]`` bool — sequence n continues from ``conv_state[slots[n]]`` (its inputs
  before the first token); otherwise (or when None) those inputs are zero.

``out[t, d] = act(bias[d] + sum_w weight[d, w] * x[t - (W - 1) + w, d])`` within each sequence, with
``act`` SiLU (``activation="silu"``) or the identity (None).  Afterwards ``conv_state[slots[n]]`` holds the
last ``W - 1`` inputs of sequence n (reaching into its initial state when it is shorter than that).
A negative slot is padding: no state is read or written for it.  Tokens past ``cu_seqlens[-1]`` get zeros.
"""

from atom_kernels.dispatch import register_op

causal_conv1d = register_op("causal_conv1d", __name__)
