"""ATOM's tools, apart from the four library distributions: kernel suites (:mod:`atom_tools.kernels`), the native
bench (:mod:`atom_tools.native`), the end-to-end benches inside a host (:mod:`atom_tools.e2e`), vLLM's kernels as
peers (:mod:`atom_tools.kernel_peers_vllm`), the accuracy gate (:mod:`atom_tools.accuracy`) and the random
real-shape checkpoints they load (:mod:`atom_tools.checkpoints`).  Library code never imports this package."""
