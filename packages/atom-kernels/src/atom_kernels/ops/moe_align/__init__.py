"""Token-expert pairs sorted by expert, each expert's run padded to the GEMM's row block.

``moe_align_block_size(topk_ids, num_experts, block_m, expert_map=None)
-> (sorted_pair_ids, block_experts, num_padded)``

* ``topk_ids``: ``[T, k]`` integer expert ids; pair ``p = t*k + j`` is token t's j-th choice;
* ``num_experts``: experts held here (local ids ``0 .. num_experts-1``);
* ``expert_map``: optional int ``[global experts]``: global id -> local id, or -1 for an expert held
  elsewhere (expert parallelism).  Pairs routed to such experts are left out.  Without a map the ids
  are already local.

Outputs have sizes fixed by ``(T*k, num_experts, block_m)`` only (CUDA-graph capturable, no host sync):
``max_blocks = cdiv(T*k, block_m) + min(num_experts, T*k)``;

* ``sorted_pair_ids`` int32 ``[max_blocks * block_m]``: expert 0's pairs in ascending order, padded
  with the sentinel ``T*k`` to a multiple of ``block_m``, then expert 1's, ...; experts without pairs
  take no room; every slot past the last expert's run holds the sentinel too;
* ``block_experts`` int32 ``[max_blocks]``: the local expert of each ``block_m`` rows, -1 past the end;
* ``num_padded`` int32 ``[1]``: rows in use (a multiple of ``block_m``).
"""

from atom_kernels.dispatch import register_op

moe_align_block_size = register_op("moe_align_block_size", __name__, backends=("triton", "reference"))


def max_blocks(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Upper bound of the row blocks in use: each expert with pairs wastes less than one block."""
    return -(-num_pairs // block_m) + min(num_experts, num_pairs)
