"""Gated DeltaNet prefill over packed variable-length sequences, chunked (see :mod:`atom_kernels.gdn`).

``chunk_gated_delta_rule(q, k, v, a, b, A_log, dt_bias, ssm_state, cu_seqlens, slots, has_initial_state=None,
*, scale=None, state_layout="k_major", use_qk_l2norm=True) -> o``

* ``q``, ``k``: ``[T, H, K]``; ``v``: ``[T, HV, V]`` (HV a multiple of H); ``a``, ``b``: ``[T, HV]`` raw
  projections (gating is computed inside); ``A_log``, ``dt_bias``: ``[HV]``.  Only the last dim of
  q/k/v must be contiguous.
* ``cu_seqlens``: ``[N + 1]`` token offsets of the N packed sequences; ``slots``: ``[N]`` their slots in
  the pool ``ssm_state`` (``[slots, HV, K, V]`` k_major or ``[slots, HV, V, K]`` v_major, fp32 or bf16).
* ``has_initial_state``: ``[N]`` bool — sequence n starts from ``ssm_state[slots[n]]``; otherwise (or when
  None) from zero.  Every sequence's final state is written to ``ssm_state[slots[n]]``.  A negative slot
  is padding: nothing is read or written for it.
* ``o``: ``[T, HV, V]`` in v's dtype; tokens past ``cu_seqlens[-1]`` get zeros.

The result equals the token-by-token recurrence (the reference).  The Triton kernels use chunks of 64
tokens in the WY representation: per chunk ``A = (I + tril₋₁(β K Kᵀ ⊙ exp(Gᵢ - Gⱼ)))⁻¹``,
``w = A (β ⊙ exp(G) ⊙ K)``, ``u = A (β ⊙ V)``; a sequential pass over chunks carries the state
(``v' = u - w h``, ``h = exp(G_last) h + Kᵀ (exp(G_last - G) ⊙ v')``) and the output is
``o = scale · [exp(G) ⊙ (Q h) + (Q Kᵀ ⊙ Γ ⊙ causal) v']``.  No host sync (the grid is sized by the
upper bound of the chunk count), so the call is CUDA-graph capturable.
"""

from atom_kernels.dispatch import register_op

chunk_gated_delta_rule = register_op("chunk_gated_delta_rule", __name__)
