"""SGLang resolves every catalog architecture atom-sglang serves to ATOM's class.

The checks run in one fresh interpreter with SGLANG_EXTERNAL_MODEL_PACKAGE set, because SGLang reads
the variable once, when ``sglang.srt.models.registry`` is first imported.  The module of each resolved
class is asserted: an architecture missing from the registry falls back silently to SGLang's
Transformers backend (or, without the variable, to SGLang's own class of the same name)."""

from __future__ import annotations

import json

import pytest
from _sglang_env import PACKAGE, run_fresh

from atom_sglang import capabilities

pytestmark = pytest.mark.sglang

SCRIPT = """
import json
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.model_loader.utils import get_model_architecture
from sglang.srt.models.registry import ModelRegistry, import_model_classes

archs, checkpoints, package = json.loads(%r)
out = {"registry": {}, "model_config": {}}
for arch in archs:
    cls, resolved = ModelRegistry.resolve_model_cls([arch])
    out["registry"][arch] = [cls.__module__, cls.__name__, resolved]
for arch, path in checkpoints.items():
    cls, resolved = get_model_architecture(ModelConfig(model_path=path))
    bases = [b.__module__ + "." + b.__name__ for b in cls.__mro__[1:3]]
    out["model_config"][arch] = [cls.__module__, cls.__name__, resolved, bases]
out["strict"] = {name: cls.__module__ for name, cls in import_model_classes(package, strict=True).items()}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def resolution(tiny_checkpoints):
    served, _ = capabilities.plan()
    return run_fresh(SCRIPT % json.dumps([served, tiny_checkpoints, PACKAGE]))


def test_registry_resolves_every_served_architecture_to_atom(resolution):
    served, _ = capabilities.plan()
    assert set(resolution["registry"]) == set(served)
    for arch, (module, name, as_arch) in resolution["registry"].items():
        assert module == "atom_sglang.models.catalog", f"{arch} resolved to {module}.{name}, not ATOM's class"
        assert (name, as_arch) == (arch, arch)


def test_model_config_path_resolves_to_atom(resolution, tiny_checkpoints):
    """The path SGLang's model loader takes: ModelConfig of a checkpoint -> get_model_architecture."""
    assert set(resolution["model_config"]) == set(tiny_checkpoints)
    for arch, (module, name, as_arch, bases) in resolution["model_config"].items():
        assert (module, name, as_arch) == ("atom_sglang.models.catalog", arch, arch), resolution["model_config"][arch]
        assert bases[0] == "atom_sglang.wrapper.SGLangCausalLM"
        assert bases[1].startswith("atom_core.models."), bases


def test_strict_import_of_the_package(resolution):
    """SGLang imports external packages non-strictly (errors are only logged); strict must pass too."""
    served, _ = capabilities.plan()
    assert resolution["strict"] == dict.fromkeys(served, "atom_sglang.models.catalog")
