import pytest

from atom_core import catalog
from atom_core.errors import UnsupportedArchitectureError


@pytest.mark.parametrize("arch", catalog.supported())
def test_entries_import_and_name_real_classes(arch):
    spec = catalog.get(arch)
    assert spec.model_class().__name__ == arch
    assert spec.hf_model_class().__name__ == arch
    assert catalog.TEXT in spec.capabilities


def test_unknown_architecture():
    with pytest.raises(UnsupportedArchitectureError, match="supported:"):
        catalog.get("NopeForCausalLM")
