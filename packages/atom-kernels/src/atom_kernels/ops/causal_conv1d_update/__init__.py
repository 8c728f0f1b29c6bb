"""Causal depthwise conv1d for decode: new tokens per sequence against its conv state, updated in place.

``causal_conv1d_update(x, weight, bias, conv_state, slots, activation="silu", *, num_accepted_tokens=None,
cu_seqlens=None) -> out``

* ``x``: ``[T, D]`` (last dim contiguous): token ``n * Tq + t`` is the t-th new token of sequence n
  (``Tq = T / N``), or, with ``cu_seqlens`` ``[N + 1]`` (int32, from 0), sequence n's tokens are rows
  ``[cu_seqlens[n], cu_seqlens[n + 1])`` (outputs of rows past the last are zero);
* ``weight``: ``[D, W]``; ``bias``: ``[D]`` or None; ``slots``: ``[N]``; ``conv_state``: the pool
  ``[slots, D, W - 1]`` (any strides), oldest input first.

Each output is the conv1d of the window ending at that token (earlier inputs from the state), then SiLU
(``activation="silu"``) or nothing (None); the state then holds the last ``W - 1`` inputs.  A negative
slot is padding: zero outputs, state untouched.  CUDA-graph capturable.

**Speculative decode** (``num_accepted_tokens`` ``[N]`` given; vLLM's rolling conv buffer): ``conv_state`` is
``[slots, D, W - 2 + Tq_max]`` (``Tq_max`` the most new tokens a sequence may bring: 1 + the draft tokens).  The
inputs before sequence n's first new token are its columns ``[a - 1, a - 1 + W - 1)``, ``a =
num_accepted_tokens[n]`` (the previous step's tokens that were accepted); afterwards columns
``[0, W - 2 + len)`` hold that window's inputs but the oldest, then the new tokens, so the next step finds its
window at its own accepted offset.  After a plain step (prefill, decode without drafts) the state is in columns
``[0, W - 1)`` and the next step's ``num_accepted_tokens`` is 1.
"""

from atom_kernels.dispatch import register_op

causal_conv1d_update = register_op("causal_conv1d_update", __name__)
