"""``atom quantize``: write a quantized copy of an unquantized checkpoint.

Which tensors are quantized comes from the model itself: the catalog class is built on the ``meta``
device and every checkpoint tensor its weight mapper places into a linear layer's ``weight`` (or a
per-expert projection of an MoE layer) is encoded, per checkpoint tensor (per shard of a fused layer,
per expert projection); embeddings, norms, routers, the LM head and biases are copied as they are.
A layer whose shapes the format cannot hold (block boundaries inside a fused layer, sizes not a
multiple of 32, experts of an intermediate size not a multiple of 128 for FP8 blocks; every MoE
layer under ptpc-fp8, which has no expert format) is left unquantized.  Every 2-D weight left
unquantized is listed in the config's exclusions, so hosts that quantize all linear-like modules
(vLLM's router gates) skip it too.  Shards, tokenizer and other files are kept.  The output directory
is written whole or not at all (:mod:`atom_core.staging`): an interrupted run leaves what was there.

Formats written, each readable by ATOM and, where the format allows, by vLLM / SGLang:

* ``fp8-block``: ``quant_method: fp8`` with ``weight_block_size [128, 128]`` (DeepSeek-V3 style;
  ``weight`` fp8 + ``weight_scale_inv`` fp32);
* ``ptpc-fp8``: compressed-tensors ``float-quantized``, channel weights / dynamic token activations
  (``weight`` fp8 + ``weight_scale`` fp32 ``[N, 1]``);
* ``mxfp4``: AMD Quark MXFP4 weight-only (``weight`` uint8 ``[N, K/2]`` + ``weight_scale`` e8m0 bytes).

An architecture whose published checkpoints have a layout of their own for a scheme gets that layout instead
(:data:`atom_core.quant.native_layouts.NATIVE_LAYOUTS`): ``mxfp4`` on gpt-oss writes its MoE experts only, as
``*_blocks`` / ``*_scales`` (``quant_method: mxfp4``), which transformers' and vLLM's own gpt-oss load; ``mxfp4`` on
Kimi-K2.5 writes Quark MXFP4 on the routed experts only, everything else excluded (amd/Kimi-K2.5-MXFP4).
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from atom_core import catalog
from atom_core.config import load_hf_config
from atom_core.errors import UnsupportedQuantizationError, UsageError
from atom_core.layers.params import materialize
from atom_core.loader import Checkpoint
from atom_core.loader.checkpoint import INDEX_FILE
from atom_core.paths import escapes, inside
from atom_core.quant.exclusions import layer_excluded
from atom_core.quant.native_layouts import ExpertsOnly, NativeLayout, native_layout
from atom_core.staging import MARKER, check_destination, staged_dir

logger = logging.getLogger(__name__)

BLOCK = (128, 128)
MX_GROUP = 32


def _fp8_block(w: torch.Tensor) -> dict[str, torch.Tensor]:
    from atom_kernels.formats import quantize_fp8_blocks

    q, s = quantize_fp8_blocks(w, BLOCK)
    return {"weight": q, "weight_scale_inv": s}


def _ptpc(w: torch.Tensor) -> dict[str, torch.Tensor]:
    from atom_kernels.formats import quantize_fp8_per_row

    q, s = quantize_fp8_per_row(w)
    return {"weight": q, "weight_scale": s}


def _mxfp4(w: torch.Tensor) -> dict[str, torch.Tensor]:
    from atom_kernels.formats import quantize_mxfp4

    packed, scales = quantize_mxfp4(w)
    return {"weight": packed, "weight_scale": scales}


def _fp8_block_fits(shard_sizes: list[int], input_size: int) -> bool:
    """Block scales of a fused layer split only at block edges: every shard but the last must be
    a whole number of 128-row blocks."""
    return all(size % BLOCK[0] == 0 for size in shard_sizes[:-1])


def _mxfp4_fits(shard_sizes: list[int], input_size: int) -> bool:
    return input_size % MX_GROUP == 0


def _fp8_block_config(excluded: list[str], experts: Sequence[str] = ()) -> dict[str, Any]:
    config: dict[str, Any] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                              "weight_block_size": list(BLOCK)}
    if excluded:
        config["ignored_layers"] = excluded
        config["modules_to_not_convert"] = excluded
    return config


def _expert_pattern(module: str) -> str:
    """A compressed-tensors ``ignore`` entry for an experts module: hosts look experts up per expert and
    projection (vLLM: ``<module>.0.gate_proj``), which a plain module name never equals."""
    return f"re:{re.escape(module)}($|\\.)"


def _ptpc_config(excluded: list[str], experts: Sequence[str] = ()) -> dict[str, Any]:
    ignore = {"lm_head", *(name for name in excluded if name not in experts), *map(_expert_pattern, experts)}
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "format": "float-quantized",
                "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel",
                            "dynamic": False, "group_size": None, "observer": "minmax"},
                "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
                                      "dynamic": True, "group_size": None, "observer": None},
                "output_activations": None,
            }
        },
        "ignore": sorted(ignore),
        "kv_cache_scheme": None,
    }


def _mxfp4_config(excluded: list[str], experts: Sequence[str] = ()) -> dict[str, Any]:
    return {
        "quant_method": "quark",
        "global_quant_config": {
            "weight": {"dtype": "fp4", "qscheme": "per_group", "group_size": MX_GROUP, "ch_axis": -1,
                       "scale_format": "e8m0", "is_dynamic": False, "symmetric": None},
            "input_tensors": None,
            "output_tensors": None,
            "bias": None,
        },
        "layer_quant_config": {},
        "layer_type_quant_config": {},
        "exclude": sorted({"lm_head", *excluded}),
        "export": {"kv_cache_group": [], "pack_method": "reorder", "weight_format": "real_quantized",
                   "weight_merge_groups": None},
        "quant_mode": "eager_mode",
    }


def _fp8_block_experts_fit(hidden: int, inter: int) -> bool:
    return inter % BLOCK[0] == 0  # gate and up blocks stack without straddling (vLLM requires it too)


def _mxfp4_experts_fit(hidden: int, inter: int) -> bool:
    return hidden % MX_GROUP == 0 and inter % MX_GROUP == 0


# scheme -> (encode one [N, K] weight, does a linear layer fit, do a layer's experts fit (None: the
# format has no expert kernel, experts stay unquantized), the quantization_config to write from the modules
# left unquantized and the experts modules among them)
SCHEMES: dict[str, tuple[Callable, Callable, Callable | None, Callable]] = {
    "fp8-block": (_fp8_block, _fp8_block_fits, _fp8_block_experts_fit, _fp8_block_config),
    "ptpc-fp8": (_ptpc, lambda sizes, k: True, None, _ptpc_config),
    "mxfp4": (_mxfp4, _mxfp4_fits, _mxfp4_experts_fit, _mxfp4_config),
}


def model_layers(hf_config: Any) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """``{prefix: layer}`` of every linear layer and every MoE expert layer of the catalog model (built
    on the meta device), and the model (its weight mapper and ``checkpoint_tensors``)."""
    from atom_core.layers.linear import LinearBase
    from atom_core.layers.moe import FusedMoE
    from atom_core.runtime.host import NativeHost

    spec = catalog.resolve(hf_config)
    with torch.device("meta"):
        model = spec.model_class()(hf_config, NativeHost())
    modules = dict(model.named_modules())
    linears = {name: m for name, m in modules.items() if isinstance(m, LinearBase)}
    experts = {name: m for name, m in modules.items() if isinstance(m, FusedMoE)}
    return linears, experts, model


def quantize_checkpoint(model_dir: str | Path, out_dir: str | Path, scheme: str, *,
                        device: str = "cpu", overwrite: bool = False, exclude: Sequence[str] = ()) -> Path:
    """Write ``model_dir`` quantized with ``scheme`` to ``out_dir``; returns ``out_dir``.  ``out_dir`` is
    written whole or not at all: it must be new or empty, or with ``overwrite`` a checkpoint to replace
    (:mod:`atom_core.staging`).  An architecture with a layout of its own for ``scheme``
    (:data:`atom_core.quant.native_layouts.NATIVE_LAYOUTS`) gets that layout.  ``exclude``: patterns of checkpoint
    module names to keep unquantized (:mod:`atom_core.quant.exclusions`' rules: ``q_proj``, ``self_attn``,
    ``re:...``); they are listed, per module, in the written config's exclusions."""
    from atom_core.runtime.runner import resolve_device

    if scheme not in SCHEMES:
        raise UnsupportedQuantizationError(f"unknown scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
    src, out = Path(model_dir), Path(out_dir)
    device = resolve_device(device)
    if src.resolve() == out.resolve() or out.resolve() in src.resolve().parents:
        raise UsageError(f"--out {out} must not be --model {src} or a directory containing it")
    hf_config = load_hf_config(src)
    if getattr(hf_config, "quantization_config", None):
        raise UnsupportedQuantizationError(f"{src} is already quantized; atom quantize takes an unquantized checkpoint")
    native = native_layout(scheme, catalog.resolve(hf_config).name)
    if native is not None and exclude:
        raise UsageError(f"{native.name} is a fixed layout: --exclude applies to the generic schemes only")
    if isinstance(native, ExpertsOnly):
        writer: _Writer = _SchemeWriter(scheme, device, hf_config, experts_only=native)
    elif native is not None:
        native.check(hf_config)
        writer = _NativeWriter(native, device)
    else:
        writer = _SchemeWriter(scheme, device, hf_config, exclude)
    check_destination(out, overwrite)
    checkpoint = Checkpoint(src)
    with staged_dir(out, writer="atom quantize", overwrite=overwrite) as tmp:
        _write_shards(checkpoint, tmp, writer, f"quantizing ({scheme})")
        config = json.loads(inside(src, "config.json").read_text())
        config["quantization_config"] = writer.quantization_config()
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        copy_other_files(src, tmp)
    logger.info("quantized %d weights with %s into %s (%s)", writer.quantized, scheme, out, writer.summary())
    return out


class _Writer:
    """What to write for each checkpoint tensor, and the ``quantization_config`` that describes it."""

    quantized = 0  # weights encoded so far

    def __call__(self, source: str, lazy: Any) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def quantization_config(self) -> dict[str, Any]:
        raise NotImplementedError

    def summary(self) -> str:
        raise NotImplementedError


class _NativeWriter(_Writer):
    """An architecture's own layout (:mod:`atom_core.quant.native_layouts`)."""

    def __init__(self, layout: NativeLayout, device: torch.device):
        self.layout, self.device = layout, device

    def __call__(self, source: str, lazy: Any) -> dict[str, torch.Tensor]:
        encoded = self.layout.encode(source, lazy, self.device)
        if encoded is None:
            return {source: materialize(lazy).contiguous()}
        self.quantized += 1
        return encoded

    def quantization_config(self) -> dict[str, Any]:
        if not self.quantized:
            raise UnsupportedQuantizationError(f"{self.layout.name}: the checkpoint holds no tensor this layout quantizes")
        return json.loads(json.dumps(self.layout.quantization_config))

    def summary(self) -> str:
        return self.layout.name


class _SchemeWriter(_Writer):
    """The scheme's generic layout: every linear layer (per checkpoint shard) and every per-expert projection the
    format can hold is encoded; what is left is listed in the config's exclusions.  Tensors are read through the
    model's ``checkpoint_tensors`` (stacked experts are written per expert)."""

    def __init__(self, scheme: str, device: torch.device, hf_config: Any, exclude: Sequence[str] = (),
                 experts_only: ExpertsOnly | None = None):
        self.encode, fits, experts_fit, self.make_config = SCHEMES[scheme]
        self.device = device
        self.experts_only = experts_only
        layers, self.expert_layers, self.model = model_layers(hf_config)
        packed = self.model.packed_modules_mapping()
        self.excluded_layers = {prefix for prefix, layer in layers.items()
                                if experts_only or not fits(layer.checkpoint_shard_sizes(), layer.input_size)
                                or layer_excluded(prefix, exclude, packed)}
        self.excluded_layers |= {prefix for prefix, layer in self.expert_layers.items()
                                 if experts_fit is None or not experts_fit(layer.hidden_size, layer.intermediate_size)}
        self.layers = {**layers, **self.expert_layers}
        self.mapper = self.model.mapper()
        self.excluded: set[str] = set()

    def __call__(self, source: str, lazy: Any) -> dict[str, torch.Tensor]:
        tensors: dict[str, torch.Tensor] = {}
        for name, tensor in self.model.checkpoint_tensors([(source, lazy)]):
            layer = _weight_target(name, self.mapper, self.layers)
            tensor = materialize(tensor)
            if layer is None or layer in self.excluded_layers:
                tensors[name] = tensor.contiguous()
                if layer in self.expert_layers:
                    self.excluded.add(layer)  # the experts module, as hosts name it
                elif tensor.dim() == 2 and name.endswith(".weight"):
                    self.excluded.add(name[: -len(".weight")])  # linear layers and anything a host might take for one
            else:
                module = name[: -len(".weight")]
                for suffix, value in self.encode(tensor.to(self.device).contiguous()).items():
                    tensors[f"{module}.{suffix}"] = value.cpu().contiguous()
                self.quantized += 1
        return tensors

    def quantization_config(self) -> dict[str, Any]:
        config = self.make_config(sorted(self.excluded), sorted(self.excluded & set(self.expert_layers)))
        if self.experts_only is None:
            return config
        if not self.quantized:
            raise UnsupportedQuantizationError(f"{self.experts_only.name}: the checkpoint holds no expert this layout "
                                               "quantizes")
        return _merged(config, self.experts_only.config)

    def summary(self) -> str:
        layout = f"{self.experts_only.name}: " if self.experts_only else ""
        return f"{layout}{len(self.excluded)} modules left unquantized"


def _merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``extra``, nested dicts key by key."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


NOT_COPIED = ("config.json", INDEX_FILE, MARKER)  # written anew (the marker: by the staging itself)


def copy_other_files(src: Path, out: Path) -> None:
    """Copy the files of ``src`` that are not weights (tokenizer, chat template, generation config...) into ``out``.

    A symbolic link is copied as the contents of what it points to only when that stays inside ``src``; a link
    out of the checkpoint is skipped with a warning (its target is not ATOM's to read, let alone to copy).
    Directories are not copied."""
    for path in sorted(src.iterdir()):
        if path.suffix == ".safetensors" or path.name in NOT_COPIED:
            continue
        target = escapes(src, path)
        if target is not None:
            logger.warning("not copying %s: it is a link to %s, outside the checkpoint directory", path, target)
            continue
        if path.is_file():
            shutil.copy2(path, out / path.name)


def _write_shards(checkpoint: Checkpoint, out: Path, writer: _Writer, desc: str) -> None:
    """Every shard of ``checkpoint`` into ``out`` under the same file name, each tensor replaced by what ``writer``
    makes of it (and the index, if the checkpoint has one)."""
    files = checkpoint.files
    weight_map: dict[str, str] = {}
    pending: dict[str, dict[str, torch.Tensor]] = {file: {} for file in files}
    remaining = {file: sum(1 for f in checkpoint.weight_map.values() if f == file) for file in files}
    # tensors() reads file by file; each output file is written as soon as its last tensor is in
    for source, lazy in tqdm(checkpoint.tensors(progress=False), total=len(checkpoint.weight_map),
                           desc=desc, unit="tensor", disable=len(files) < 2):
        file = checkpoint.weight_map[source]
        pending[file].update(writer(source, lazy))
        remaining[file] -= 1
        if remaining[file] == 0:
            target = inside(out, file, what="shard")  # a name Checkpoint already checked; written only inside out
            target.parent.mkdir(parents=True, exist_ok=True)
            save_file(pending[file], str(target), metadata={"format": "pt"})
            weight_map.update({key: file for key in pending[file]})
            pending[file] = {}
    if len(files) > 1 or (checkpoint.model_dir / INDEX_FILE).is_file():
        total = sum(inside(out, f).stat().st_size for f in files)
        (out / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))


def _weight_target(name: str, mapper: Any, layers: dict[str, Any]) -> str | None:
    """The layer (linear, or MoE experts for a per-expert projection) whose weight matrix a checkpoint
    tensor is; None for anything else (stacked expert tensors are copied as they are)."""
    if not name.endswith(".weight"):
        return None
    targets = mapper.map(name)
    if not targets or len(targets) != 1:
        return None
    param, shard = targets[0].param, targets[0].shard_id
    for suffix in (".weight", ".w13_weight", ".w2_weight"):
        if param.endswith(suffix) and (suffix == ".weight" or isinstance(shard, tuple)):
            prefix = param[: -len(suffix)]
            return prefix if prefix in layers else None
    return None
