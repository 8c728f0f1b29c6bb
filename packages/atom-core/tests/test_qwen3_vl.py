"""Qwen3-VL against transformers on a tiny random checkpoint: text-only prompts (prefill logits, greedy
tokens, decode log-probabilities) and prompts with images (the same, through the vision tower, interleaved
MRoPE positions and deepstack), the kernels' Triton path, and ``atom generate --image``."""

import inspect
import json

import numpy as np
import pytest
import torch
from parity import BF16_LOGIT_ATOL, FP32_LOGIT_ATOL, check_model

from atom_core import catalog
from atom_core.runtime.multimodal import Prompt, load_images, with_image_placeholders
from atom_core.runtime.runner import Runner
from atom_core.runtime.sampler import SamplingParams

ARCH = "Qwen3VLForConditionalGeneration"
# (height, width) in pixels; the tiny processor resizes to multiples of 16 (8-pixel patches, 2x2 merge)
IMAGE_SIZES = [(40, 52), (30, 70), (64, 20)]


def hf_vl_model(model_dir, dtype=torch.float32, device="cpu"):
    return catalog.get(ARCH).hf_model_class().from_pretrained(model_dir, dtype=dtype).to(device).eval()


@pytest.fixture(scope="module")
def image_files(tmp_path_factory):
    rng = np.random.default_rng(0)
    out = tmp_path_factory.mktemp("images")
    paths = []
    for i, (h, w) in enumerate(IMAGE_SIZES):
        path = out / f"image{i}.png"
        from PIL import Image

        Image.fromarray((rng.random((h, w, 3)) * 255).astype("uint8")).save(path)
        paths.append(str(path))
    return paths


def image_prompts(model_dir, hf_config, image_files):
    """A batch mixing a two-image prompt, a text-only prompt and a one-image prompt."""
    two = load_images(model_dir, image_files[:2])
    one = load_images(model_dir, image_files[2:])
    return [
        Prompt(with_image_placeholders(hf_config, [5, 17, 99, 3], two.image_grid_thw), two),
        Prompt([11, 300, 7]),
        Prompt(with_image_placeholders(hf_config, [42], one.image_grid_thw), one),
    ]


def hf_image_kwargs(hf, ids: torch.Tensor, prompt: Prompt, device) -> dict:
    """The image arguments of transformers' forward (``mm_token_type_ids`` where its signature takes them)."""
    if prompt.images is None:
        return {}
    kwargs = dict(pixel_values=prompt.images.pixel_values.to(device), image_grid_thw=prompt.images.image_grid_thw.to(device))
    if "mm_token_type_ids" in inspect.signature(hf.forward).parameters:
        kwargs["mm_token_type_ids"] = (ids == hf.config.image_token_id).int()
    return kwargs


@torch.inference_mode()
def hf_logits(hf, prompt: Prompt, extra_tokens=(), device="cpu"):
    """transformers' logits over ``prompt`` (+ ``extra_tokens`` of text), images included."""
    ids = torch.tensor([prompt.token_ids + list(extra_tokens)], device=device)
    return hf(input_ids=ids, **hf_image_kwargs(hf, ids, prompt, device)).logits[0].float().cpu()


@torch.inference_mode()
def hf_greedy(hf, prompt: Prompt, max_new_tokens, device="cpu"):
    ids = torch.tensor([prompt.token_ids], device=device)
    kwargs = hf_image_kwargs(hf, ids, prompt, device)
    out = hf.generate(input_ids=ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None,
                      pad_token_id=0, **kwargs)
    return out[0, len(prompt.token_ids):].tolist()


def check_multimodal(runner, hf, prompts, *, atol=FP32_LOGIT_ATOL, max_new_tokens=6, device="cpu"):
    """Prefill logits of the batch, then greedy tokens and their log-probabilities, against transformers."""
    for prompt, got in zip(prompts, runner.prompt_logits(prompts)):
        err = (got.cpu() - hf_logits(hf, prompt, device=device)).abs().max().item()
        assert err <= atol, f"prompt of {len(prompt.token_ids)} tokens: max |Δlogit| {err:.2e} > {atol}"
    outputs = runner.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True))
    for prompt, out in zip(prompts, outputs):
        want = hf_greedy(hf, prompt, max_new_tokens, device=device)
        ref = torch.log_softmax(hf_logits(hf, prompt, want[:-1], device=device)[len(prompt.token_ids) - 1 :], dim=-1)
        for step, (mine, theirs) in enumerate(zip(out.token_ids, want)):
            if mine != theirs:
                gap = (ref[step, theirs] - ref[step, mine]).item()
                assert gap <= 2 * atol, f"step {step}: token {mine} != {theirs} (reference gap {gap:.2e})"
                break
            assert abs(out.logprobs[step] - ref[step, mine].item()) <= atol, f"step {step}: logprob differs"


def test_text_only_parity(tiny):
    model_dir = tiny(ARCH)
    runner = check_model(model_dir, hf_vl_model(model_dir))
    assert runner.position_rows == 3


def test_image_parity(tiny, image_files):
    model_dir = tiny(ARCH)
    runner = Runner(model_dir)
    prompts = image_prompts(model_dir, runner.hf_config, image_files)
    assert sum(p.images is not None for p in prompts) == 2
    check_multimodal(runner, hf_vl_model(model_dir), prompts)


def test_tied_embeddings_and_no_deepstack(tiny, image_files):
    model_dir = tiny(ARCH, tie_word_embeddings=True, vision_config={"deepstack_visual_indexes": []})
    runner = Runner(model_dir)
    assert runner.model.lm_head.weight is runner.model.model.language_model.embed_tokens.weight
    check_multimodal(runner, hf_vl_model(model_dir), image_prompts(model_dir, runner.hf_config, image_files)[:1],
                     max_new_tokens=3)


def test_dense_deepstack_form(tiny, image_files, monkeypatch):
    """The fixed-shape deepstack form (features over every token, zeros at text) gives the same logits."""
    model_dir = tiny(ARCH)
    runner = Runner(model_dir)
    prompts = image_prompts(model_dir, runner.hf_config, image_files)
    ref = runner.prompt_logits(prompts)
    sparse = runner.model.deepstack_inputs
    monkeypatch.setattr(runner.model, "deepstack_inputs", lambda items, is_mm: sparse(items, is_mm, dense=True))
    for got, want in zip(runner.prompt_logits(prompts), ref):
        assert (got - want).abs().max().item() < 1e-5


def test_triton_kernels_through_the_model(tiny, image_files, monkeypatch):
    """Every op forced onto its Triton kernel (CPU interpreter): MRoPE fused with q/k norm in the decoder,
    the vision tower's 2-D rotary through the same kernel, and the same logits."""
    model_dir = tiny(ARCH)
    ref_runner = Runner(model_dir)
    prompt = image_prompts(model_dir, ref_runner.hf_config, image_files)[2]
    ref = ref_runner.prompt_logits([prompt])[0]
    monkeypatch.setenv("ATOM_KERNEL_BACKEND", "triton")
    out = Runner(model_dir).prompt_logits([prompt])[0]
    assert (out - ref).abs().max().item() < 1e-4


def test_cli_generate_with_image(tiny, image_files, capsys):
    from atom_core.cli import main

    model_dir = tiny(ARCH)
    assert main(["generate", "--model", model_dir, "--prompt-token-ids", "5,17,99", "--image", image_files[0],
                 "--max-new-tokens", "4", "--ignore-eos", "--dtype", "float32", "--device", "cpu", "--json"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["token_ids"]
    images = load_images(model_dir, image_files[:1])
    prompt = Prompt(with_image_placeholders(Runner(model_dir).hf_config, [5, 17, 99], images.image_grid_thw), images)
    assert got == hf_greedy(hf_vl_model(model_dir), prompt, 4)


def test_cli_rejects_images_for_text_models(tiny, image_files, capsys):
    from atom_core.cli import main

    assert main(["generate", "--model", tiny("Qwen3ForCausalLM"), "--prompt-token-ids", "1,2", "--image", image_files[0],
                 "--dtype", "float32", "--device", "cpu"]) == 2
    assert "atom generate: error: Qwen3ForCausalLM does not take images (--image)" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_bf16_cuda_parity(tiny, image_files):
    model_dir = tiny(ARCH)
    runner = Runner(model_dir, device="cuda", dtype=torch.bfloat16)
    prompts = image_prompts(model_dir, runner.hf_config, image_files)
    check_multimodal(runner, hf_vl_model(model_dir, device="cuda"), prompts, atol=BF16_LOGIT_ATOL, device="cuda")


@pytest.mark.parametrize("hf_class", ["Qwen3VLVisionModel", "Qwen3_5VisionModel"])
def test_vision_tower_matches_transformers(hf_class):
    """ATOM's vision tower against transformers' on the same random weights: two images and a two-frame-group
    video (attention within each frame group); Qwen3.5's tower is Qwen3-VL's without deepstack."""
    import transformers

    from atom_core.loader import WeightMapper, load_weights
    from atom_core.models.qwen3_vl_vision import VisionModel
    from atom_core.runtime.host import NativeHost

    vision = dict(catalog.get(ARCH).tiny["vision_config"])
    if hf_class == "Qwen3_5VisionModel":
        vision.pop("deepstack_visual_indexes")
        config = transformers.Qwen3_5VisionConfig(**vision)
    else:
        config = transformers.Qwen3VLVisionConfig(**vision)
    torch.manual_seed(0)
    hf = getattr(transformers, hf_class)(config).eval()
    atom = VisionModel(config, host=NativeHost(), prefix="")
    load_weights(atom, hf.state_dict().items(), WeightMapper(renames=((r"^patch_embed\.proj\.", "patch_embed."),)))
    grid = torch.tensor([[1, 4, 6], [1, 2, 2], [2, 4, 4]])
    patch_dim = config.in_channels * config.temporal_patch_size * config.patch_size**2
    pixels = torch.randn(int(grid.prod(-1).sum()), patch_dim)
    with torch.inference_mode():
        want = hf(pixels, grid_thw=grid)
        embeds, deepstack = atom(pixels, grid)
    torch.testing.assert_close(embeds, want.pooler_output, rtol=0, atol=1e-5)
    want_deepstack = getattr(want, "deepstack_features", None) or []
    assert len(deepstack) == len(want_deepstack) == len(getattr(config, "deepstack_visual_indexes", ()))
    for got, ref in zip(deepstack, want_deepstack):
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)


def _tp_rank(rank: int, port: int, model_dir: str, prompts, out_path: str) -> None:
    import os

    import torch.distributed as dist
    from test_tensor_parallel import WORLD

    from atom_core.host import TorchDistributedTP

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        runner = Runner(model_dir, tp=TorchDistributedTP())
        torch.save({"logits": runner.prompt_logits(prompts),
                    "vision_qkv": tuple(runner.model.model.visual.blocks[0].attn.qkv.weight.shape)}, f"{out_path}.{rank}")
    finally:
        dist.destroy_process_group()


def test_tp2_with_images(tiny, image_files, tmp_path):
    """Two CPU ranks (gloo): the vision tower and the decoder split over tensor parallelism give
    transformers' logits on a batch with images."""
    import torch.multiprocessing as mp
    from test_tensor_parallel import WORLD, _free_port

    model_dir = tiny(ARCH)
    prompts = image_prompts(model_dir, Runner(model_dir).hf_config, image_files)
    out = str(tmp_path / "tp")
    mp.spawn(_tp_rank, args=(_free_port(), model_dir, prompts, out), nprocs=WORLD, join=True)
    hf = hf_vl_model(model_dir)
    for rank in range(WORLD):
        result = torch.load(f"{out}.{rank}")
        assert result["vision_qkv"] == (3 * 64 // WORLD, 64)  # each rank holds half the vision heads
        for prompt, got in zip(prompts, result["logits"]):
            assert (got - hf_logits(hf, prompt)).abs().max().item() <= FP32_LOGIT_ATOL, f"rank {rank}"
