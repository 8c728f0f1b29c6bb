"""Kimi-K2.5 against transformers' ``Kimi_K25ForConditionalGeneration`` on a tiny random checkpoint (published
tensor names; every 1-D tensor randomised: norms, the vision tower's and merger's biases, the q/k biases in
rotary-pair order, the routers' correction biases).

* Text-only prompts (``parity.check_model``: prefill logits of three prompts within 1e-4, greedy tokens, decode
  log-probabilities within 1e-4) through ATOM's DeepSeek-V3 text model.
* Prompts with images, batched with a text-only one (prefill logits within 1e-4, greedy tokens, log-probabilities):
  the placeholders expanded as Kimi's processor expands them, ordinary 1-D positions over the expanded prompt, an
  image larger than the learned position grid (bicubic upsampling) and ones smaller.
* The vision tower and merger alone against transformers' ``get_image_features``, a two-frame clip included
  (temporal sinusoid, attention over both frames, temporal pooling).
* The placeholder count of :func:`with_image_placeholders` is the one transformers' Kimi processor expands to.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from conftest import with_random_vectors
from parity import check_model
from test_qwen3_vl import check_multimodal

from atom_core import catalog
from atom_core.models.deepseek_v3 import LatentAttention
from atom_core.runtime.multimodal import ImageInputs, Prompt, with_image_placeholders
from atom_core.runtime.runner import Runner

ARCH = "KimiK25ForConditionalGeneration"
PATCH = 8


@pytest.fixture(scope="module")
def kimi_dir(tiny, tmp_path_factory):
    return with_random_vectors(tiny(ARCH), tmp_path_factory.getbasetemp() / "kimi-k25-vectors")


def hf_kimi(model_dir):
    return catalog.get(ARCH).hf_model_class().from_pretrained(model_dir, dtype=torch.float32).eval()


def random_images(grids, seed=0) -> ImageInputs:
    """Normalised pixel patches ``[patches, 3, P, P]`` in raster order, as Kimi's image processor hands them over."""
    grid = torch.tensor(grids)
    gen = torch.Generator().manual_seed(seed)
    return ImageInputs(torch.randn(int(grid.prod(-1).sum()), 3, PATCH, PATCH, generator=gen), grid)


def test_text_only_parity(kimi_dir):
    runner = check_model(kimi_dir, hf_kimi(kimi_dir))
    assert runner.position_rows == 1
    assert sum(isinstance(m, LatentAttention) for m in runner.model.modules()) == 3


def test_image_parity(kimi_dir):
    runner = Runner(kimi_dir)
    two = random_images([[1, 4, 6], [1, 10, 12]], seed=1)  # the second is larger than the 8x8 position grid
    one = random_images([[1, 2, 2]], seed=2)
    config = runner.hf_config
    prompts = [
        Prompt(with_image_placeholders(config, [5, 17, 99, 3], two.image_grid_thw), two),
        Prompt([11, 300, 7]),
        Prompt(with_image_placeholders(config, [42], one.image_grid_thw), one),
    ]
    assert prompts[0].token_ids.count(config.image_token_id) == 6 + 30
    check_multimodal(runner, hf_kimi(kimi_dir), prompts)


def test_vision_tower_matches_transformers(kimi_dir):
    runner = Runner(kimi_dir)
    hf = hf_kimi(kimi_dir)
    # transformers pools a batch only when its clips have equal frame counts (and splits ``get_image_features`` by
    # unpooled sizes): images, then a two-frame clip, through its tower and projector
    for grids, tokens in (([[1, 4, 6], [1, 8, 8]], [6, 16]), ([[2, 6, 4]], [6])):
        images = random_images(grids, seed=3)
        with torch.inference_mode():
            pooled = hf.model.vision_tower(images.pixel_values, grid_thw=images.image_grid_thw).pooler_output
            want = hf.model.mm_projector(pooled).squeeze(1)
            got = runner.model.embed_multimodal(images.pixel_values, images.image_grid_thw)
        assert [g.shape[0] for g in got] == tokens
        torch.testing.assert_close(torch.cat(got), want, rtol=0, atol=1e-5)


def test_placeholder_count_is_the_processors(tiny):
    """``with_image_placeholders`` puts as many image tokens as transformers' Kimi processor expands one to."""
    from transformers.models.kimi_k25.processing_kimi_k25 import Kimi_K25Processor

    config = Runner(tiny(ARCH)).hf_config
    grids = torch.tensor([[1, 4, 6], [1, 10, 12]])
    processor = SimpleNamespace(image_processor=SimpleNamespace(merge_size=2), image_token="<|media_pad|>")
    for i in range(len(grids)):
        expanded = Kimi_K25Processor.replace_image_token(processor, {"image_grid_thw": grids}, i)
        ids = with_image_placeholders(config, [], grids[i : i + 1])
        assert ids.count(config.image_token_id) == expanded.count("<|media_pad|>")
