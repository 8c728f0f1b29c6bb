"""The one place atom-sglang meets SGLang's code: which versions it accepts, every SGLang symbol it
calls (with the parameters it relies on), and the version differences among them.

Importing this module does not import SGLang; each accessor imports what it needs when called.

Versions: ``_pins.SUPPORTED`` (generated from ci/pins.toml) is what the plugin accepts; CI runs the
``_pins.TESTED`` releases.  Inside that range (0.5.21-0.5.23) none of the symbols in :data:`CONTRACT`
changed, so no accessor branches today.  The breaks SGLang made around it, and why they do not reach
this adapter (a new floor or ceiling must revisit them):

* 0.5.13  ``ForwardBatch.attn_backend`` / ``token_to_kv_pool`` removed (forward-context getters).
          Not used: :class:`RadixAttention` finds the backend and KV pool itself.
* 0.5.14  ``sglang.srt.runtime_context`` (``get_parallel()``) appears; :func:`parallel` needs it.
* 0.5.16  ``get_attention_tp_*`` removed; FLA kernels moved to ``sglang.kernels.ops``;
          ``hybrid_gdn_config`` moved to ``configs/hybrid_arch.py``.  Not used (ATOM ships its own GDN
          kernels; hybrid support will read the state through the linear-attention backend).
* 0.5.17  ``RadixAttention.forward(key_value_num_tokens=)``.  We pass ``q, k, v, forward_batch``
          positionally and nothing else (``sinks=`` by keyword when a model has sinks).
* 0.5.22  Python >= 3.11; SGLang's linear layers take keyword-only ``parallel_group``; ``TopK(layer_id=)``
          required.  Not used: ATOM builds its own linear and MoE layers.
* 0.5.23  ``TopK`` drops ``num_fused_shared_experts``.  Not used (as above).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from atom_sglang import _pins

logger = logging.getLogger(__name__)

SUPPORTED = SpecifierSet(_pins.SUPPORTED)
TESTED: tuple[str, ...] = _pins.TESTED
# First releases with a feature atom-sglang uses.
EXTERNAL_MODEL_PACKAGE_SINCE = Version("0.5.6")  # SGLANG_EXTERNAL_MODEL_PACKAGE
PLUGINS_SINCE = Version("0.5.11")  # the sglang.srt.plugins entry-point group
LINEAR_ATTN_REGISTRY_SINCE = Version("0.5.11")  # register_linear_attn_model


class UnsupportedSGLangVersion(RuntimeError):
    pass


def installed_version() -> Version | None:
    """The installed SGLang release (from its distribution metadata; SGLang itself is not imported)."""
    try:
        return Version(importlib.metadata.version("sglang"))
    except importlib.metadata.PackageNotFoundError:
        return None


def unsupported_reason(version: Version | str | None) -> str | None:
    """Why atom-sglang cannot run inside SGLang ``version`` (None when it can)."""
    if version is None:
        return "SGLang is not installed"
    version = Version(str(version))
    if SUPPORTED.contains(version, prereleases=True):
        return None
    return (
        f"atom-sglang supports SGLang {_pins.SUPPORTED} (tested: {', '.join(TESTED)}), but SGLang {version} is installed; "
        f"install a supported SGLang (pip install 'sglang{_pins.SUPPORTED}') or an atom-sglang release made for {version}"
    )


def check_version(version: Version | str | None = None) -> Version:
    """The installed (or given) version, or :class:`UnsupportedSGLangVersion` naming the supported range."""
    version = installed_version() if version is None else Version(str(version))
    reason = unsupported_reason(version)
    if reason is not None:
        raise UnsupportedSGLangVersion(reason)
    return version


# ----------------------------------------------------------------------------------------- contract
@dataclass(frozen=True)
class Symbol:
    """One SGLang symbol the adapter uses and the parameters (or fields) it relies on, in call order."""

    path: str  # "module:qualified.name"
    params: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()  # attributes read from instances (dataclass fields or annotations)
    used_by: str = ""

    def resolve(self) -> Any:
        module, _, qualname = self.path.partition(":")
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj

    def owner(self) -> type:
        """The class whose instances carry :attr:`fields` (the symbol itself, or the class of a method)."""
        obj = self.resolve()
        if isinstance(obj, type):
            return obj
        module, _, qualname = self.path.partition(":")
        return Symbol(f"{module}:{qualname.rsplit('.', 1)[0]}").resolve()


CONTRACT: tuple[Symbol, ...] = (
    Symbol("sglang.srt.layers.radix_attention:RadixAttention.__init__",
           ("self", "num_heads", "head_dim", "scaling", "num_kv_heads", "layer_id", "sliding_window_size",
            "quant_config", "prefix"), used_by="host.SGLangHost.attention"),
    Symbol("sglang.srt.layers.radix_attention:RadixAttention.forward",
           ("self", "q", "k", "v", "forward_batch"), used_by="host.SGLangAttention.forward"),
    Symbol("sglang.srt.layers.logits_processor:LogitsProcessor.__init__", ("self", "config"),
           used_by="wrapper.SGLangCausalLM.__init__"),
    Symbol("sglang.srt.layers.logits_processor:LogitsProcessor.forward",
           ("self", "input_ids", "hidden_states", "lm_head", "logits_metadata"), used_by="wrapper.SGLangCausalLM.forward"),
    Symbol("sglang.srt.layers.logits_processor:LogitsProcessorOutput", fields=("next_token_logits",),
           used_by="wrapper.SGLangCausalLM.forward (return type)"),
    Symbol("sglang.srt.model_executor.forward_batch_info:ForwardBatch",
           fields=("forward_mode", "positions", "mrope_positions", "input_embeds"), used_by="wrapper, host"),
    Symbol("sglang.srt.runtime_context:get_parallel", (), used_by="compat.parallel"),
    Symbol("sglang.srt.distributed.parallel_state:GroupCoordinator.all_reduce", ("self", "input_"),
           fields=("rank_in_group", "world_size"), used_by="host.SGLangTP"),
    Symbol("sglang.srt.distributed.parallel_state:GroupCoordinator.all_gather", ("self", "input_", "dim"),
           used_by="host.SGLangTP"),
    Symbol("sglang.srt.models.registry:import_model_classes", ("package_name", "strict"),
           used_by="SGLANG_EXTERNAL_MODEL_PACKAGE=atom_sglang.models"),
    Symbol("sglang.srt.configs.linear_attn_model_registry:register_linear_attn_model", ("spec",),
           used_by="plugin (hybrid linear attention; no catalog entry needs it yet)"),
    Symbol("sglang.srt.configs.linear_attn_model_registry:LinearAttnModelSpec",
           fields=("config_class", "backend_class_name", "arch_names"), used_by="plugin"),
)

# What the parallel context must report for ATOM's layers to shard correctly.
PARALLEL_FIELDS = ("tp_size", "tp_group", "pp_size", "attn_tp_size")


# ---------------------------------------------------------------------------------------- accessors
def radix_attention_class() -> type:
    from sglang.srt.layers.radix_attention import RadixAttention

    return RadixAttention


def logits_processor_class() -> type:
    from sglang.srt.layers.logits_processor import LogitsProcessor

    return LogitsProcessor


def parallel() -> Any:
    """SGLang's parallel context (0.5.14+: ``runtime_context.get_parallel()``)."""
    from sglang.srt.runtime_context import get_parallel

    return get_parallel()


def tp_group() -> Any:
    """The tensor-parallel ``GroupCoordinator`` the model's layers shard over."""
    return parallel().tp_group


def unsupported_parallelism() -> str | None:
    """Why the running SGLang's parallel layout cannot host an ATOM model (None when it can).

    ATOM's models hold every layer (no pipeline stages) and split attention heads over the whole
    tensor-parallel group, so attention data/context parallelism would shard them differently."""
    par = parallel()
    if par.pp_size > 1:
        return f"pipeline parallelism (pp_size={par.pp_size}) is not supported by ATOM models"
    if par.attn_tp_size != par.tp_size:
        return (
            f"attention data/context parallelism (attention TP {par.attn_tp_size} != TP {par.tp_size}, e.g. "
            "--enable-dp-attention) is not supported by ATOM models"
        )
    return None


def register_linear_attn_model(config_class: type, backend_class_name: str, arch_names: list[str], **options: Any) -> None:
    """Declare a hybrid (softmax + linear attention) architecture to SGLang (0.5.11+)."""
    from sglang.srt.configs.linear_attn_model_registry import LinearAttnModelSpec, register_linear_attn_model

    register_linear_attn_model(
        LinearAttnModelSpec(config_class=config_class, backend_class_name=backend_class_name, arch_names=arch_names,
                            **options)
    )
