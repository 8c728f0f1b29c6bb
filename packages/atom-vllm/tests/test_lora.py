"""vLLM's own LoRA manager driving ATOM's linear layers (``LLM(enable_lora=True)`` + ``LoRARequest``) on the CPU.

Two peft adapters of a tiny Qwen3 (random A *and* B: peft starts B at zero) and a prompt without one, all in one
``LLM.generate`` batch: each prompt's greedy tokens equal transformers + peft with its adapter (the no-adapter one
the base model), and vLLM's own Qwen3 with the same adapters.  One vLLM process per implementation, run at once.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from test_generate import ENGINE_ENV, TIE_GAP
from test_plugin import assert_served_by_atom

from atom_core import catalog
from atom_core.tiny import random_lora_adapter
from atom_vllm import compat

pytestmark = pytest.mark.generate

ARCH = "Qwen3ForCausalLM"
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
DENSE = [*ATTENTION, "gate_proj", "up_proj", "down_proj"]
PROMPTS = [[5, 17, 99, 3, 200, 41, 7], [11, 300, 8], [42, 7, 19, 250]]
MAX_TOKENS = 6


def hf_model(model_dir: str):
    return catalog.get(ARCH).hf_model_class().from_pretrained(model_dir, dtype=torch.float32).eval()


def make_adapter(model_dir: str, out, targets: list[str], *, seed: int, r: int, alpha: int, rslora: bool = False) -> str:
    """peft (installed by the sessions with the generate check only) adapter with random A and B."""
    random_lora_adapter(hf_model(model_dir), out, targets, seed=seed, r=r, alpha=alpha, rslora=rslora)
    return str(out)


@torch.inference_mode()
def peft_greedy(model_dir: str, adapter: str | None, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    """transformers (+ peft with ``adapter``): greedy tokens and the fp32 logits at each generated step."""
    import peft

    model = hf_model(model_dir)
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


def test_two_adapters_and_none_in_one_batch(tiny_models, probe, tmp_path):
    if not compat.lora_internals_checked():
        pytest.skip(f"vLLM {compat.vllm_version()}: ATOM's class refuses --enable-lora (test_construct checks it)")
    model_dir = tiny_models[ARCH]
    first = make_adapter(model_dir, tmp_path / "first", DENSE, seed=1, r=4, alpha=8)
    second = make_adapter(model_dir, tmp_path / "second", ATTENTION, seed=2, r=8, alpha=16, rslora=True)
    adapters = [first, second, None]
    options = {"prompts": PROMPTS, "adapters": adapters, "max_tokens": str(MAX_TOKENS)}
    with ThreadPoolExecutor(2) as pool:
        atom_job = pool.submit(probe, "lora", [model_dir], env=ENGINE_ENV, **options)
        own_job = pool.submit(probe, "lora", [model_dir], env={**ENGINE_ENV, "ATOM_DISABLE_VLLM_PLUGIN": "1"},
                              fresh_cache=True, **options)
        atom, own = atom_job.result(), own_job.result()
    assert_served_by_atom([atom])
    assert own["module"].startswith("vllm.model_executor.models"), own
    references = [peft_greedy(model_dir, a, p) for a, p in zip(adapters, PROMPTS)]
    # the adapters change the tokens (else a layer ignoring them would pass)
    assert references[0][0] != peft_greedy(model_dir, None, PROMPTS[0])[0]
    assert references[1][0] != peft_greedy(model_dir, None, PROMPTS[1])[0]
    for i, (adapter, (want, logits)) in enumerate(zip(adapters, references)):
        name = f"prompt {i} ({'adapter ' + adapter.rpartition('/')[2] if adapter else 'no adapter'})"
        assert_greedy(f"ATOM's class, {name}, against transformers + peft", atom["tokens"][i], want, logits)
        assert_greedy(f"ATOM's class, {name}, against vLLM's own class", atom["tokens"][i], own["tokens"][i], logits)
