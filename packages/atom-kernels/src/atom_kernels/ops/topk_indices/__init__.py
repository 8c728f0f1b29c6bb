"""Top-k selection of DeepSeek sparse attention: the positions of each row's ``k`` largest scores.

``topk_indices(scores, k) -> indices``

* ``scores``: ``[T, N]`` fp32 (the indexer's scores; ``-inf`` marks positions a token may not select);
* returns ``[T, k]`` int32: the selected positions of each row in ascending order, then ``-1`` where the row has
  fewer than ``k`` finite scores.  Equal scores at the threshold go to the lowest positions, so the result is
  fully determined (the reference and the kernel agree exactly).
"""

from atom_kernels.dispatch import register_op

topk_indices = register_op("topk_indices", __name__, backends=("triton", "reference"))
