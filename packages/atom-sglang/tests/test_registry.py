"""With ATOM's classes forced, SGLang resolves every catalog architecture atom-sglang serves to ATOM's class; one
it cannot serve (none today: every capability the catalog uses is implemented) to SGLang's own where the release has one, else to
the class that refuses it with an error (atom_sglang.wrapper.leave_unserved).

The checks run in one fresh interpreter with SGLANG_EXTERNAL_MODEL_PACKAGE set, because SGLang reads
the variable once, when ``sglang.srt.models.registry`` is first imported.  The module of each resolved
class is asserted: an architecture missing from the registry falls back silently to SGLang's
Transformers backend (or, without the variable, to SGLang's own class of the same name)."""

from __future__ import annotations

import json

import pytest
from _sglang_env import PACKAGE, run_fresh

from atom_core import catalog
from atom_sglang import capabilities, compat, drafts

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
    out["registry"][arch] = [cls.__module__, cls.__name__, resolved, getattr(cls, "atom_refusal", None)]
from sglang.srt.configs.hybrid_arch import hybrid_gdn_config
out["kind"] = {}
for arch, path in checkpoints.items():
    model_config = ModelConfig(model_path=path)
    cls, resolved = get_model_architecture(model_config)
    bases = [b.__module__ + "." + b.__name__ for b in cls.__mro__[1:] if b.__module__.startswith("atom_")]
    out["model_config"][arch] = [cls.__module__, cls.__name__, resolved, bases]
    out["kind"][arch] = {"hybrid-linear-attention": hybrid_gdn_config(model_config) is not None,
                         "multimodal": bool(model_config.is_multimodal), "mrope": bool(model_config.model_is_mrope),
                         "latent-attention": model_config.attention_arch.name == "MLA"}
out["strict"] = {name: cls.__module__ for name, cls in import_model_classes(package, strict=True).items()}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def resolution(tiny_checkpoints):
    return run_fresh(SCRIPT % json.dumps([sorted(catalog.ARCHITECTURES), tiny_checkpoints, PACKAGE]))


def sglangs_own_serve() -> set[str]:
    """The catalog architectures atom-sglang cannot serve that stay SGLang's own when ATOM_TAKE_OVER=all."""
    _, skipped = capabilities.plan()
    return set(skipped) & compat.own_architectures()


def test_registry_resolves_every_catalog_architecture_to_atom(resolution):
    """Served architectures to their wrapper; the others to SGLang's own class where it has one, else to the class
    refusing them."""
    _, skipped = capabilities.plan()
    assert set(resolution["registry"]) == set(catalog.ARCHITECTURES)
    for arch, (module, name, as_arch, refusal) in resolution["registry"].items():
        if arch in sglangs_own_serve():
            assert module.startswith("sglang.srt.models."), f"{arch} resolved to {module}.{name}, not SGLang's own"
            continue
        assert module == "atom_sglang.models.catalog", f"{arch} resolved to {module}.{name}, not ATOM's class"
        assert (name, as_arch) == (arch, arch)
        assert refusal == skipped.get(arch), (arch, refusal)


def test_model_config_path_resolves_to_atom(resolution, tiny_checkpoints):
    """The path SGLang's model loader takes: ModelConfig of a checkpoint -> get_model_architecture."""
    assert set(resolution["model_config"]) == set(tiny_checkpoints)
    for arch, (module, name, as_arch, bases) in resolution["model_config"].items():
        assert (module, name, as_arch) == ("atom_sglang.models.catalog", arch, arch), resolution["model_config"][arch]
        mixins = [m.__module__ + "." + m.__name__ for m in capabilities.mixins(catalog.get(arch))]
        if arch in drafts.eagle3_targets():  # what SGLang's model runner asks of an EAGLE-3 target
            mixins.append("atom_sglang.drafts.Eagle3Target")
        assert bases[: len(mixins) + 1] == [*mixins, "atom_sglang.wrapper.SGLangCausalLM"], bases
        assert bases[len(mixins) + 1].startswith("atom_core.models."), bases


def test_sglang_sees_each_architectures_kind(resolution):
    """What SGLang decides from the config alone matches the catalog: a hybrid GDN model (state pool, hybrid
    backend), a multimodal model (processor, mm inputs), MRoPE positions, latent attention (its MLA KV pool)."""
    for arch, kind in resolution["kind"].items():
        caps = catalog.get(arch).capabilities
        assert kind == {name: name in caps for name in kind}, (arch, kind)


def test_strict_import_of_the_package(resolution):
    """SGLang imports external packages non-strictly (errors are only logged); strict must pass too."""
    exported = [a for a in catalog.ARCHITECTURES if a not in sglangs_own_serve()]
    exported += drafts.SGLANG_NAMES.values()  # ATOM's drafts, beside its targets (all served here)
    assert resolution["strict"] == dict.fromkeys(exported, "atom_sglang.models.catalog")


DEFAULT = """
import json
from sglang.srt.server_args import ServerArgs
from sglang.srt.utils import configure_logger
configure_logger(ServerArgs(model_path="dummy"))  # SGLang's own logging set-up, as each of its processes does first
from sglang.srt.models.registry import ModelRegistry, import_model_classes

archs, package = json.loads(%r)
out = {"registry": {arch: ModelRegistry.resolve_model_cls([arch])[0].__module__ for arch in archs},
       "package": sorted(import_model_classes(package, strict=True))}
print(json.dumps(out))
"""


def test_do_no_harm_by_default():
    """Without ATOM_TAKE_OVER, on a platform where ATOM has no measured fast path (this CPU), the package exports no
    class for an architecture SGLang has (those it has none of are ATOM's whatever the switch), so SGLang resolves
    each to its own, and SGLang's log (its own logging set-up) names them and why; ATOM_TAKE_OVER=Arch forces one."""
    archs = sorted(catalog.ARCHITECTURES)
    stderr: list[str] = []
    default = run_fresh(DEFAULT % json.dumps([archs, PACKAGE]), env={"ATOM_TAKE_OVER": None}, stderr=stderr)
    own = [a for a in catalog.ARCHITECTURES if a in compat.own_architectures()]
    assert default["package"] == sorted(set(archs) - set(own))  # none of SGLang's: ATOM's whatever the switch
    for arch in own:
        assert default["registry"][arch].startswith("sglang.srt.models."), f"{arch} resolved to " \
            f"{default['registry'][arch]} without ATOM_TAKE_OVER"
    (line,) = [x for x in stderr[0].splitlines() if "atom-sglang: SGLang's own classes serve, in SGLang on CPU:" in x]
    assert line.startswith("[") and ", ".join(own) in line and "ATOM_TAKE_OVER=all" in line, line

    forced = run_fresh(DEFAULT % json.dumps([archs, PACKAGE]), env={"ATOM_TAKE_OVER": "Qwen3ForCausalLM"})
    # with ATOM's Qwen3 target comes ATOM's EAGLE-3 draft (atom_sglang.drafts)
    assert forced["package"] == sorted({"Qwen3ForCausalLM", "LlamaForCausalLMEagle3", *set(archs) - set(own)})
    assert forced["registry"]["Qwen3ForCausalLM"] == "atom_sglang.models.catalog"
    assert all(m.startswith("sglang.srt.models.") for a, m in forced["registry"].items() if a in own and a != "Qwen3ForCausalLM")
