"""Lightning-indexer scores of DeepSeek sparse attention (DeepSeek-V3.2, GLM-5) over a paged indexer-key cache.

``indexer_scores(q, weights, k_cache, block_table, token_seq, token_pos, scale) -> scores``

* ``q``: ``[T, H, D]``, the indexer's queries of the step's tokens (rotated), any float dtype;
* ``weights``: ``[T, H]``, each token's per-head weights (the model's ``weights_proj`` output, already scaled);
* ``k_cache``: ``[num_blocks, block_size, D]``, one indexer key per cached token; token j of sequence b lives at
  ``k_cache[block_table[b, j // block_size], j % block_size]``;
* ``block_table``: ``[B, max_blocks]`` int32 (entries past what a token sees are never read; -1 allowed);
* ``token_seq``: ``[T]`` int32, the sequence of each token (negative: a padding token, its row all -inf);
* ``token_pos``: ``[T]`` int32, the token's position in its sequence: it sees positions ``0 .. token_pos``.

``scores[t, j] = Σ_h weights[t, h] · relu(scale · q[t, h] · k_j)`` for ``j <= token_pos[t]``, ``-inf`` for the rest
of the ``[T, max_blocks * block_size]`` fp32 output.  Math in fp32.
"""

from atom_kernels.dispatch import register_op

indexer_scores = register_op("indexer_scores", __name__, backends=("triton", "reference"))
