"""Qwen3.5 and Qwen3.5-MoE against transformers' ``Qwen3_5ForConditionalGeneration`` /
``Qwen3_5MoeForConditionalGeneration`` on tiny random checkpoints (fp32, CPU).

The checkpoints are written by ``atom make-tiny`` (transformers' ``save_pretrained``: per-expert MoE
tensors, separate ``in_proj_qkv``/``in_proj_z``/``in_proj_b``/``in_proj_a``), then the parameters
transformers' initialisation leaves degenerate are randomised as in ``test_qwen3_next`` (zero-centred norm
weights, the gated norm, ``A_log``, ``dt_bias``; the vision tower's LayerNorm weights).  The tiny text
model has Qwen3.5's attention shape: head 256, rotary 64 (``partial_rotary_factor`` 0.25), MRoPE
sections (11, 11, 10) interleaved; layers GDN, attention, GDN, attention.

* text-only: prefill logits of three prompts (2, 7 and 50 tokens) in one batch within 1e-4, greedy
  tokens and their decode log-probabilities within 1e-4 (``parity.check_model``);
* with images: a batch of a two-image prompt, a text prompt and a one-image prompt (vision tower,
  placeholder merging, MRoPE prompt positions and the decode delta), the same three checks;
* every op on its Triton kernel (interpreter), counting the MRoPE kernel's calls with q strided beside
  its gate and the zero-centred q/k norm fused;
* the loader: each tensor-parallel rank's fused ``[q | k | v | z]`` / ``[b | a]`` rows against
  transformers' separate projections; stacked-expert checkpoints; tied embeddings;
* bf16 parity on a GPU (skipped without one).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from parity import BF16_LOGIT_ATOL, FP32_LOGIT_ATOL, PROMPTS, check_model, reference_logits
from safetensors.torch import save_file
from test_qwen3_next import _FakeTP, _randomise_degenerate_params
from test_qwen3_vl import check_multimodal, hf_logits, image_files, image_prompts  # noqa: F401  (image_files: a fixture)

from atom_core import catalog
from atom_core.layers.gdn import GatedDeltaNet
from atom_core.layers.moe import SparseMoeBlock
from atom_core.layers.rotary import MRotaryEmbedding
from atom_core.models.llama import GatedMLP
from atom_core.runtime.runner import Runner
from atom_kernels import OPS

DENSE, MOE = "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"
ARCHS = [DENSE, MOE]
LAYER_TYPES = ["linear_attention", "full_attention", "linear_attention", "full_attention"]


def load_hf(arch: str, model_dir: str, dtype=torch.float32, device="cpu"):
    return catalog.get(arch).hf_model_class().from_pretrained(model_dir, dtype=dtype).to(device).eval()


@pytest.fixture(scope="session")
def q35_dir(tiny, tmp_path_factory):
    """``q35_dir(arch, **overrides)``: a tiny checkpoint with the degenerate parameters randomised."""
    built: dict[tuple, str] = {}

    def build(arch: str, **overrides) -> str:
        key = (arch, repr(sorted(overrides.items())))
        if key not in built:
            dst = tmp_path_factory.getbasetemp() / f"{arch}-randomised-{len(built)}"
            built[key] = _randomise_degenerate_params(tiny(arch, **overrides), dst, load=lambda d: load_hf(arch, d))
        return built[key]

    return build


@pytest.mark.parametrize("arch", ARCHS)
def test_text_only_parity(q35_dir, arch):
    model_dir = q35_dir(arch)
    runner = check_model(model_dir, load_hf(arch, model_dir), max_new_tokens=6)
    assert runner.position_rows == 3
    layers = runner.model.model.language_model.layers
    assert [layer.layer_type for layer in layers] == LAYER_TYPES
    assert all(isinstance(layers[i].linear_attn, GatedDeltaNet) for i in (0, 2))
    rope = layers[1].self_attn.rotary_emb
    assert isinstance(rope, MRotaryEmbedding)
    assert (rope.head_size, rope.rotary_dim, rope.mrope_section, rope.interleaved) == (256, 64, (11, 11, 10), True)
    assert all(isinstance(layer.mlp, SparseMoeBlock if arch == MOE else GatedMLP) for layer in layers)
    assert len(runner.host.state_pool.ssm) == 2


@pytest.mark.parametrize("arch", ARCHS)
def test_image_parity(q35_dir, image_files, arch):  # noqa: F811
    model_dir = q35_dir(arch)
    runner = Runner(model_dir)
    prompts = image_prompts(model_dir, runner.hf_config, image_files)
    assert sum(p.images is not None for p in prompts) == 2
    check_multimodal(runner, load_hf(arch, model_dir), prompts, max_new_tokens=4)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="runs the Triton kernels on CPU tensors (interpreter)")
def test_triton_kernels_through_the_model(q35_dir, image_files, monkeypatch):  # noqa: F811
    """Every op forced onto its Triton kernel (CPU interpreter) gives the logits of the reference kernels on
    a prompt with an image; the MRoPE kernel (not a fallback) runs in both attention layers — q strided
    beside its gate, zero-centred q/k norms fused — and in both vision blocks."""
    model_dir = q35_dir(MOE)
    ref_runner = Runner(model_dir)
    prompt = image_prompts(model_dir, ref_runner.hf_config, image_files)[2]
    want = ref_runner.prompt_logits([prompt])[0]
    monkeypatch.setenv("ATOM_KERNEL_BACKEND", "triton")
    counted = ("mrope", "chunk_gated_delta_rule", "fused_moe")
    calls = dict.fromkeys(counted, 0)
    for op in counted:
        fn, unsupported = OPS[op].implementation("triton")

        def count(*args, _fn=fn, _op=op, **kwargs):
            calls[_op] += 1
            return _fn(*args, **kwargs)

        monkeypatch.setitem(OPS[op]._impls, "triton", (count, unsupported))
    got = Runner(model_dir).prompt_logits([prompt])[0]
    assert (got - want).abs().max().item() <= FP32_LOGIT_ATOL
    assert calls == {"mrope": 2 + 2, "chunk_gated_delta_rule": 2, "fused_moe": 4}


def test_loader_splits_separate_projections(q35_dir):
    """Each of two ranks holds ``[q | k | v | z]`` and ``[b | a]`` of its own key head and value heads, equal
    to transformers' separate projections, and its channels of the conv weight."""
    model_dir = q35_dir(DENSE)
    ref = load_hf(DENSE, model_dir).model.language_model.layers[0].linear_attn
    x = torch.randn(5, 256)
    with torch.no_grad():
        q, k, v = ref.in_proj_qkv(x).split([64, 64, 128], dim=-1)
        z, b, a = ref.in_proj_z(x), ref.in_proj_b(x), ref.in_proj_a(x)
    world = 2
    for rank in range(world):
        layer = Runner(model_dir, tp=_FakeTP(rank, world)).model.model.language_model.layers[0].linear_attn
        with torch.no_grad():
            qkvz, ba = layer.in_proj_qkvz(x), layer.in_proj_ba(x)
        hk, hv = slice(32 * rank, 32 * (rank + 1)), slice(64 * rank, 64 * (rank + 1))  # key head dim 32, 2 value heads of 32
        torch.testing.assert_close(qkvz, torch.cat([q[:, hk], k[:, hk], v[:, hv], z[:, hv]], dim=1))
        heads = slice(2 * rank, 2 * rank + 2)
        torch.testing.assert_close(ba, torch.cat([b[:, heads], a[:, heads]], dim=1))
        channels = torch.cat([torch.arange(32) + 32 * rank, 64 + torch.arange(32) + 32 * rank, 128 + torch.arange(64) + 64 * rank])
        torch.testing.assert_close(layer.conv1d.weight.data, ref.conv1d.weight.data[channels])


def test_checkpoint_names():
    """The Hub's names: separate GDN projections into the fused ones (shard = checkpoint name; hosts get
    vLLM's ``packed_modules_mapping``), stacked experts, multi-token-prediction weights skipped."""
    from atom_core.loader.mapper import Target
    from atom_core.models.qwen3_5 import Qwen3_5MoeForConditionalGeneration

    mapper = Qwen3_5MoeForConditionalGeneration.weight_mapper
    gdn = "model.language_model.layers.0.linear_attn"
    assert mapper.map(f"{gdn}.in_proj_qkv.weight") == [Target(f"{gdn}.in_proj_qkvz.weight", "in_proj_qkv")]
    assert mapper.map(f"{gdn}.in_proj_a.weight") == [Target(f"{gdn}.in_proj_ba.weight", "in_proj_a")]
    assert mapper.map("model.language_model.layers.3.mlp.experts.gate_up_proj") == [
        Target("model.language_model.layers.3.mlp.experts.w13_weight")]
    assert mapper.map("model.visual.patch_embed.proj.weight") == [Target("model.visual.patch_embed.weight")]
    assert mapper.map("mtp.layers.0.mlp.experts.0.up_proj.weight") is None
    packed = Qwen3_5MoeForConditionalGeneration.packed_modules_mapping()
    assert packed["in_proj_qkvz"] == ["in_proj_qkv", "in_proj_z"] and packed["in_proj_ba"] == ["in_proj_b", "in_proj_a"]


def test_missing_projection_is_named():
    """The coverage check counts the separate checkpoint tensors: a checkpoint without ``in_proj_z`` fails
    and names it."""
    from atom_core.errors import CheckpointError
    from atom_core.layers.gdn import QWEN3_5_CHECKPOINT, GDNConfig, packed_modules
    from atom_core.loader import WeightMapper, load_weights
    from atom_core.runtime.host import NativeHost

    cfg = GDNConfig(hidden_size=16, num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=8, conv_kernel=4, rms_norm_eps=1e-6)
    layer = GatedDeltaNet(cfg, 0, host=NativeHost(), prefix="", checkpoint=QWEN3_5_CHECKPOINT)
    shapes = {"in_proj_qkv.weight": (64, 16), "in_proj_b.weight": (4, 16), "in_proj_a.weight": (4, 16),
              "conv1d.weight": (64, 1, 4), "A_log": (4,), "dt_bias": (4,), "norm.weight": (8,), "out_proj.weight": (16, 32)}
    tensors = {name: torch.randn(shape) for name, shape in shapes.items()}
    mapper = WeightMapper(packed=packed_modules(QWEN3_5_CHECKPOINT))
    with pytest.raises(CheckpointError, match=r"in_proj_qkvz\.weight \(shards \['in_proj_z'\] never written\)"):
        load_weights(layer, tensors.items(), mapper)
    load_weights(layer, {**tensors, "in_proj_z.weight": torch.randn(32, 16)}.items(), mapper)


def test_stacked_expert_checkpoint(q35_dir, tmp_path):
    """transformers 5's in-memory layout (``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj``), which
    some Hub checkpoints ship, loads to the same model as the per-expert tensors ``save_pretrained`` writes."""
    src = Path(q35_dir(MOE))
    state = {k: v.contiguous() for k, v in load_hf(MOE, str(src)).state_dict().items()}
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in state)
    save_file(state, str(tmp_path / "model.safetensors"))
    for extra in ("config.json", "tokenizer.json", "tokenizer_config.json", "preprocessor_config.json"):
        shutil.copy(src / extra, tmp_path / extra)
    for got, want in zip(Runner(tmp_path).prompt_logits(PROMPTS[:2]), Runner(src).prompt_logits(PROMPTS[:2])):
        assert (got - want).abs().max().item() <= 1e-6


def test_tied_embeddings(q35_dir):
    model_dir = q35_dir(DENSE, tie_word_embeddings=True)
    runner = Runner(model_dir)
    assert runner.model.lm_head.weight is runner.model.model.language_model.embed_tokens.weight
    for got, want in zip(runner.prompt_logits(PROMPTS), reference_logits(load_hf(DENSE, model_dir), PROMPTS)):
        assert (got - want).abs().max().item() <= FP32_LOGIT_ATOL


def test_default_mrope_section_is_transformers():
    """A config whose rope parameters omit ``mrope_section`` gets the sections transformers' Qwen3.5 assumes."""
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding

    from atom_core.runtime.host import NativeHost
    from atom_core.tiny import tiny_config

    config = tiny_config(DENSE)
    del config.text_config.rope_parameters["mrope_section"]
    want = tuple(Qwen3_5TextRotaryEmbedding(config.text_config).mrope_section)
    model = catalog.get(DENSE).model_class()(config, NativeHost())
    assert model.model.language_model.layers[1].self_attn.rotary_emb.mrope_section == want == (11, 11, 10)


def test_vision_tower_has_no_deepstack_whatever_the_config_says():
    """transformers' Qwen3.5 tower has no deepstack blocks; config classes derived from Qwen3-VL's (SGLang's
    ``Qwen3_5VisionConfig``) default ``deepstack_visual_indexes`` to [8, 16, 24] when the checkpoint omits it."""
    from atom_core.runtime.host import NativeHost
    from atom_core.tiny import tiny_config

    config = tiny_config(DENSE)
    config.vision_config.deepstack_visual_indexes = [0, 1]
    visual = catalog.get(DENSE).model_class()(config, NativeHost()).model.visual
    assert visual.config.deepstack_indexes == () and len(visual.deepstack_merger_list) == 0
    assert not any("deepstack" in name for name, _ in visual.named_parameters())


def test_cli_generate_with_image(q35_dir, image_files, capsys):  # noqa: F811
    """``atom generate --image`` gives transformers' greedy tokens for the image prompt."""
    import json

    from test_qwen3_vl import hf_greedy

    from atom_core.cli import main
    from atom_core.runtime.multimodal import Prompt, load_images, with_image_placeholders

    model_dir = q35_dir(DENSE)
    assert main(["generate", "--model", model_dir, "--prompt-token-ids", "5,17,99", "--image", image_files[1],
                 "--max-new-tokens", "3", "--ignore-eos", "--dtype", "float32", "--device", "cpu", "--json"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["token_ids"]
    images = load_images(model_dir, image_files[1:2])
    prompt = Prompt(with_image_placeholders(Runner(model_dir).hf_config, [5, 17, 99], images.image_grid_thw), images)
    assert got == hf_greedy(load_hf(DENSE, model_dir), prompt, 3)


@pytest.mark.parametrize("arch", ARCHS)
def test_make_tiny_command(tmp_path, arch):
    from atom_core.cli import main

    assert main(["make-tiny", arch, str(tmp_path / "tiny")]) == 0
    assert Runner(tmp_path / "tiny").spec.name == arch


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_cuda_parity(q35_dir, image_files, arch):  # noqa: F811
    """bf16 on the GPU against transformers in fp32, within the larger of ``BF16_LOGIT_ATOL`` and twice
    transformers' own bf16 error (on the CPU the tiny MoE's own bf16 error is ≈ 0.2 on text and ≈ 0.08 with
    images: routing flips between near-tied experts; ATOM's was the same within 5%)."""
    model_dir = q35_dir(arch)
    check_model(model_dir, load_hf(arch, model_dir), device="cuda", dtype=torch.bfloat16, atol=BF16_LOGIT_ATOL)
    runner = Runner(model_dir, device="cuda", dtype=torch.bfloat16)
    prompts = image_prompts(model_dir, runner.hf_config, image_files)
    hf, hf_bf16 = load_hf(arch, model_dir, device="cuda"), load_hf(arch, model_dir, torch.bfloat16, device="cuda")
    own = max((hf_logits(hf_bf16, p, device="cuda") - hf_logits(hf, p, device="cuda")).abs().max().item() for p in prompts)
    check_multimodal(runner, hf, prompts, atol=max(BF16_LOGIT_ATOL, 2 * own), device="cuda")
