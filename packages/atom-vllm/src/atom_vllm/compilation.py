"""vLLM compiles ATOM's model classes as it compiles its own.

vLLM compiles a model class that carries its ``@support_torch_compile`` decorator: Dynamo traces ``forward``
once with a symbolic token count, vLLM splits the graph at its attention ops, Inductor compiles the pieces,
and vLLM captures them in piecewise CUDA graphs (mixed prefill/decode batches) beside full-model CUDA graphs
(pure decode batches).  A class without it runs its forward eagerly outside those graphs.  ATOM's kernels
reach the traced graph as opaque ``torch.ops.atom`` custom ops (:mod:`atom_kernels.library`).

The decorator goes on the generated wrapper class itself (its ``forward`` is the model's forward), as vLLM's
Transformers backend does with the classes it wraps.  Text-only architectures get it.  Hybrid ones get it with
``ATOM_VLLM_COMPILE_HYBRID=1``: their GDN layers read vLLM's mamba metadata in Python, inside one opaque op per
layer at which vLLM splits the graph (:mod:`atom_vllm.hybrid`); compiled = eager tokens on the CPU, as close to
transformers float32 as eager on a GPU, but not faster in every measured run (docs/vllm.md), so by default they run
eagerly between full-model CUDA graphs.  Multimodal ones are left out
because their forward (deepstack inputs, MRoPE positions) has not been traced and checked yet.
"""

from __future__ import annotations

from atom_core import catalog
from atom_core.catalog import HYBRID, TEXT
from atom_core.env import env_flag

COMPILE_HYBRID_ENV = "ATOM_VLLM_COMPILE_HYBRID"

# The dims vLLM treats as the (symbolic) token count: positions is [T] or, with MRoPE, [3, T].
DYNAMIC_ARG_DIMS = {"input_ids": 0, "positions": -1, "intermediate_tensors": 0, "inputs_embeds": 0}


def compiles(spec: catalog.ArchSpec) -> bool:
    """Whether vLLM compiles the wrapper of ``spec``: text-only architectures, hybrid ones with
    ``ATOM_VLLM_COMPILE_HYBRID`` on (see the module docstring)."""
    if spec.capabilities == frozenset({TEXT, HYBRID}):
        return env_flag(COMPILE_HYBRID_ENV)
    return spec.capabilities == frozenset({TEXT})


def support_torch_compile(cls: type) -> type:
    """``cls`` decorated with vLLM's ``support_torch_compile`` (``vllm.compilation.decorators`` in every
    supported release); vLLM still decides per engine whether to compile (``-O0`` / ``enforce_eager``)."""
    from vllm.compilation.decorators import support_torch_compile as decorate

    return decorate(dynamic_arg_dims=DYNAMIC_ARG_DIMS)(cls)
