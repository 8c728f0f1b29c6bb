"""Gated DeltaNet decode: gating, q/k L2-norm, decay, delta update and output in one pass, the state
updated in place in a pool (see :mod:`atom_kernels.gdn` for the math and the state layouts).

``fused_recurrent_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, ssm_state, slots, *, scale=None,
state_layout="k_major", use_qk_l2norm=True, num_accepted_tokens=None, cu_seqlens=None) -> o``

* ``q``, ``k``: ``[N * Tq, H, K]``; ``v``: ``[N * Tq, HV, V]`` (HV a multiple of H); ``a``, ``b``:
  ``[N * Tq, HV]`` raw projections (gating is computed inside); ``A_log``, ``dt_bias``: ``[HV]``.
  Token ``n * Tq + t`` is the t-th new token of sequence n (``Tq = 1`` for plain decode, more for
  speculative decode). Only the last dim of q/k/v must be contiguous (views of a packed projection work).
* ``ssm_state``: the state pool, ``[slots, HV, K, V]`` (``k_major``) or ``[slots, HV, V, K]``
  (``v_major``), fp32 or bf16.
* ``slots``: ``[N]`` — the state is read from and written back to ``ssm_state[slots[n]]``; or ``[N, Tq]``
  — the state after token t is written to ``slots[n, t]`` (a negative entry skips that write) and the
  initial state is read from ``slots[n, num_accepted_tokens[n] - 1]`` (index 0 without
  ``num_accepted_tokens``), so a host can roll speculative tokens back.
* ``cu_seqlens`` ``[N + 1]`` (int32, from 0), optional: sequence n's tokens are rows ``[cu_seqlens[n],
  cu_seqlens[n + 1])`` instead (ragged speculative steps: a sequence may bring fewer than the most draft
  tokens, or none); ``slots [N, S]`` then needs S at least the longest length; rows past the last are zero.
* A negative read slot marks a padding sequence: its state is untouched and its outputs are zero.
* ``o``: ``[N * Tq, HV, V]`` in v's dtype.

CUDA-graph capturable (no host sync; fixed-size output).
"""

from atom_kernels.dispatch import register_op

fused_recurrent_gated_delta_rule = register_op("fused_recurrent_gated_delta_rule", __name__)
