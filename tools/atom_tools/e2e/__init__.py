"""End to end inside a host: :mod:`~atom_tools.e2e.driver` (shared), :mod:`~atom_tools.e2e.vllm`,
:mod:`~atom_tools.e2e.sglang`."""
