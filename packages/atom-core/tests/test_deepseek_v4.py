"""DeepSeek-V4 (``DeepseekV4ForCausalLM``) against transformers' reference (eager), native runner only.

* Parity (fp32, CPU): prefill logits within 1e-4 for prompts of 7, 2 and 50 tokens, then greedy decoding through
  the runner's caches, each step's token and log-probability against transformers' forward over the whole
  sequence so far (a cached decode must give what the full forward gives).  The tiny checkpoint has one sliding-
  window, one CSA and one HCA layer, a hash-routed layer, random sinks, window biases (``ape``), hyper-connection
  vectors, norms, correction biases and token -> expert table; the 50-token prompt passes the window (8), the
  indexer's top-k (3 of 12 CSA entries) and 6 HCA entries, and the decode steps close new windows.
* The prefill through the Triton kernels (interpreted) of every op the model calls.
* Decode steps padded to a graph bucket (eager on the CPU) give the same tokens.
* The same check fails when the indexer's selection is ignored (every entry selected), when the entries are left
  out, and when either the routed or the shared experts' SwiGLU clamp (``swiglu_limit`` 0.2 here) is lifted, so
  the parity above depends on each.
* transformers' own save_pretrained names (under "model.") load as DeepSeek's published names (the tiny's) do.
* A token -> expert table naming a missing expert, and a layer type ATOM does not know, are refused.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from parity import PROMPTS, reference_logits

from atom_core.errors import CheckpointError, UnsupportedConfigError
from atom_core.runtime.compressed_attention import CompressedAttention
from atom_core.runtime.sampler import SamplingParams
from atom_core.tiny import save_reference

ARCH = "DeepseekV4ForCausalLM"
ATOL = 1e-4  # fp32: ATOM and transformers differ in summation order only
NEW_TOKENS = 9  # the 7-token prompt's decode closes CSA windows at 7, 11, 15 and the first HCA window at 7
WINDOW, TOPK = 8, 3  # the tiny config's sliding window and index_topk


def randomized(src: str, dst: Path) -> str:
    """A copy of the tiny checkpoint whose vectors transformers starts at zero or one (sinks, ``ape``, the
    hyper-connections' bases and scales, norms, correction biases) are random and whose hash routers' token ->
    expert tables pick distinct random experts (transformers starts them all at expert 0)."""
    if not (dst / "config.json").exists():
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, tensor in model.state_dict().items():
                if name.endswith("tid2eid"):
                    experts = model.config.n_routed_experts
                    tensor.copy_(torch.stack([torch.randperm(experts, generator=gen)[: tensor.shape[1]]
                                              for _ in range(tensor.shape[0])]))
                elif tensor.is_floating_point() and (tensor.dim() == 1 or name.endswith("position_bias")):
                    tensor.add_(torch.randn(tensor.shape, generator=gen) * 0.3)
        save_reference(model, ARCH, dst)
        for extra in Path(src).glob("tokenizer*"):
            shutil.copy(extra, dst / extra.name)
    return str(dst)


@pytest.fixture(scope="module")
def v4_dir(tiny, tmp_path_factory):
    return randomized(tiny(ARCH), tmp_path_factory.getbasetemp() / "deepseek-v4-random")


@pytest.fixture(scope="module")
def reference(v4_dir):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(v4_dir, dtype=torch.float32,
                                                             attn_implementation="eager").eval()


def check_v4(model_dir: str, hf, max_new_tokens: int = NEW_TOKENS):
    """Prefill logits, then each greedy decode step's token and log-probability, against the reference."""
    from atom_core.runtime.runner import Runner

    runner = Runner(model_dir, device="cpu", dtype=torch.float32)
    for prompt, got, want in zip(PROMPTS, runner.prompt_logits(PROMPTS), reference_logits(hf, PROMPTS)):
        err = (got - want).abs().max().item()
        assert err <= ATOL, f"prompt of {len(prompt)} tokens: max |Δlogit| {err:.2e}"
    outputs = runner.generate(PROMPTS, SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True))
    for prompt, out in zip(PROMPTS, outputs):
        assert len(out.token_ids) == len(out.logprobs) == max_new_tokens
        with torch.inference_mode():
            logits = hf(torch.tensor([prompt + out.token_ids[:-1]])).logits[0, len(prompt) - 1:]
        logprobs = torch.log_softmax(logits, dim=-1)
        for step, token in enumerate(out.token_ids):
            best = logits[step].argmax().item()
            gap = (logits[step, best] - logits[step, token]).item()
            assert gap <= 2 * ATOL, f"prompt of {len(prompt)}, step {step}: token {token}, reference {best}"
            err = abs(out.logprobs[step] - logprobs[step, token].item())
            assert err <= ATOL, f"prompt of {len(prompt)}, step {step}: log-probability off by {err:.2e}"
    return runner


def test_prompts_pass_the_window_and_the_top_k():
    longest = max(len(p) for p in PROMPTS)
    assert longest > WINDOW and longest // 4 > TOPK and longest // 8 >= 6


def test_deepseek_v4_parity(v4_dir, reference):
    runner = check_v4(v4_dir, reference)
    layers = [m for m in runner.model.modules() if isinstance(m, CompressedAttention)]
    assert [(layer.rate, layer.window, layer.spec.indexer is not None) for layer in layers] == [(4, 8, True),
                                                                                                (8, 8, False)]
    assert runner.model.model.layers[0].ffn.gate.tid2eid.unique().numel() == 8  # hash routing over every expert


def test_padded_decode_steps_equal_eager(v4_dir):
    """The decode steps the runner pads to a graph bucket (run eagerly on the CPU) give the eager steps' tokens."""
    from atom_core.runtime.runner import Runner

    params = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    eager = Runner(v4_dir, device="cpu", dtype=torch.float32).generate(PROMPTS, params)
    padded = Runner(v4_dir, device="cpu", dtype=torch.float32, cuda_graphs=True).generate(PROMPTS, params)
    for a, b in zip(eager, padded):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) <= ATOL


def test_parity_depends_on_the_selection(v4_dir, reference, monkeypatch):
    """Every compressed entry selected (the indexer ignored) breaks parity."""
    import atom_core.runtime.compressed_attention as compressed

    def select_everything(scores, k):
        positions = torch.arange(scores.shape[1]).expand(scores.shape[0], -1)
        return torch.where(torch.isfinite(scores), positions, -1)

    monkeypatch.setattr(compressed, "topk_indices", select_everything)
    with pytest.raises(AssertionError, match="logit"):
        check_v4(v4_dir, reference, max_new_tokens=1)


def test_parity_depends_on_the_entries(v4_dir, reference, monkeypatch):
    """Attention over the sliding window alone (no compressed entry selected) breaks parity."""
    monkeypatch.setattr(CompressedAttention, "_selected_entries",
                        lambda self, index, v_cache, block_table, token_seq, token_pos, pos:
                        torch.full((pos.shape[0], 1), -1, dtype=torch.long))
    with pytest.raises(AssertionError, match="logit"):
        check_v4(v4_dir, reference, max_new_tokens=1)


@pytest.mark.parametrize("which", ["routed", "shared"])
def test_parity_depends_on_the_swiglu_clamp(v4_dir, reference, monkeypatch, which):
    """The experts unclamped (routed: fused_moe without swiglu_limit; shared: the MLP without its clamps) break parity:
    the tiny checkpoint's limit (0.2) is reached."""
    from atom_core.layers.moe import FusedMoE
    from atom_core.models.deepseek_v4 import ClampedMLP

    if which == "routed":
        monkeypatch.setattr(FusedMoE, "kernel_options", lambda self: {"activation": "silu", "w13_bias": None,
                                                                      "w2_bias": None})
    else:
        monkeypatch.setattr(ClampedMLP, "forward", lambda self, x: self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x)))
    with pytest.raises(AssertionError, match="logit"):
        check_v4(v4_dir, reference, max_new_tokens=1)


def test_triton_kernels_in_the_model(v4_dir, reference, monkeypatch):
    """Prefill with every op on its Triton kernel (interpreted on the CPU), each of the model's ops counted so a silent
    fallback to a reference would fail: the sliding layer's paged attention, the cache writes, the CSA selection, the
    compressed layers' attention with sinks, the clamped experts, norms and rope."""
    from atom_core.runtime.runner import Runner
    from atom_kernels import OPS

    monkeypatch.setenv("ATOM_KERNEL_BACKEND", "triton")
    ops = ("paged_attention", "reshape_and_cache", "indexer_scores", "topk_indices", "sparse_mla", "fused_moe",
           "rms_norm", "rotary_embedding")
    calls = dict.fromkeys(ops, 0)
    for op in ops:
        fn, unsupported = OPS[op].implementation("triton")

        def counted(*args, _fn=fn, _op=op, **kwargs):
            calls[_op] += 1
            return _fn(*args, **kwargs)

        monkeypatch.setitem(OPS[op]._impls, "triton", (counted, unsupported))
    prompts = [PROMPTS[2][:30]]  # past the window (8), the top-k (3 of 7 CSA entries) and 3 HCA entries
    got = Runner(v4_dir, device="cpu", dtype=torch.float32).prompt_logits(prompts)
    for g, w in zip(got, reference_logits(reference, prompts)):
        assert (g - w).abs().max().item() <= ATOL
    assert all(n >= 1 for n in calls.values()), calls


def test_transformers_own_names_load(v4_dir, reference, tmp_path):
    """The checkpoint as transformers' save_pretrained spells it (under "model.") loads to the same model as DeepSeek's
    published names."""
    from quant_helpers import read_tensors

    from atom_core.runtime.runner import Runner

    reference.save_pretrained(str(tmp_path))
    assert "model.embed_tokens.weight" in read_tensors(str(tmp_path))
    for extra in Path(v4_dir).glob("tokenizer*"):
        shutil.copy(extra, tmp_path / extra.name)
    got = Runner(str(tmp_path), device="cpu", dtype=torch.float32).prompt_logits(PROMPTS[:1])[0]
    want = Runner(v4_dir, device="cpu", dtype=torch.float32).prompt_logits(PROMPTS[:1])[0]
    assert torch.equal(got, want)


def test_expert_table_outside_the_experts_is_refused(v4_dir, tmp_path):
    from quant_helpers import read_tensors
    from safetensors.torch import save_file

    from atom_core.runtime.runner import Runner

    dst = tmp_path / "bad"
    shutil.copytree(v4_dir, dst)
    tensors = read_tensors(v4_dir)
    name = next(n for n in tensors if n.endswith("tid2eid"))
    tensors[name][3, 0] = 8  # the tiny model has experts 0..7
    for file in dst.glob("*.safetensors*"):
        file.unlink()
    save_file(tensors, str(dst / "model.safetensors"))
    with pytest.raises(CheckpointError, match="tid2eid"):
        Runner(str(dst), device="cpu", dtype=torch.float32)


def test_unknown_layer_type_is_refused(v4_dir, tmp_path):
    from atom_core.models.deepseek_v4 import V4Dims

    config = json.loads((Path(v4_dir) / "config.json").read_text())
    import transformers

    text = transformers.DeepseekV4Config(**{k: v for k, v in config.items() if k not in ("architectures",)})
    object.__setattr__(text, "layer_types", ["sliding_attention", "full_attention", "sliding_attention"])
    with pytest.raises(UnsupportedConfigError, match="layer_types"):
        V4Dims.from_hf(text)
