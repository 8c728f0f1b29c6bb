import pytest

from atom_core import catalog
from atom_core.errors import UnsupportedArchitectureError


@pytest.mark.parametrize("arch", catalog.supported())
def test_entries_import_and_name_real_classes(arch):
    spec = catalog.get(arch)
    assert spec.model_class().__name__ == arch
    # transformers may spell the class with underscores the configs' architecture name lacks (Kimi_K25...)
    assert spec.hf_model_class().__name__.replace("_", "") == arch.replace("_", "")
    assert catalog.TEXT in spec.capabilities


def test_unknown_architecture():
    with pytest.raises(UnsupportedArchitectureError, match="supported:"):
        catalog.get("NopeForCausalLM")


def test_host_plan_names_what_each_unserved_architecture_lacks():
    """An adapter's extension table decides what it serves: an unknown capability and an unimplemented one
    are each named, with the first clause of what the latter needs."""
    from types import SimpleNamespace

    spec = catalog.ARCHITECTURES["Qwen3NextForCausalLM"]
    table = {cap: SimpleNamespace(implemented=True, needs="") for cap in spec.capabilities}
    assert catalog.unserved_reasons(spec, table, "atom-demo") == []
    some = sorted(spec.capabilities)
    table[some[0]] = SimpleNamespace(implemented=False, needs="SupportsThing: and the details")
    del table[some[-1]]
    reasons = catalog.unserved_reasons(spec, table, "atom-demo")
    assert reasons == [f"capability {some[0]!r} needs SupportsThing",
                       f"capability {some[-1]!r} is unknown to atom-demo (add it to atom_demo.capabilities)"]
    served, skipped = catalog.host_plan(table, "atom-demo")
    assert "Qwen3NextForCausalLM" in skipped and "Qwen3NextForCausalLM" not in served
    assert set(served) | set(skipped) == set(catalog.ARCHITECTURES)
