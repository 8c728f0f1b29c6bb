"""Mixture-of-experts routing: which ``top_k`` experts each token goes to, and with what weight.

``topk_routing(router_logits, top_k, *, scoring="softmax", renormalize=True, correction_bias=None,
n_group=1, topk_group=1, routed_scaling_factor=1.0) -> (topk_weights, topk_ids)``

* ``router_logits``: ``[T, E]`` (any float dtype; the math is fp32);
* returns ``topk_weights`` fp32 ``[T, top_k]`` and ``topk_ids`` int32 ``[T, top_k]``.  The order of the
  ``top_k`` columns is not part of the contract (the MoE output is a sum over them).

``scoring="softmax"`` (Mixtral, Qwen2-MoE, Qwen3-MoE, Qwen3-Next): ``p = softmax(logits)``; the
``top_k`` largest ``p`` are chosen; with ``renormalize`` the chosen ``p`` are divided by their sum.

``scoring="sigmoid"`` (DeepSeek-V3, GLM-4.5): ``s = sigmoid(logits)``; experts are *chosen* by
``c = s + correction_bias`` (the bias only steers the choice) and *weighted* by ``s``.  With
``n_group > 1`` the E experts form ``n_group`` equal groups, each group scores the sum of its two
largest ``c``, and only the ``topk_group`` best groups are eligible.  With ``renormalize`` the chosen
``s`` are divided by ``sum + 1e-20``.

Both: the weights are finally multiplied by ``routed_scaling_factor``.  This is transformers'
``Qwen3MoeTopKRouter`` / ``MixtralTopKRouter`` / ``Qwen2MoeTopKRouter`` (softmax) and
``DeepseekV3TopkRouter`` / ``Glm4MoeTopkRouter`` (sigmoid) after their router linear layer.
"""

from atom_kernels.dispatch import register_op

topk_routing = register_op("topk_routing", __name__)
