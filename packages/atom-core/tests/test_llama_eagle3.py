"""EAGLE-3 draft heads (``Eagle3LlamaForCausalLM``, a separate checkpoint) over Llama / Qwen3 targets in the native
runner's greedy speculative decoding.

* The draft's logits against a reference assembled from transformers' Llama pieces (the target's auxiliary hidden
  states from transformers' ``output_hidden_states``, then fc, the 2H-wide attention, the MLP, norm, lm_head and the
  ``d2t`` map written out): within 1e-4 (fp32, CPU), on a draft whose vocabulary is 128 of the target's 512 tokens.
* Speculative decoding gives exactly the tokens (and logprobs within 1e-4) greedy decoding gives without drafts, with
  a random draft (acceptance near zero) and with one constructed to agree with its target, for 1 and 3 draft tokens.
* Acceptance: the agreeing draft's first guess is the target's next token (>= 90% with 1 draft token).
* A draft checkpoint's own ``embed_tokens`` is used where it has one, else the target's.
* Bad drafts and bad use are refused with a one-line message naming the cause.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from parity import PROMPTS, assert_drafts_keep_greedy, speculative_generate
from quant_helpers import read_tensors
from safetensors.torch import save_file

from atom_core.errors import CheckpointError, UnsupportedArchitectureError, UnsupportedConfigError, UsageError
from atom_core.runtime.runner import Runner
from atom_core.tiny import make_agreeing_eagle3_pair, make_eagle3_draft

TARGETS = ("LlamaForCausalLM", "Qwen3ForCausalLM")
NUM_LAYERS = 4  # the aux layers 0, 2, 3 are distinct
DRAFT_LOGIT_ATOL = 1e-4  # fp32: ATOM and the reference differ in summation order only
MIN_ACCEPTANCE_AGREEING = 0.9
MAX_ACCEPTANCE_RANDOM = 0.1


@pytest.fixture(scope="session")
def eagle3(tiny, tmp_path_factory):
    """``eagle3(arch, agreeing=False) -> (target dir, draft dir)``, built once per session."""
    base = tmp_path_factory.getbasetemp()
    built = {}

    def build(arch: str, agreeing: bool = False) -> tuple[str, str]:
        if (arch, agreeing) not in built:
            target = tiny(arch, num_hidden_layers=NUM_LAYERS)
            if agreeing:
                pair = make_agreeing_eagle3_pair(target, base / f"{arch}-agreeing", base / f"{arch}-agreeing-eagle3")
                built[arch, agreeing] = tuple(map(str, pair))
            else:
                built[arch, agreeing] = (target, str(make_eagle3_draft(target, base / f"{arch}-eagle3")))
        return built[arch, agreeing]

    return build


def reference_draft_logits(target_dir: str, draft_dir: str, prompt: list[int], next_token: int) -> torch.Tensor:
    """The draft's logits over the target vocabulary (-inf outside the draft's) at every position of ``prompt``, from
    transformers' Llama layers and the draft's tensors."""
    import transformers
    from transformers.models.llama import modeling_llama as ml

    config = json.loads((Path(draft_dir) / "config.json").read_text())
    t = read_tensors(draft_dir)
    target = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    ids = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    with torch.no_grad():
        states = target.model(input_ids=torch.tensor([prompt]), output_hidden_states=True).hidden_states
        aux = torch.cat([states[i] for i in ids], dim=-1)  # hidden_states[i]: what enters layer i
        embeds = target.model.embed_tokens(torch.tensor([prompt[1:] + [next_token]]))

        cfg = transformers.LlamaConfig(**{k: v for k, v in config.items() if k not in ("architectures", "eagle_config")})
        cfg._attn_implementation = "eager"

        def norm(name: str) -> ml.LlamaRMSNorm:
            module = ml.LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            module.weight.copy_(t[name])
            return module

        attn = ml.LlamaAttention(cfg, layer_idx=0)
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            w = t[f"midlayer.self_attn.{proj}.weight"]
            setattr(attn, proj, torch.nn.Linear(w.shape[1], w.shape[0], bias=False))
            getattr(attn, proj).weight.copy_(w)
        mlp = ml.LlamaMLP(cfg)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            getattr(mlp, proj).weight.copy_(t[f"midlayer.mlp.{proj}.weight"])
        h = aux @ t["fc.weight"].T
        x = torch.cat([norm("midlayer.input_layernorm.weight")(embeds), norm("midlayer.hidden_norm.weight")(h)], dim=-1)
        n = len(prompt)
        positions = torch.arange(n)[None]
        rope = ml.LlamaRotaryEmbedding(cfg)(x, positions)
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        a, _ = attn(x, position_embeddings=rope, attention_mask=mask)
        r = h + a
        y = r + mlp(norm("midlayer.post_attention_layernorm.weight")(r))
        draft = norm("norm.weight")(y)[0] @ t["lm_head.weight"].T
    logits = torch.full((n, config["vocab_size"]), float("-inf"))
    logits[:, torch.arange(config["draft_vocab_size"]) + t["d2t"]] = draft
    return logits


def test_draft_matches_reference(eagle3):
    target, draft = eagle3("LlamaForCausalLM")
    runner = Runner(target, device="cpu", dtype=torch.float32, speculative_tokens=1, draft_model=draft)
    assert runner.speculative.spec.name == "Eagle3LlamaForCausalLM"
    assert runner.speculative.model.draft_vocab_size == 128
    for prompt in PROMPTS:
        got = runner.speculative.draft_logits(prompt, 123)
        want = reference_draft_logits(target, draft, prompt, 123)
        assert got.shape == want.shape
        assert torch.equal(got.isinf(), want.isinf())  # the draft vocabulary lands on the d2t tokens
        finite = want.isfinite()
        err = (got[finite] - want[finite]).abs().max().item()
        assert err <= DRAFT_LOGIT_ATOL, f"prompt of {len(prompt)}: max |draft logit difference| {err:.2e}"
    # the target records its auxiliary hidden states for the draft's calls only: its prompt logits are unchanged
    plain = Runner(target, device="cpu", dtype=torch.float32)
    for got, want in zip(runner.prompt_logits(PROMPTS), plain.prompt_logits(PROMPTS)):
        assert torch.equal(got, want)


def test_draft_own_embedding(eagle3, tmp_path):
    """A draft checkpoint with ``embed_tokens`` uses its own (here: the target's rows reversed); without, the target's."""
    target, draft = eagle3("LlamaForCausalLM")
    embed = read_tensors(target)["model.embed_tokens.weight"]
    logits = {}
    for name, extra in (("shared", {}), ("own", {"embed_tokens.weight": embed.flip(0).contiguous()})):
        runner = Runner(target, device="cpu", dtype=torch.float32, speculative_tokens=1,
                        draft_model=_broken_copy(draft, tmp_path / name, tensors=extra))
        logits[name] = runner.speculative.draft_logits(PROMPTS[0], 123)
    reference = reference_draft_logits(target, draft, PROMPTS[0], 123)
    finite = reference.isfinite()
    assert (logits["shared"][finite] - reference[finite]).abs().max() <= DRAFT_LOGIT_ATOL
    assert (logits["own"][finite] - reference[finite]).abs().max() > 1e-2


@pytest.mark.parametrize("agreeing", [False, True])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("arch", TARGETS)
def test_speculative_output_equals_greedy(eagle3, arch, k, agreeing):
    target, draft = eagle3(arch, agreeing)
    stats = assert_drafts_keep_greedy(target, k, PROMPTS, 1e-4, draft=draft)
    assert stats.proposed > 0
    if not agreeing:
        assert stats.acceptance_rate <= MAX_ACCEPTANCE_RANDOM, f"random draft accepted at {stats.acceptance_rate:.3f}"


@pytest.mark.parametrize("arch", TARGETS)
def test_agreeing_draft_is_accepted(eagle3, arch):
    target, draft = eagle3(arch, agreeing=True)
    _, stats = speculative_generate(target, 1, PROMPTS, max_new_tokens=16, draft=draft)
    assert stats.acceptance_rate >= MIN_ACCEPTANCE_AGREEING, f"acceptance {stats.acceptance_rate:.3f}"


def _broken_copy(draft: str, dst: Path, *, config: dict | None = None, tensors: dict | None = None) -> str:
    dst.mkdir(exist_ok=True)
    data = json.loads((Path(draft) / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**data, **(config or {})}))
    save_file({**read_tensors(draft), **(tensors or {})}, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return str(dst)


def _refused(error: type, pattern: str, target: str, draft: str | None, k: int = 2) -> None:
    with pytest.raises(error, match=pattern) as caught:
        Runner(target, device="cpu", dtype=torch.float32, speculative_tokens=k, draft_model=draft)
    assert "\n" not in str(caught.value)


def test_refusals(eagle3, tiny, tmp_path):
    target, draft = eagle3("LlamaForCausalLM")
    d2t = read_tensors(draft)["d2t"].clone()
    d2t[5] = 10_000
    _refused(CheckpointError, r"d2t maps draft token 5 to \d+, outside the target's vocabulary of 512", target,
             _broken_copy(draft, tmp_path / "bad-d2t", tensors={"d2t": d2t}))
    _refused(UnsupportedConfigError, r"eagle_aux_hidden_state_layer_ids must be 3 layer indices of the target's 4 layers",
             target, _broken_copy(draft, tmp_path / "bad-ids", config={"eagle_config": {
                 "eagle_aux_hidden_state_layer_ids": [0, 2, 4]}}))
    _refused(UnsupportedConfigError, "target_hidden_size 128 is not the target's hidden size 256", target,
             _broken_copy(draft, tmp_path / "bad-width", config={"target_hidden_size": 128}))
    _refused(CheckpointError, r"did not provide: model\.fc\.weight", target,
             _broken_copy_without(draft, tmp_path / "no-fc", "fc.weight"))
    _refused(UnsupportedArchitectureError, "no draft ATOM runs", target,
             _broken_copy(draft, tmp_path / "bad-arch", config={"architectures": ["MedusaModel"]}))
    _refused(UnsupportedArchitectureError, "takes LlamaForCausalLM, Qwen3ForCausalLM targets, not Qwen2ForCausalLM",
             tiny("Qwen2ForCausalLM"), draft)
    _refused(UsageError, r"are separate checkpoints: give the draft checkpoint's directory \(--draft DIR\)", target, None)
    _refused(UsageError, "speculative_tokens is 0", target, draft, k=0)


def _broken_copy_without(draft: str, dst: Path, name: str) -> str:
    dst.mkdir(exist_ok=True)
    (dst / "config.json").write_text((Path(draft) / "config.json").read_text())
    save_file({k: v for k, v in read_tensors(draft).items() if k != name}, str(dst / "model.safetensors"),
              metadata={"format": "pt"})
    return str(dst)


def test_generate_command_draft(eagle3, capsys):
    """``atom generate --speculative N --draft DIR`` prints the tokens greedy decoding gives and the acceptance."""
    from atom_core.cli import main

    target, draft = eagle3("LlamaForCausalLM", agreeing=True)
    args = ["generate", "--model", target, "--prompt-token-ids", "5,17,99", "--max-new-tokens", "8", "--ignore-eos",
            "--dtype", "float32", "--device", "cpu", "--json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, "--speculative", "1", "--draft", draft]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["token_ids"] == plain["token_ids"]
    accepted = re.search(r"speculative decoding: (\d+)/(\d+) draft tokens accepted", captured.err)
    assert accepted and int(accepted[1]) > 0
    assert main([*args, "--draft", draft]) == 2
    assert "--draft DIR takes --speculative N" in capsys.readouterr().err
