"""gpt-oss against transformers' GptOssForCausalLM on tiny random checkpoints (fp32, CPU).

The tiny config (catalog) has a sliding-window layer (window 16: the longest parity prompt, 50 tokens, passes
it) and a full-attention layer, YaRN rope, 8 experts top-4.  transformers initialises sinks and biases to
values that could hide a bug (zeros), so every sink and bias is randomised before the checkpoint is saved.
Parity (``parity.check_model``): prefill logits of three prompts within 1e-4, the same greedy tokens, decode
log-probabilities within 1e-4 — with unquantized experts (fp32; on a GPU also the model run in bf16, within
twice transformers' own bf16 error), and with MXFP4 experts (the published ``*_blocks`` / ``*_scales`` layout, built
here and written by ``atom quantize --scheme mxfp4``) against transformers on the dequantized weights; transformers'
own MXFP4 reader loads ``atom quantize``'s output into the same weights and ATOM's logits.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import hf_model
from parity import BF16_LOGIT_ATOL, FP32_LOGIT_ATOL, PROMPTS, check_model, reference_logits
from safetensors.torch import load_file, save_file

from atom_core.errors import CheckpointError, UnsupportedConfigError
from atom_core.layers.moe import FusedMoE
from atom_core.models.gpt_oss import per_expert_tensors
from atom_kernels import formats

ARCH = "GptOssForCausalLM"
NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


@pytest.fixture(scope="session")
def gpt_oss_dir(tiny, tmp_path_factory) -> str:
    """The catalog's tiny gpt-oss with random sinks and biases (scaled to matter: sinks ~ N(0, 1))."""
    src = tiny(ARCH)
    dst = tmp_path_factory.getbasetemp() / "gpt-oss-random-sinks"
    if not (dst / "config.json").exists():
        model = hf_model(src)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith(("sinks", "bias")):
                    param.copy_(torch.randn(param.shape, generator=gen) * (1.0 if name.endswith("sinks") else 0.1))
        model.save_pretrained(str(dst))
        for extra in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(Path(src) / extra, dst / extra)
    return str(dst)


def _mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``w [E, N, K]`` -> gpt-oss ``blocks [E, N, K/32, 16]``, ``scales [E, N, K/32]`` and the dequantized weight."""
    packed, scales = formats.quantize_mxfp4(w)
    e, n, k = w.shape
    return packed.reshape(e, n, k // 32, 16), scales.view(torch.uint8), formats.dequantize_mxfp4(packed, scales)


@pytest.fixture(scope="session")
def gpt_oss_mxfp4(gpt_oss_dir, tmp_path_factory) -> tuple[str, str]:
    """(the MXFP4 checkpoint as published: experts as blocks/scales, quant_method mxfp4; the same model with the
    dequantized experts in bf16 layout, for transformers)."""
    base = tmp_path_factory.getbasetemp()
    quant, dequant = base / "gpt-oss-mxfp4", base / "gpt-oss-mxfp4-dequant"
    if not (quant / "config.json").exists():
        src = Path(gpt_oss_dir)
        tensors = load_file(str(src / "model.safetensors"))
        out, ref = {}, dict(tensors)
        for name, t in tensors.items():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                blocks, scales, deq = _mxfp4(t.transpose(1, 2).contiguous())  # stored in x out; MXFP4 groups run along in
                out[f"{name}_blocks"], out[f"{name}_scales"] = blocks, scales
                ref[name] = deq.transpose(1, 2).contiguous()
            else:
                out[name] = t
        config = json.loads((src / "config.json").read_text())
        for dst, data, cfg in ((quant, out, {**config, "quantization_config": {
                "quant_method": "mxfp4", "modules_to_not_convert": NOT_CONVERTED}}), (dequant, ref, config)):
            dst.mkdir()
            save_file(data, str(dst / "model.safetensors"), metadata={"format": "pt"})
            (dst / "config.json").write_text(json.dumps(cfg))
            for extra in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(src / extra, dst / extra)
    return str(quant), str(dequant)


def test_fp32_parity(gpt_oss_dir):
    runner = check_model(gpt_oss_dir, hf_model(gpt_oss_dir))
    layers = runner.model.model.layers
    assert [layer.self_attn.attn.sliding_window for layer in layers] == [16, None]
    assert layers[0].self_attn.sinks.abs().min() > 0 and layers[0].mlp.experts.w2_bias.abs().min() > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 runs on the GPU (as the other models' bf16 parity)")
def test_bf16_cuda_parity(gpt_oss_dir):
    """bf16 weights and activations: logits within twice transformers' own bf16 error (floor 0.1)."""
    check_model(gpt_oss_dir, hf_model(gpt_oss_dir), device="cuda", dtype=torch.bfloat16, atol=BF16_LOGIT_ATOL)


def test_mxfp4_experts_parity(gpt_oss_mxfp4):
    quant, dequant = gpt_oss_mxfp4
    runner = check_model(quant, hf_model(dequant))
    experts = [m for m in runner.model.modules() if isinstance(m, FusedMoE)]
    assert experts and all(m.w13_weight.dtype == torch.uint8 for m in experts)


@pytest.fixture(scope="session")
def quantized_mxfp4(gpt_oss_dir, tmp_path_factory) -> str:
    """``atom quantize --scheme mxfp4`` of the random-sinks checkpoint."""
    from atom_core.quant.quantize import quantize_checkpoint

    return str(quantize_checkpoint(gpt_oss_dir, tmp_path_factory.getbasetemp() / "gpt-oss-atom-quantize", "mxfp4"))


def test_atom_quantize_mxfp4_writes_the_published_layout(quantized_mxfp4, gpt_oss_mxfp4):
    """The experts only, as ``*_blocks`` / ``*_scales`` uint8 (the bytes of the hand-built published-layout checkpoint),
    every other tensor (expert biases included) copied, ``quant_method: mxfp4`` with ``modules_to_not_convert``; ATOM
    loads the experts as MXFP4 and everything else unquantized."""
    from atom_core.runtime.runner import Runner

    published, _ = gpt_oss_mxfp4
    got, want = load_file(f"{quantized_mxfp4}/model.safetensors"), load_file(f"{published}/model.safetensors")
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    blocks = got["model.layers.0.mlp.experts.gate_up_proj_blocks"]
    assert blocks.dtype == torch.uint8 and blocks.shape == (8, 2 * 96, 256 // 32, 16)
    assert got["model.layers.0.mlp.experts.down_proj_scales"].shape == (8, 256, 96 // 32)
    config = json.loads(Path(quantized_mxfp4, "config.json").read_text())["quantization_config"]
    assert config == {"quant_method": "mxfp4", "modules_to_not_convert": NOT_CONVERTED}
    runner = Runner(quantized_mxfp4)
    layer = runner.model.model.layers[0]
    assert layer.mlp.experts.w13_weight.dtype == torch.uint8 and layer.self_attn.qkv_proj.weight.dtype == torch.float32


def test_atom_quantize_mxfp4_parity(quantized_mxfp4, gpt_oss_mxfp4):
    """ATOM on ``atom quantize``'s output against transformers on the dequantized weights."""
    check_model(quantized_mxfp4, hf_model(gpt_oss_mxfp4[1]))


def test_transformers_loads_atom_quantize_mxfp4(quantized_mxfp4, gpt_oss_mxfp4):
    """transformers' own MXFP4 support (``Mxfp4Config(dequantize=True)``: its blocks/scales reader, on the CPU) reads
    the written checkpoint into the dequantized weights and gives ATOM's prompt logits."""
    import transformers

    from atom_core.runtime.runner import Runner

    hf = transformers.AutoModelForCausalLM.from_pretrained(
        quantized_mxfp4, quantization_config=transformers.Mxfp4Config(dequantize=True)).float().eval()
    reference = load_file(f"{gpt_oss_mxfp4[1]}/model.safetensors")
    state = hf.state_dict()
    for name in ("model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj",
                 "model.layers.1.mlp.experts.gate_up_proj_bias"):
        assert torch.equal(state[name], reference[name]), name
    for prompt, got, want in zip(PROMPTS, Runner(quantized_mxfp4).prompt_logits(PROMPTS), reference_logits(hf, PROMPTS)):
        err = (got - want).abs().max().item()
        assert err <= FP32_LOGIT_ATOL, f"prompt of {len(prompt)} tokens: max |Δlogit| {err:.2e}"


@pytest.mark.parametrize("overrides,message", [
    ({"intermediate_size": 80}, "gpt-oss MXFP4 experts need hidden_size and intermediate_size divisible by 32, "
                                "got intermediate_size 80"),
])
def test_atom_quantize_mxfp4_refuses_what_the_layout_cannot_hold(tiny, tmp_path, capsys, overrides, message):
    from atom_core.cli import main

    model = tiny(ARCH, **overrides)
    capsys.readouterr()
    rc = main(["quantize", "--model", model, "--scheme", "mxfp4", "--out", str(tmp_path / "q"), "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc == 4 and err == f"atom quantize: error: {message}\n" and not (tmp_path / "q").exists()


def test_stacked_experts_split_per_expert():
    """Interleaved gate|up columns: gate = even, up = odd; weights transposed to out x in."""
    e, h, i = 2, 4, 3
    gate_up = torch.arange(e * h * 2 * i, dtype=torch.float32).reshape(e, h, 2 * i)
    got = dict(per_expert_tensors([("m.experts.gate_up_proj", gate_up), ("m.experts.down_proj_bias", torch.ones(e, h)),
                                   ("m.norm.weight", torch.ones(h))]))
    assert torch.equal(got["m.experts.1.gate_proj.weight"], gate_up[1, :, 0::2].T)
    assert torch.equal(got["m.experts.1.up_proj.weight"], gate_up[1, :, 1::2].T)
    assert got["m.experts.0.down_proj.bias"].shape == (h,) and "m.norm.weight" in got


def test_blocks_without_scales_are_named():
    with pytest.raises(CheckpointError, match=r"\*_scales missing: m\.experts\.down_proj"):
        list(per_expert_tensors([("m.experts.down_proj_blocks", torch.zeros(2, 4, 1, 16, dtype=torch.uint8))]))


def test_other_swiglu_constants_are_refused(tiny):
    from atom_core.runtime.runner import Runner

    with pytest.raises(UnsupportedConfigError, match="swiglu_limit = 5.0"):
        Runner(tiny(ARCH, swiglu_limit=5.0))


@pytest.mark.parametrize("world,expert_parallel", [(2, False), (3, True)])
def test_parallel_ranks_add_up(world, expert_parallel):
    """Tensor parallelism (each rank: a slice of every expert's intermediate features and of the biases of
    gate|up; the down bias added by rank 0 only) and expert parallelism: the ranks' outputs sum to one rank's."""
    from types import SimpleNamespace

    from atom_core.host import SingleRank
    from atom_core.loader import load_weights
    from atom_core.models.gpt_oss import GPT_OSS_MAPPER, GptOssMoE

    experts, hidden, inter = 6, 64, 96
    text = SimpleNamespace(num_local_experts=experts, num_experts_per_tok=4, intermediate_size=inter)
    gen = torch.Generator().manual_seed(world)
    tensors = {"experts.gate_up_proj": torch.randn(experts, hidden, 2 * inter, generator=gen) * 0.2,
               "experts.gate_up_proj_bias": torch.randn(experts, 2 * inter, generator=gen),
               "experts.down_proj": torch.randn(experts, inter, hidden, generator=gen) * 0.1,
               "experts.down_proj_bias": torch.randn(experts, hidden, generator=gen),
               "router.weight": torch.randn(experts, hidden, generator=gen), "router.bias": torch.randn(experts, generator=gen)}

    def block(rank: int, size: int) -> GptOssMoE:
        host = SimpleNamespace(tp=SingleRank(rank, size), quant=None, expert_parallel=expert_parallel)
        moe = GptOssMoE(hidden, text, host=host, prefix="")
        load_weights(moe, per_expert_tensors(tensors.items()), GPT_OSS_MAPPER)
        return moe

    x = torch.randn(11, hidden, generator=gen)
    want = block(0, 1)(x)
    torch.testing.assert_close(sum(block(rank, world)(x) for rank in range(world)), want, rtol=1e-5, atol=1e-5)


def test_vllms_spelling_of_the_scheme_parses():
    """vLLM hands its models the config with ``quant_method: gpt_oss_mxfp4`` (its rename of ``mxfp4``)."""
    from types import SimpleNamespace

    from atom_core.quant import parse_quant_config
    from atom_core.quant.mxfp4 import GptOssMxfp4Config

    for method in ("mxfp4", "gpt_oss_mxfp4"):
        config = SimpleNamespace(quantization_config={"quant_method": method, "modules_to_not_convert": NOT_CONVERTED})
        assert isinstance(parse_quant_config(config), GptOssMxfp4Config)


def test_sinks_are_stored_in_the_hosts_dtype(tiny):
    """Attention sinks take the dtype the host's attention reads (vLLM's backends: the model's dtype, bf16 on a GPU,
    where FlashAttention-3 refuses fp32 sinks); the checkpoint's values load into it."""
    from atom_core.config import load_hf_config
    from atom_core.loader import Checkpoint
    from atom_core.models.gpt_oss import GptOssForCausalLM
    from atom_core.runtime.host import NativeHost

    model_dir = tiny("GptOssForCausalLM")

    class Bf16SinksHost(NativeHost):
        attention_sinks_dtype = torch.bfloat16

    for host, dtype in ((NativeHost(), torch.float32), (Bf16SinksHost(), torch.bfloat16)):
        model = GptOssForCausalLM(load_hf_config(model_dir), host)
        model.load_weights(Checkpoint(model_dir))
        sinks = [m.sinks for m in model.modules() if getattr(m, "sinks", None) is not None]
        assert sinks and {s.dtype for s in sinks} == {dtype}
        stored = load_file(f"{model_dir}/model.safetensors")["model.layers.0.self_attn.sinks"]
        torch.testing.assert_close(sinks[0].float(), stored.to(dtype).float(), rtol=0, atol=0)
