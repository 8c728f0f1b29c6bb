"""The one place atom-sglang meets SGLang's code: which versions it accepts, the accessors of the SGLang symbols it
calls (each listed, with the parameters it relies on, in :mod:`atom_sglang.contract`), and the version differences
among them.

Importing this module does not import SGLang; each accessor imports what it needs when called.

Versions: ``_pins.SUPPORTED`` (generated from ci/pins.toml) is what the plugin accepts; CI runs the
``_pins.TESTED`` releases; ``_pins.RELEASES`` lists every release of the range (each checked at least by
test_contract).  Where releases of the range spell one thing differently, the difference is data, in one
mechanism: a :class:`ByRelease` table maps SGLang release ranges to the implementation for them (its ranges
must cover every release in ``_pins.RELEASES`` exactly once, checked when the table is built), and each
:class:`~atom_sglang.contract.Symbol` of :data:`~atom_sglang.contract.CONTRACT` names the ``releases`` that have
it (test_contract checks a symbol on those).  No code asks which SGLang it runs in; the tables answer.
The differences inside the range:

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
from collections.abc import Callable
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


def check_buildable(name: str) -> None:
    """Before an ATOM class (target or draft) ``name`` is built: atom-sglang's requirements, the SGLang release, and a
    parallel layout ATOM's models can hold (else a one-line error naming ``name``)."""
    from atom_core.errors import UnsupportedConfigError
    from atom_core.versions import check_requirements

    check_requirements("atom-sglang")
    check_version()
    reason = unsupported_parallelism()
    if reason is not None:
        raise UnsupportedConfigError(f"{name}: {reason}")


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


# SGLang releases whose LoRA internals atom_sglang.lora hooks were read and tested with ATOM's layers: the manager's
# get_lora_layer (as lora_manager imported it), BaseLayerWithLoRA's set_lora_info / slice_lora_*_weights /
# on_lora_slots_updated calls, the pool's buffer layout and the backend's batch_info fields (contract.py).
LORA_INTERNALS_CHECKED = ("0.5.23",)


def lora_internals_checked(version: Version | str | None = None) -> bool:
    version = installed_version() if version is None else Version(str(version))
    return version is not None and str(version) in LORA_INTERNALS_CHECKED


def lora_layer_base() -> type:
    from sglang.srt.lora.layers import BaseLayerWithLoRA

    return BaseLayerWithLoRA


def install_lora_layers(choose: Any) -> None:
    """Let SGLang's LoRA manager wrap ATOM's layers: the ``get_lora_layer`` its ``set_lora_module`` calls (as
    ``sglang.srt.lora.lora_manager`` imported it; its layer table is local to that function, with no hook) becomes
    ``choose(layer, lora_backend, fallback, **kwargs)`` with SGLang's own as ``fallback``.  Idempotent; the caller
    has checked :func:`lora_internals_checked`."""
    import sglang.srt.lora.lora_manager as manager

    own = manager.get_lora_layer
    if getattr(own, "atom_choose", None) is choose:
        return
    own = getattr(own, "atom_fallback", own)

    def get_lora_layer(layer: Any, lora_backend: Any, **kwargs: Any) -> Any:
        return choose(layer, lora_backend, own, **kwargs)

    get_lora_layer.atom_choose = choose
    get_lora_layer.atom_fallback = own
    manager.get_lora_layer = get_lora_layer


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


def kv_pools() -> tuple[Any, Any]:
    """(the token-to-KV pool, ``req_to_token`` ``[rows, max_context]``) of the running forward, from SGLang's forward
    context (the attention backend holds both)."""
    from sglang.srt.model_executor.forward_context import get_req_to_token_pool, get_token_to_kv_pool

    return get_token_to_kv_pool(), get_req_to_token_pool().req_to_token


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


# SGLang's breakable prefill CUDA graphs (its prefill default on CUDA since 0.5.17) capture the model body in
# segments and run the functions marked as eager breaks between them, at capture and again at every replay.
BREAKABLE_GRAPHS = "sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph"


def in_breakable_cuda_graph() -> bool:
    """Whether SGLang is capturing or replaying a breakable prefill CUDA graph."""
    return importlib.import_module(BREAKABLE_GRAPHS).is_in_breakable_cuda_graph()


def eager_break(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` as an eager break of SGLang's breakable CUDA graphs: inside a capture it ends the captured segment,
    runs, and is called again with the same arguments at every replay, its result copied into the tensor it
    returned at capture (the address the next segment reads); outside a capture it is ``fn``."""
    return importlib.import_module(BREAKABLE_GRAPHS).eager_on_graph(enable=True)(fn)


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


def target_model_path() -> str:
    """The target model's checkpoint (a draft model is built with its own config; the server's model is the
    target)."""
    from sglang.srt.runtime_context import get_model

    return get_model().model_path


def dllm_algorithm() -> str | None:
    """The server's diffusion-LM decoding algorithm (None for autoregressive models)."""
    from sglang.srt.runtime_context import get_exec

    return getattr(getattr(get_exec(), "dllm", None), "dllm_algorithm", None)
