"""Images through SGLang's multimodal path into ATOM's multimodal models (Qwen3-VL; Qwen3.5 and Qwen3.5-MoE,
hybrid GDN without deepstack; Kimi-K2.5, 1-D positions over DeepSeek-V3's latent attention), on the CPU, against
transformers.

What SGLang's processor would hand the scheduler is built here from the checkpoint's own image processor:
one ``MultimodalDataItem`` per image (pixel rows, ``image_grid_thw``, the offsets of its placeholder run,
its hash pad values) in a ``MultimodalInputs``; for Qwen-VL its MRoPE positions and decode delta come from SGLang's
``MRotaryEmbedding.get_rope_index`` (the call its Qwen-VL processor makes), for Kimi-K2.5 the prompt's placeholder
runs from SGLang's Kimi-K2.5 processor functions (each image's token count from ``navit_resize_config``, the
request's ``<|media_pad|>`` expanded by ``_expand_image_token_ids``).  Then the model's ``pad_input_ids``, SGLang's
``general_mm_embed_routine`` (embedding cache, a prefill chunk that ends inside an image, deepstack where the tower
has it), SGLang's per-step positions and decode, all through _sglang_batch (for the hybrid models over SGLang's mamba
pool: the image chunk's GDN state carries over).

Not covered on the CPU: SGLang's processor itself on a real request (it needs the checkpoint's full
tokenizer/processor files and its async request pipeline; Kimi-K2.5's also the checkpoint's remote-code media
processor and, for its pixels, a CUDA kernel); the test checks SGLang picks its own processor of the architecture
for ATOM's classes."""

from __future__ import annotations

from array import array

import numpy as np
import pytest
import torch
from _sglang_batch import SGLangCPUBatch
from _sglang_env import load_with_sglang
from conftest import checkpoint_or_skip

from atom_core import catalog
from atom_core.runtime.multimodal import load_images, spatial_merge_size, with_image_placeholders
from atom_sglang import multimodal
from atom_sglang.compat import ByRelease

pytestmark = pytest.mark.sglang

# every multimodal catalog architecture (one not served by atom-sglang is skipped, and test_registry/test_unit
# require it to be refused explicitly)
ARCHS = sorted(a for a, spec in catalog.ARCHITECTURES.items() if catalog.MULTIMODAL in spec.capabilities)
IMAGE_SIZES = [(40, 52), (30, 70)]  # pixels; the tiny processor makes 4x6 and 4x8 patch grids
TEXT = [5, 17, 99, 3]
TEXT_ONLY = [11, 300, 7]
NEW_TOKENS = 3
ATOL = 1e-4  # fp32; measured ~1e-6


@pytest.fixture(scope="module")
def image_files(tmp_path_factory):
    from PIL import Image

    rng = np.random.default_rng(0)
    files = []
    for i, (h, w) in enumerate(IMAGE_SIZES):
        file = tmp_path_factory.mktemp("images") / f"image{i}.png"
        Image.fromarray((rng.random((h, w, 3)) * 255).astype("uint8")).save(file)
        files.append(str(file))
    return files


@pytest.fixture(params=ARCHS)
def vl(request, tiny_checkpoints, image_files):
    """(checkpoint, the images as its processor prepares them) of one multimodal architecture."""
    path = checkpoint_or_skip(request.param, tiny_checkpoints)
    return path, load_images(path, image_files)


def qwen_vl_prompt(path: str, config, images) -> list[int]:
    """The prompt as SGLang's Qwen-VL processor hands it over: ``<vision_start> <image>×n <vision_end>`` per image
    (its merged patch count), then the text."""
    return with_image_placeholders(config, TEXT, images.image_grid_thw)


def kimi_k25_prompt(path: str, config, images) -> list[int]:
    """The prompt as SGLang's Kimi-K2.5 processor hands it over: the request's ``<|media_pad|>`` per image expanded to
    the image's token count, both by SGLang's own functions (``navit_resize_config`` over the checkpoint's
    ``media_proc_cfg``, ``_expand_image_token_ids``).  The count must be the one the checkpoint's image processor
    patched the image into."""
    import json
    from pathlib import Path

    from sglang.srt.multimodal.processors.kimi_k25 import _expand_image_token_ids, navit_resize_config

    cfg = json.loads((Path(path) / "preprocessor_config.json").read_text())["media_proc_cfg"]
    counts = [navit_resize_config(w, h, cfg["patch_size"], cfg["merge_kernel_size"], cfg["in_patch_limit"],
                                  cfg["patch_limit_on_one_side"])["num_tokens"] for h, w in IMAGE_SIZES]
    merge = spatial_merge_size(config.vision_config)
    assert counts == (images.image_grid_thw.prod(-1) // merge**2).tolist()
    token = config.media_placeholder_token_id  # what SGLang's processor reads
    request = [token, 7, token, *TEXT]
    return _expand_image_token_ids(request, token, counts).view(-1).tolist()


# architecture -> the prompt SGLang's own processor of it hands the scheduler (Qwen-VL's unless named)
PROMPTS = {"KimiK25ForConditionalGeneration": kimi_k25_prompt}


def sglang_mm_inputs(config, ids: list[int], images, uses_mrope: bool):
    """What SGLang's processor produces for a prompt: an item per image (pixels, ``image_grid_thw``, the offsets of
    its placeholder run) and, with MRoPE, the positions + delta (Qwen-VL's processor)."""
    from sglang.srt.layers.rotary_embedding import MRotaryEmbedding
    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem, MultimodalInputs

    merge = spatial_merge_size(config.vision_config)
    placeholders = [i for i, t in enumerate(ids) if t == config.image_token_id]
    items, row, seen = [], 0, 0
    for grid in images.image_grid_thw:
        patches, tokens = int(grid.prod()), int(grid.prod()) // merge**2
        start = placeholders[seen]
        item = MultimodalDataItem(modality=Modality.IMAGE, feature=images.pixel_values[row:row + patches],
                                  offsets=[(start, start + tokens - 1)])
        item.image_grid_thw = grid.view(1, 3)
        item.set_pad_value()
        items.append(item)
        row, seen = row + patches, seen + tokens
    if not uses_mrope:  # 1-D positions (Kimi-K2.5): SGLang's ordinary ones
        return MultimodalInputs(mm_items=items, im_token_id=config.image_token_id)
    positions, delta = MRotaryEmbedding.get_rope_index(
        spatial_merge_size=merge, image_token_id=config.image_token_id, video_token_id=config.video_token_id,
        vision_start_token_id=config.vision_start_token_id, model_type=config.model_type,
        input_ids=torch.tensor([ids]), image_grid_thw=images.image_grid_thw,
    )
    return MultimodalInputs(mm_items=items, im_token_id=config.image_token_id, video_token_id=config.video_token_id,
                            mrope_positions=positions.squeeze(1), mrope_position_delta=delta)


@torch.inference_mode()
def test_images_match_transformers(vl, cpu_runtime, monkeypatch):
    path, images = vl
    model = load_with_sglang(path)
    config = model.config
    arch = type(model).__name__
    ids = PROMPTS.get(arch, qwen_vl_prompt)(path, config, images)
    mm_inputs = sglang_mm_inputs(config, ids, images, model.uses_mrope)
    padded = list(model.pad_input_ids(array("q", ids), mm_inputs))
    image_rows = [i for i, t in enumerate(ids) if t == config.image_token_id]
    assert [i for i, (a, b) in enumerate(zip(ids, padded)) if a != b] == image_rows  # only placeholders become keys
    assert {padded[i] for i in image_rows}.isdisjoint(range(config.text_config.vocab_size))

    seen = []  # what reached ATOM's model: (input_embeds rows, Deepstack)
    atom_forward = type(model).atom_forward
    monkeypatch.setattr(type(model), "atom_forward", lambda self, *a, **kw: seen.append((a, kw)) or atom_forward(self, *a, **kw))

    hf = catalog.get(arch).hf_model_class().from_pretrained(path, dtype=torch.float32).eval()

    def hf_logits(tokens):
        t = torch.tensor([tokens])
        types = {"mm_token_type_ids": (t == config.image_token_id).int()} if model.uses_mrope else {}
        return hf(input_ids=t, pixel_values=images.pixel_values, image_grid_thw=images.image_grid_thw,
                  **types).logits[0, -1]

    batch = SGLangCPUBatch(model, 2)
    batch.mm_inputs[0] = mm_inputs
    cut = image_rows[5]  # the first prefill chunk ends inside the first image
    first = batch.step({0: padded[:cut], 1: TEXT_ONLY})
    (_, _, embeds), kw = seen[-1]
    deepstack = kw.get("deepstack")
    if model.num_deepstack_embeddings:  # Qwen3-VL
        assert deepstack is not None and deepstack.token_index is None  # the dense form
        assert deepstack.embeds.shape == (len(model.deepstack_visual_indexes), cut + len(TEXT_ONLY), embeds.shape[-1])
        assert deepstack.embeds.any(-1).any(0).nonzero().view(-1).tolist() == image_rows[:5]
    else:  # Qwen3.5: no deepstack, whatever SGLang's config class defaults to
        assert deepstack is None and not model.use_deepstack
    rest = batch.step({0: padded[cut:]})
    err = (first[1] - hf(input_ids=torch.tensor([TEXT_ONLY])).logits[0, -1]).abs().max().item()
    assert err < ATOL, f"{arch}: text-only request beside the images: {err:.3g}"
    generated, logits = [], rest[0]
    other = int(first[1].argmax())
    for step in range(NEW_TOKENS):
        err = (logits - hf_logits(ids + generated)).abs().max().item()
        assert err < ATOL, f"{arch}: image request, step {step}: max |logit - transformers| = {err:.3g}"
        generated.append(int(logits.argmax()))
        if step + 1 < NEW_TOKENS:
            logits = batch.step({0: [generated[-1]], 1: [other]})[0]
            if model.uses_mrope:  # decode positions: SGLang's delta on all three rows
                pos = batch.last_batch.mrope_positions
                assert pos[:, 0].tolist() == [len(ids) + step + int(mm_inputs.mrope_position_delta)] * 3
            else:  # the running index of the expanded prompt
                assert int(batch.last_batch.positions[0]) == len(ids) + step


def _processor_in_mapping(hf_config):
    """SGLang 0.5.17's choice, as its get_mm_processor makes it before building the processor: the first
    registered processor listing a class of the architecture's name."""
    from sglang.srt.managers.multimodal_processor import PROCESSOR_MAPPING

    return next((cls for model_cls, cls in PROCESSOR_MAPPING.items() if model_cls.__name__ in hf_config.architectures),
                None)


def _processor_cls_with_server_args(hf_config):
    from sglang.srt.managers.multimodal_processor import get_mm_processor_cls
    from sglang.srt.runtime_context import get_server_args

    return get_mm_processor_cls(hf_config, get_server_args())


def _processor_cls(hf_config):
    from sglang.srt.managers.multimodal_processor import get_mm_processor_cls

    return get_mm_processor_cls(hf_config)


# SGLang's processor class for a config (atom_sglang.contract.CONTRACT has the three symbols)
PROCESSOR_CLASS = ByRelease("SGLang's multimodal processor choice", {
    "<0.5.18": _processor_in_mapping,
    ">=0.5.18,<0.5.20": _processor_cls_with_server_args,
    ">=0.5.20": _processor_cls,
})


# architecture -> the module of SGLang's own processor for it (the Qwen-VL one unless named here)
OWN_PROCESSOR = {"KimiK25ForConditionalGeneration": "sglang.srt.multimodal.processors.kimi_k25"}


def test_sglang_picks_its_own_processor_for_atoms_class(vl, cpu_runtime):
    """SGLang chooses processors by the model class's name: its own processor for the architecture serves ATOM's
    class."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.multimodal_processor import import_processors

    import_processors("sglang.srt.multimodal.processors")
    hf_config = ModelConfig(model_path=vl[0]).hf_config
    (arch,) = hf_config.architectures
    processor = PROCESSOR_CLASS.get()(hf_config)
    want = OWN_PROCESSOR.get(arch, "sglang.srt.multimodal.processors.qwen_vl")
    assert processor is not None and processor.__module__ == want
    assert arch in {m.__name__ for m in processor.models}


def test_videos_are_refused(vl, cpu_runtime):
    model = load_with_sglang(vl[0])
    assert isinstance(model, multimodal.SGLangMultimodal)
    with pytest.raises(ValueError, match="images only"):
        model.get_video_feature([])
