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


def test_mxfp4_expert_checkpoint(kimi_dir, tmp_path):
    """``atom quantize --scheme mxfp4`` writes amd/Kimi-K2.5-MXFP4's layout (Quark MXFP4 on the routed experts only,
    the checkpoint's own names, everything else listed in ``exclude`` by those names); ATOM loads it (the exclusions
    reach its renamed modules) and matches transformers run on the dequantized weights, images included."""
    import re

    from parity import PROMPTS, reference_logits
    from quant_helpers import logit_metrics, read_tensors, reference_with_quantized_weights

    from atom_core.quant.quantize import quantize_checkpoint

    out = str(quantize_checkpoint(kimi_dir, tmp_path / "mxfp4", "mxfp4"))
    tensors = read_tensors(out)
    scales = sorted(name for name in tensors if name.endswith(".weight_scale"))
    expert = re.compile(r"^language_model\.model\.layers\.2\.mlp\.experts\.\d+\.(gate|up|down)_proj\.weight_scale$")
    assert len(scales) == 16 * 3 and all(expert.match(name) for name in scales), scales[:4]
    gate = "language_model.model.layers.2.mlp.experts.5.gate_proj"
    assert tensors[f"{gate}.weight"].dtype == torch.uint8 and tuple(tensors[f"{gate}.weight"].shape) == (64, 128)
    assert tuple(tensors[f"{gate}.weight_scale"].shape) == (64, 256 // 32)
    quant = Runner(out).hf_config.quantization_config
    assert quant["quant_method"] == "quark" and quant["global_quant_config"]["input_tensors"]["dtype"] == "fp4"
    assert {"language_model.lm_head", "language_model.model.layers.0.self_attn.q_a_proj",
            "language_model.model.layers.2.mlp.shared_experts.down_proj", "language_model.model.layers.0.mlp.gate_proj",
            "vision_tower.encoder.blocks.1.wqkv", "mm_projector.proj.2"} <= set(quant["exclude"])

    runner = Runner(out)
    model = runner.model
    assert model.model.layers[2].mlp.experts.w13_weight.dtype == torch.uint8
    for layer in (model.model.layers[0].self_attn.q_a_proj, model.model.layers[2].mlp.shared_expert.down_proj,
                  model.vision_tower.blocks[1].attn.qkv, model.mm_projector.linear_fc2, model.lm_head):
        assert layer.weight.dtype == torch.float32, layer
    reference = reference_with_quantized_weights(
        hf_kimi(kimi_dir), out, "mxfp4", lambda name: re.sub(r"^model\.language_model\.", "language_model.model.", name))
    rel, max_abs, _ = logit_metrics(runner.prompt_logits(PROMPTS), reference_logits(reference, PROMPTS))
    assert rel <= 1e-5, f"vs the dequantized reference: relative logit error {rel:.2e} (max {max_abs:.2e})"
    images = random_images([[1, 4, 6]], seed=4)
    prompt = Prompt(with_image_placeholders(runner.hf_config, [5, 17, 99], images.image_grid_thw), images)
    check_multimodal(runner, reference, [prompt], max_new_tokens=3)
