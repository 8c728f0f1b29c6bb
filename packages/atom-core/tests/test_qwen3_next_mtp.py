"""Qwen3-Next's multi-token-prediction layer as a draft model, and greedy speculative decoding over a hybrid target.

* The MTP layer (pre-projection norms, ``fc``, the full-attention MoE decoder layer, ``mtp.norm``, the shared LM head)
  against a reference assembled from transformers' own Qwen3-Next decoder (transformers has no MTP class): draft
  logits within 1e-4 (fp32, CPU).
* Speculative decoding gives exactly the tokens greedy decoding gives without drafts, on a random checkpoint (drafts
  mostly rejected), on one whose draft agrees with its target (mostly accepted) and on one in between, for 1 and 3
  draft tokens and a batch of prompts of different lengths: rejected drafts must not leave their trace in the Gated
  DeltaNet layers' recurrent state (the runner rolls it back and replays the accepted tokens).
* Acceptance: the draft whose target predicts from the current token alone is accepted at >= 90%.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import hf_model
from parity import PROMPTS, assert_draft_logits_match, assert_drafts_keep_greedy, speculative_generate
from quant_helpers import read_tensors
from safetensors.torch import save_file

from atom_core.errors import CheckpointError, UnsupportedConfigError
from atom_core.runtime import speculative
from atom_core.runtime.runner import Runner
from atom_core.tiny import add_qwen3_next_mtp

ARCH = "Qwen3NextForCausalLM"
DRAFT_LOGIT_ATOL = 1e-4  # fp32: ATOM and the reference differ in summation order only
LOGPROB_ATOL = 1e-4  # a verify step runs the GDN layers chunked, plain decoding one token at a time
MIN_ACCEPTANCE_AGREEING = 0.9


@pytest.fixture(scope="session")
def mtp_dir(tiny, tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    src = tiny(ARCH)

    def build(agreeing: float | None = None) -> str:
        dst = base / f"qwen3-next-mtp-{agreeing}"
        if not (dst / "config.json").exists():
            add_qwen3_next_mtp(src, dst, agreeing=agreeing)
        return str(dst)

    return build


def reference_draft_logits(model_dir: str, prompt: list[int], next_token: int) -> torch.Tensor:
    """The MTP layer's logits from transformers' Qwen3-Next pieces: the target's last hidden states (after its final
    norm), then ``fc([rmsnorm₀(embed) ; rmsnorm₀(h)])`` through a one-layer Qwen3-Next model (full attention, sparse
    MoE) holding ``mtp.layers.0``, with ``mtp.norm`` as its final norm and the target's LM head."""
    import transformers

    tensors = read_tensors(model_dir)
    config = json.loads((Path(model_dir) / "config.json").read_text())
    eps = config["rms_norm_eps"]
    with torch.no_grad():
        h = hf_model(model_dir).model(input_ids=torch.tensor([prompt])).last_hidden_state[0]
    block_dir = Path(model_dir).parent / (Path(model_dir).name + "-block")
    if not block_dir.exists():
        block_dir.mkdir()
        block_config = dict(config, num_hidden_layers=1, layer_types=["full_attention"], mlp_only_layers=[],
                            num_nextn_predict_layers=0)
        (block_dir / "config.json").write_text(json.dumps(block_config))
        block = {"model.layers.0." + name[len("mtp.layers.0."):]: t for name, t in tensors.items()
                 if name.startswith("mtp.layers.0.")}
        block.update({"model.norm.weight": tensors["mtp.norm.weight"], "lm_head.weight": tensors["lm_head.weight"],
                      "model.embed_tokens.weight": tensors["model.embed_tokens.weight"]})
        save_file(block, str(block_dir / "model.safetensors"), metadata={"format": "pt"})
    block_model = transformers.AutoModelForCausalLM.from_pretrained(str(block_dir), dtype=torch.float32).eval()

    def rms0(x, w):  # the zero-centred RMSNorm: scale 1 + w
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)

    embeds = tensors["model.embed_tokens.weight"][torch.tensor(prompt[1:] + [next_token])]
    x = torch.cat([rms0(embeds, tensors["mtp.pre_fc_norm_embedding.weight"]),
                   rms0(h, tensors["mtp.pre_fc_norm_hidden.weight"])], dim=-1) @ tensors["mtp.fc.weight"].T
    with torch.no_grad():
        return block_model(inputs_embeds=x[None]).logits[0].float()


def test_mtp_layer_matches_reference(mtp_dir):
    model_dir = mtp_dir()
    runner = Runner(model_dir, device="cpu", dtype=torch.float32, speculative_tokens=1)
    assert type(runner.speculative.model).__name__ == "Qwen3NextMTP"
    assert_draft_logits_match(runner, lambda prompt, token: reference_draft_logits(model_dir, prompt, token), PROMPTS,
                              DRAFT_LOGIT_ATOL)


@pytest.mark.parametrize("agreeing", [None, 0.0, 0.5])
@pytest.mark.parametrize("k", [1, 3])
def test_speculative_output_equals_greedy(mtp_dir, agreeing, k):
    stats = assert_drafts_keep_greedy(mtp_dir(agreeing), k, PROMPTS, LOGPROB_ATOL)
    assert stats.proposed > 0


def test_rejected_drafts_need_the_state_rollback(mtp_dir, monkeypatch):
    """Without rolling the recurrent state back, the rejected drafts of a random checkpoint change the output."""
    model_dir = mtp_dir()
    plain, _ = speculative_generate(model_dir, 0, PROMPTS)
    monkeypatch.setattr(speculative.SpeculativeDecoder, "_replay_accepted", lambda *args: None)
    spec, _ = speculative_generate(model_dir, 3, PROMPTS)
    assert any(s.token_ids != p.token_ids for p, s in zip(plain, spec))


def test_agreeing_draft_is_accepted(mtp_dir):
    _, stats = speculative_generate(mtp_dir(0.0), 3, PROMPTS, max_new_tokens=16)
    assert stats.acceptance_rate >= MIN_ACCEPTANCE_AGREEING, f"acceptance {stats.acceptance_rate:.3f}"


def test_mtp_refusals(tiny, tmp_path):
    # Qwen3-Next's config carries no num_nextn_predict_layers unless the checkpoint has MTP weights
    with pytest.raises(UnsupportedConfigError, match="num_nextn_predict_layers"):
        Runner(tiny(ARCH), device="cpu", dtype=torch.float32, speculative_tokens=2)
    src = Path(tiny(ARCH))
    (tmp_path / "config.json").write_text(json.dumps(dict(json.loads((src / "config.json").read_text()),
                                                          num_nextn_predict_layers=1)))
    for file in src.iterdir():
        if file.name != "config.json" and file.is_file():
            shutil.copy(file, tmp_path / file.name)
    with pytest.raises(CheckpointError, match=r"did not provide: mtp\."):
        Runner(str(tmp_path), device="cpu", dtype=torch.float32, speculative_tokens=2)
