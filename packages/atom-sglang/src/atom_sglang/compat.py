"""The one place atom-sglang meets SGLang's code: which versions it accepts, every SGLang symbol it
calls (with the parameters it relies on), and the version differences among them.

Importing this module does not import SGLang; each accessor imports what it needs when called.

Versions: ``_pins.SUPPORTED`` (generated from ci/pins.toml) is what the plugin accepts; CI runs the
``_pins.TESTED`` releases; ``_pins.RELEASES`` lists every release of the range (each checked at least by
test_contract).  Where releases of the range spell one thing differently, the difference is data, in one
mechanism: a :class:`ByRelease` table maps SGLang release ranges to the implementation for them (its ranges
must cover every release in ``_pins.RELEASES`` exactly once, checked when the table is built), and each
:class:`Symbol` of :data:`CONTRACT` names the ``releases`` that have it (test_contract checks a symbol on
those).  No code asks which SGLang it runs in; the tables answer.  The differences inside the range:

* 0.5.18  ``init_mm_embedding_cache`` moves from ``managers/mm_utils`` to ``managers/mm_schedule``;
          ``get_mm_processor_cls`` appears (0.5.17: only ``get_mm_processor``, which builds the processor);
          ``resolve_linear_attn_backends`` / ``ModelRunner.linear_attn_backends`` appear.  Test harness only.
* 0.5.20  "the mamba radix cache keeps an extra state buffer" moves from the method
          ``ServerArgs.enable_mamba_extra_buffer()`` to the published leaf
          ``get_exec().mamba.enable_mamba_extra_buffer``: :data:`MAMBA_EXTRA_BUFFER`.
          ``get_mm_processor_cls`` drops its ``server_args`` parameter (reads the published model bag).
* 0.5.21  ``runtime_context.publish(ranks=SpawnRanks(...))``: launcher placement handed over at publish (before:
          read lazily from the process groups).  Test harness only.
* 0.5.22  Python >= 3.11; SGLang's linear layers take keyword-only ``parallel_group``; ``TopK(layer_id=)``
          required.  Not used: ATOM builds its own linear and MoE layers.
* 0.5.23  ``TopK`` drops ``num_fused_shared_experts``.  Not used (as above).
          ``pad_mm_tokens`` replaces ``MultiModalityDataPaddingPatternMultimodalTokens`` (kept as a
          forwarding shim): :data:`PAD_MULTIMODAL_TOKENS`.
          ``ForwardBatch.logical_forward_mode`` (0.5.22/0.5.23: a decode batch relabelled as a one-token
          extend for data-parallel attention).  Not read: data-parallel attention is refused, so the two
          modes agree.
          ``KVWriteLoc.for_batch`` (the pool's write location of a batch).  Not used: latent attention
          hands the cache row to ``RadixAttention`` and the backend writes SGLang's pool.

The breaks SGLang made below the range, and why they do not reach this adapter (a lower floor must revisit
them):

* 0.5.13  ``ForwardBatch.attn_backend`` / ``token_to_kv_pool`` removed (forward-context getters).
          Not used: :class:`RadixAttention` finds the backend and KV pool itself.
* 0.5.14  ``sglang.srt.runtime_context`` (``get_parallel()``) appears; :func:`parallel` needs it.
* 0.5.16  ``get_attention_tp_*`` removed; FLA kernels moved to ``sglang.kernels.ops``;
          ``hybrid_gdn_config`` moved to ``configs/hybrid_arch.py``.  Not used (ATOM ships its own GDN
          kernels and reads the state through the hybrid backend's metadata, :func:`linear_attention_backend`).
* 0.5.17  ``RadixAttention.forward(key_value_num_tokens=)``.  We pass ``q, k, v, forward_batch``
          positionally and nothing else (``sinks=`` by keyword when a model has sinks).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import logging
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from atom_sglang import _pins

logger = logging.getLogger(__name__)

SUPPORTED = SpecifierSet(_pins.SUPPORTED)
TESTED: tuple[str, ...] = _pins.TESTED
RELEASES: tuple[str, ...] = _pins.RELEASES
T = TypeVar("T")


class UnsupportedSGLangVersion(RuntimeError):
    pass


def platform() -> str:
    """The platform as atom_core.takeover names it, decided as SGLang decides it in each of its processes
    (``sglang.srt.utils.is_hip`` / ``is_cuda``: torch's build and ``torch.cuda.is_available()``): ``rocm``, ``cuda``,
    else ``cpu``."""
    import torch

    if torch.version.hip is not None:
        return "rocm"
    return "cuda" if torch.version.cuda is not None and torch.cuda.is_available() else "cpu"


@functools.lru_cache(maxsize=1)
def own_architectures() -> frozenset[str]:
    """The model classes SGLang ships (``class Name`` at the top level of ``sglang/srt/models/*.py``), read as text:
    importing those modules is what SGLang defers (0.5.21+), and its registry is what is importing this package
    (every catalog architecture is among them in 0.5.17 - 0.5.23)."""
    import importlib.util
    import re
    from pathlib import Path

    try:
        spec = importlib.util.find_spec("sglang.srt.models")
    except ModuleNotFoundError:  # no SGLang: no class of its own
        spec = None
    names: set[str] = set()
    for directory in (spec.submodule_search_locations or ()) if spec else ():
        for path in Path(directory).glob("*.py"):
            names.update(re.findall(r"^class (\w+)\b", path.read_text(errors="replace"), re.MULTILINE))
    return frozenset(names)


@functools.lru_cache(maxsize=1)
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


# ---------------------------------------------------------------------------- differences by release
class ByRelease(Generic[T]):
    """One thing the releases of the supported range spell differently: ``{release range: what serves it}``.

    The ranges are PEP 440 specifiers (``"<0.5.20"``, ``">=0.5.20"``); together they must match every release
    in ``_pins.RELEASES`` exactly once, which is checked here, when the table is built (at import).  :meth:`get`
    answers for the installed SGLang (and refuses one outside the supported range)."""

    def __init__(self, what: str, variants: dict[str, T]):
        self.what = what
        self.variants = {SpecifierSet(spec): value for spec, value in variants.items()}
        for release in RELEASES:
            matched = [str(spec) for spec in self.variants if spec.contains(release, prereleases=True)]
            if len(matched) != 1:
                raise AssertionError(f"{what}: SGLang {release} (in _pins.RELEASES) matches {matched}, not one range")

    def get(self, version: Version | str | None = None) -> T:
        version = check_version(version)
        (value,) = [value for spec, value in self.variants.items() if spec.contains(version, prereleases=True)]
        return value


# ----------------------------------------------------------------------------------------- contract
@dataclass(frozen=True)
class Symbol:
    """One SGLang symbol the adapter uses and the parameters (or fields) it relies on, in call order: every
    parameter without a default is among them (the adapter passes them all)."""

    path: str  # "module:qualified.name"
    params: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()  # attributes read from instances (dataclass fields or annotations)
    used_by: str = ""
    releases: str = ""  # the supported releases that have it as described (a PEP 440 specifier); "": all of them

    def present_in(self, version: Version | str | None = None) -> bool:
        """Whether SGLang ``version`` (default: the installed one) has this symbol as described."""
        version = installed_version() if version is None else Version(str(version))
        return version is not None and SpecifierSet(self.releases).contains(version, prereleases=True)

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
           used_by="compat.register_linear_attn_model (hybrid configs SGLang does not know by class)"),
    Symbol("sglang.srt.configs.linear_attn_model_registry:LinearAttnModelSpec",
           fields=("config_class", "backend_class_name", "arch_names"), used_by="compat.register_linear_attn_model"),
    # hybrid linear attention (linear_attention.py)
    Symbol("sglang.srt.model_executor.forward_context:get_attn_backend", (), used_by="compat.attention_backend"),
    Symbol("sglang.srt.layers.attention.hybrid_linear_attn_backend:HybridLinearAttnBackend.__init__",
           ("self", "full_attn_backend", "linear_attn_backend", "full_attn_layers"),
           used_by="compat.linear_attention_backend (its linear_attn_backend attribute; exercised by test_hybrid)"),
    Symbol("sglang.srt.layers.attention.hybrid_linear_attn_backend:MambaAttnBackendBase.init_forward_metadata",
           ("self", "forward_batch"),
           used_by="linear_attention.SGLangLinearAttentionState.step (forward_metadata, req_to_token_pool)"),
    Symbol("sglang.srt.layers.attention.mamba.mamba2_metadata:ForwardMetadata",
           fields=("query_start_loc", "mamba_cache_indices"), used_by="linear_attention.SGLangLinearAttentionState.step"),
    Symbol("sglang.srt.mem_cache.memory_pool:HybridReqToTokenPool.mamba2_layer_cache", ("self", "layer_id"),
           used_by="linear_attention.SGLangLinearAttentionState.step"),
    Symbol("sglang.srt.mem_cache.memory_pool:MambaPool.State", fields=("conv", "temporal"),
           used_by="linear_attention.SGLangLinearAttentionState.step"),
    Symbol("sglang.srt.configs.qwen3_next:Qwen3NextConfig", fields=("mamba2_cache_params",),
           used_by="linear_attention.check_state_plan"),
    Symbol("sglang.srt.configs.mamba_utils:Mamba2StateShape", fields=("conv", "temporal"),
           used_by="linear_attention.check_state_plan"),
    Symbol("sglang.srt.model_executor.forward_batch_info:ForwardBatch",
           fields=("extend_num_tokens", "extend_prefix_lens", "mm_inputs"), used_by="linear_attention, multimodal"),
    # multimodal (multimodal.py)
    Symbol("sglang.srt.managers.mm_utils:general_mm_embed_routine",
           ("input_ids", "forward_batch", "language_model", "multimodal_model", "data_embedding_funcs",
            "placeholder_tokens", "use_deepstack"), used_by="multimodal.SGLangMultimodal._run_model"),
    Symbol("sglang.srt.managers.mm_utils:MultiModalityDataPaddingPatternMultimodalTokens.pad_input_tokens",
           ("self", "input_ids", "mm_inputs"), used_by="compat.PAD_MULTIMODAL_TOKENS", releases="<0.5.23"),
    Symbol("sglang.srt.managers.mm_utils:pad_mm_tokens", ("input_ids", "mm_inputs"),
           used_by="compat.PAD_MULTIMODAL_TOKENS", releases=">=0.5.23"),
    Symbol("sglang.srt.managers.schedule_batch:MultimodalDataItem", fields=("feature", "offsets", "model_specific_data"),
           used_by="multimodal.SGLangMultimodal.get_image_feature (image_grid_thw from model_specific_data)"),
    Symbol("sglang.srt.managers.schedule_batch:MultimodalDataItem.reconstruct", ("self", "target_device"),
           used_by="multimodal.SGLangMultimodal.get_image_feature (CUDA-IPC features, GPU only)"),
    Symbol("sglang.srt.multimodal.mm_utils:materialize_multimodal_features", ("features", "device", "dtype"),
           used_by="compat.materialize_multimodal_features"),
    Symbol("sglang.srt.managers.schedule_batch:Modality.IMAGE", used_by="compat.deepstack_modalities"),
    # SGLang's processor choice by architecture name (test_multimodal): by the classes its processors list
    Symbol("sglang.srt.managers.multimodal_processor:PROCESSOR_MAPPING", releases="<0.5.18",
           used_by="SGLang's processor choice by architecture name (get_mm_processor's loop; tested)"),
    Symbol("sglang.srt.managers.multimodal_processor:get_mm_processor_cls", ("hf_config", "server_args"),
           releases=">=0.5.18,<0.5.20", used_by="SGLang's processor choice by architecture name (tested)"),
    Symbol("sglang.srt.managers.multimodal_processor:get_mm_processor_cls", ("hf_config",), releases=">=0.5.20",
           used_by="SGLang's processor choice by architecture name (tested)"),
    Symbol("sglang.srt.runtime_context:get_server_args", (), used_by="compat.MAMBA_EXTRA_BUFFER (< 0.5.20)"),
    Symbol("sglang.srt.runtime_context:get_lora", (), used_by="compat.lora_enabled"),
    Symbol("sglang.srt.server_args:ServerArgs.enable_mamba_extra_buffer", ("self",), releases="<0.5.20",
           used_by="compat.MAMBA_EXTRA_BUFFER"),
    Symbol("sglang.srt.runtime_context:get_exec", (),
           used_by="compat.MAMBA_EXTRA_BUFFER (exec.mamba.enable_mamba_extra_buffer, >= 0.5.20)"),
    Symbol("sglang.srt.runtime_context:get_spec", (), used_by="compat.unsupported_linear_attention_settings"),
    # latent attention (latent.py): the absorbed form on one RadixAttention over SGLang's MLA pool
    Symbol("sglang.srt.layers.radix_attention:RadixAttention.__init__",
           ("self", "num_heads", "head_dim", "scaling", "num_kv_heads", "layer_id", "v_head_dim", "quant_config",
            "prefix"), used_by="latent.SGLangLatentAttention"),
    Symbol("sglang.srt.mem_cache.memory_pool:MLATokenToKVPool.__init__",
           ("self", "size", "page_size", "dtype", "kv_lora_rank", "qk_rope_head_dim", "layer_num", "device",
            "enable_memory_saver"), used_by="SGLang's latent KV pool for DeepseekV3ForCausalLM (test_forward builds it)"),
    Symbol("sglang.srt.configs.model_config:AttentionArch.MLA",
           used_by="SGLang's ModelConfig choosing the latent pool from the architecture (test_registry)"),
    # ATOM's paged attention as an SGLang attention backend (attention_backend.py, --attention-backend atom)
    Symbol("sglang.srt.layers.attention.attention_registry:register_attention_backend", ("name",),
           used_by="compat.register_attention_backend"),
    Symbol("sglang.srt.server_args:add_attention_backend_choices", used_by="compat.register_attention_backend"),
    Symbol("sglang.srt.server_args:ATTENTION_BACKEND_CHOICES", used_by="compat.register_attention_backend"),
    Symbol("sglang.srt.layers.attention.base_attn_backend:AttentionBackend.forward_extend",
           ("self", "q", "k", "v", "layer", "forward_batch", "save_kv_cache"), used_by="attention_backend.AtomAttnBackend"),
    Symbol("sglang.srt.layers.attention.base_attn_backend:AttentionBackend.forward_decode",
           ("self", "q", "k", "v", "layer", "forward_batch", "save_kv_cache"), used_by="attention_backend.AtomAttnBackend"),
    Symbol("sglang.srt.layers.attention.base_attn_backend:AttentionBackend.init_forward_metadata", ("self", "forward_batch"),
           used_by="attention_backend.AtomAttnBackend (eager steps)"),
    Symbol("sglang.srt.layers.attention.base_attn_backend:AttentionBackend.init_forward_metadata_out_graph",
           ("self", "forward_batch", "in_capture"), used_by="attention_backend.AtomAttnBackend (CUDA-graph capture, replay)"),
    Symbol("sglang.srt.layers.attention.base_attn_backend:AttentionBackend.init_forward_metadata_in_graph",
           ("self", "forward_batch"), used_by="attention_backend.AtomAttnBackend"),
    Symbol("sglang.srt.layers.attention.base_attn_backend:AttentionBackend.init_cuda_graph_state",
           ("self", "max_bs", "max_num_tokens"), used_by="attention_backend.AtomAttnBackend"),
    Symbol("sglang.srt.layers.attention.base_attn_backend:AttentionBackend.get_cuda_graph_seq_len_fill_value", ("self",),
           used_by="attention_backend.AtomAttnBackend"),
    Symbol("sglang.srt.model_executor.forward_batch_info:ForwardBatch",
           fields=("batch_size", "req_pool_indices", "seq_lens", "seq_lens_cpu", "extend_seq_lens", "out_cache_loc",
                   "encoder_lens"), used_by="attention_backend.AtomAttnBackend"),
    Symbol("sglang.srt.mem_cache.memory_pool:MHATokenToKVPool.get_key_buffer", ("self", "layer_id"),
           fields=("is_quantized_kv_cache",), used_by="attention_backend.AtomAttnBackend (its K/V buffers as ATOM's cache)"),
    Symbol("sglang.srt.mem_cache.memory_pool:MHATokenToKVPool.get_value_buffer", ("self", "layer_id"),
           used_by="attention_backend.AtomAttnBackend"),
    Symbol("sglang.srt.mem_cache.memory_pool:HybridLinearKVPool", used_by="compat.kv_pool_classes"),
    Symbol("sglang.srt.mem_cache.base_swa_memory_pool:BaseSWAKVPool", used_by="compat.kv_pool_classes (refused)"),
)

# What the parallel context must report for ATOM's layers to shard correctly.
PARALLEL_FIELDS = ("tp_size", "tp_group", "pp_size", "attn_tp_size", "attn_dcp_size")


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


def lora_enabled() -> bool:
    """Whether the server runs with LoRA (``--enable-lora``, or ``--lora-paths``, which sets it): the published
    ``lora`` namespace (a model built outside a server, with nothing published, has none)."""
    from sglang.srt.runtime_context import get_lora

    try:
        return bool(get_lora().enable_lora)
    except ValueError:  # "config namespace 'lora' not published"
        return False


def unsupported_latent_attention() -> str | None:
    """Why the running SGLang's parallel layout cannot host ATOM's latent attention (None when it can)."""
    dcp = parallel().attn_dcp_size
    if dcp > 1:
        return (f"decode context parallelism (--dcp-size {dcp}) splits SGLang's latent KV pool, which atom-sglang's "
                "latent attention does not handle; run without it")
    return None


def register_linear_attn_model(config_class: type, backend_class_name: str, arch_names: list[str], **options: Any) -> None:
    """Declare a hybrid (softmax + linear attention) architecture to SGLang (0.5.11+)."""
    from sglang.srt.configs.linear_attn_model_registry import LinearAttnModelSpec, register_linear_attn_model

    register_linear_attn_model(
        LinearAttnModelSpec(config_class=config_class, backend_class_name=backend_class_name, arch_names=arch_names,
                            **options)
    )


# ------------------------------------------------------------------------------ hybrid linear attention
def attention_backend() -> Any:
    """The attention backend of the running forward (0.5.13+: SGLang's forward context)."""
    from sglang.srt.model_executor.forward_context import get_attn_backend

    return get_attn_backend()


def linear_attention_backend() -> Any:
    """The linear half of SGLang's ``HybridLinearAttnBackend`` (its ``forward_metadata`` holds the step's
    mamba slots), or a RuntimeError when SGLang did not set one up for this model."""
    backend = attention_backend()
    linear = getattr(backend, "linear_attn_backend", None)
    if linear is None:
        raise RuntimeError(
            f"SGLang's attention backend for this step is {type(backend).__name__}, not its hybrid linear-attention "
            "backend: SGLang did not recognise the model's config as hybrid, so it keeps no linear-attention state"
        )
    return linear


def _extra_buffer_of_server_args() -> bool:
    from sglang.srt.runtime_context import get_server_args

    return get_server_args().enable_mamba_extra_buffer()


def _extra_buffer_of_exec_bag() -> bool:
    from sglang.srt.runtime_context import get_exec

    return get_exec().mamba.enable_mamba_extra_buffer


# Whether the running server's mamba radix cache keeps an extra state buffer (resolved from
# --mamba-radix-cache-strategy): a method of the published ServerArgs, then a leaf of the published exec bag.
MAMBA_EXTRA_BUFFER: ByRelease = ByRelease("the mamba extra-buffer setting", {
    "<0.5.20": _extra_buffer_of_server_args,
    ">=0.5.20": _extra_buffer_of_exec_bag,
})


def unsupported_linear_attention_settings() -> str | None:
    """Why the server settings cannot run ATOM's GDN layers (None when they can)."""
    from sglang.srt.runtime_context import get_spec

    if MAMBA_EXTRA_BUFFER.get()():
        return (
            "the extra_buffer mamba radix-cache strategy needs intermediate chunk states that ATOM's GDN kernels do "
            "not expose; run with --mamba-radix-cache-strategy no_buffer (or --disable-radix-cache)"
        )
    algorithm = get_spec().speculative_algorithm
    if algorithm is not None and str(getattr(algorithm, "name", algorithm)).upper() != "NONE":
        return f"speculative decoding ({algorithm}) is not supported with ATOM's GDN layers"
    return None


# ------------------------------------------------------------------------------------------ multimodal
def _pad_with_padding_pattern(input_ids: Any, mm_inputs: Any) -> Any:
    from sglang.srt.managers.mm_utils import MultiModalityDataPaddingPatternMultimodalTokens

    return MultiModalityDataPaddingPatternMultimodalTokens().pad_input_tokens(input_ids, mm_inputs)


def _pad_mm_tokens(input_ids: Any, mm_inputs: Any) -> Any:
    from sglang.srt.managers.mm_utils import pad_mm_tokens

    return pad_mm_tokens(input_ids, mm_inputs)


PAD_MULTIMODAL_TOKENS: ByRelease = ByRelease("padding multimodal placeholder tokens", {
    "<0.5.23": _pad_with_padding_pattern,
    ">=0.5.23": _pad_mm_tokens,
})


def pad_multimodal_tokens(input_ids: Any, mm_inputs: Any) -> Any:
    """Each multimodal item's placeholder run replaced by its pad values (SGLang's radix-cache keys)."""
    return PAD_MULTIMODAL_TOKENS.get()(input_ids, mm_inputs)


def materialize_multimodal_features(features: list, *, device: Any, dtype: Any) -> Any:
    """The items' feature tensors packed into one on ``device``/``dtype`` (SGLang's helper)."""
    from sglang.srt.multimodal.mm_utils import materialize_multimodal_features as materialize

    return materialize(features, device=device, dtype=dtype)


def general_mm_embed_routine(**kwargs: Any) -> Any:
    from sglang.srt.managers.mm_utils import general_mm_embed_routine as routine

    return routine(**kwargs)


def deepstack_modalities() -> dict[Any, bool]:
    """``use_deepstack`` for models whose image features carry deepstack layers (images only)."""
    from sglang.srt.managers.schedule_batch import Modality

    return {Modality.IMAGE: True}


# ------------------------------------------------------------------------------------ attention backend
def attention_backend_base() -> type:
    """SGLang's ``AttentionBackend`` (the base of :class:`atom_sglang.attention_backend.AtomAttnBackend`)."""
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    return AttentionBackend


def register_attention_backend(name: str, factory: Any) -> None:
    """``factory(model_runner)`` in SGLang's attention-backend registry as ``name``, and ``name`` among the
    ``--attention-backend`` choices (SGLang's extension point for out-of-tree backends; the argument parser and
    ``ServerArgs`` read the list after the plugins have loaded).  Idempotent."""
    from sglang.srt.layers.attention.attention_registry import register_attention_backend as register
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices

    if name not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([name])
    register(name)(factory)


def kv_pool_classes() -> tuple[type, type, type]:
    """SGLang's plain MHA token pool, its hybrid GDN pool (full-attention layers in an MHA pool) and the base of
    its hybrid sliding-window pools."""
    from sglang.srt.mem_cache.base_swa_memory_pool import BaseSWAKVPool
    from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, MHATokenToKVPool

    return MHATokenToKVPool, HybridLinearKVPool, BaseSWAKVPool


def speculative_algorithm() -> str | None:
    """The server's speculative-decoding algorithm (None when it decodes one token at a time)."""
    from sglang.srt.runtime_context import get_spec

    algorithm = get_spec().speculative_algorithm
    name = None if algorithm is None else str(getattr(algorithm, "name", algorithm))
    return None if name is None or name.upper() == "NONE" else name


def dllm_algorithm() -> str | None:
    """The server's diffusion-LM decoding algorithm (None for autoregressive models)."""
    from sglang.srt.runtime_context import get_exec

    return getattr(getattr(get_exec(), "dllm", None), "dllm_algorithm", None)
