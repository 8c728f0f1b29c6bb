"""DeepSeek-V3's multi-token-prediction layer as a draft model, and greedy speculative decoding in the native runner.

* The MTP layer (enorm/hnorm/eh_proj, the decoder layer, the shared head) against a reference assembled from
  transformers' own DeepSeek-V3 decoder layer (transformers has no MTP class): draft logits within 1e-4 (fp32, CPU).
* Speculative decoding gives exactly the tokens greedy decoding gives without drafts, on a random checkpoint (drafts
  mostly rejected), on one whose draft agrees with its target (drafts mostly accepted) and on one in between, for
  1 to 3 draft tokens and a batch of prompts of different lengths.
* Acceptance: the draft whose target predicts from the current token alone is accepted at >= 90%.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import hf_model, with_random_correction_bias
from parity import PROMPTS, assert_draft_logits_match, assert_drafts_keep_greedy, speculative_generate
from quant_helpers import read_tensors
from safetensors.torch import save_file

from atom_core.errors import CheckpointError, UnsupportedArchitectureError, UnsupportedConfigError, UsageError
from atom_core.runtime.runner import Runner
from atom_core.runtime.sampler import SamplingParams
from atom_core.tiny import add_mtp_layer

ARCH = "DeepseekV3ForCausalLM"
DRAFT_LOGIT_ATOL = 1e-4  # fp32: ATOM and the reference differ in summation order only
MIN_ACCEPTANCE_AGREEING = 0.9


def with_mtp_layer(src: str, dst: Path, *, agreeing: float | None = None) -> str:
    """The tiny checkpoint at ``src`` with one MTP layer (:func:`atom_core.tiny.add_mtp_layer`; ``agreeing``: a
    target the draft predicts, exactly at 0, less often above)."""
    if (dst / "config.json").exists():
        return str(dst)
    return str(add_mtp_layer(src, dst, agreeing=agreeing))


@pytest.fixture(scope="session")
def mtp_dir(tiny, tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    src = with_random_correction_bias(tiny(ARCH), base / "dsv3-mtp-src")

    def build(agreeing: float | None = None) -> str:
        return with_mtp_layer(src, base / f"dsv3-mtp-{agreeing}", agreeing=agreeing)

    return build


def reference_draft_logits(model_dir: str, prompt: list[int], next_token: int) -> torch.Tensor:
    """The MTP layer's logits from transformers' DeepSeek-V3 pieces: the target's last hidden states, then
    ``eh_proj([rmsnorm(embed) | rmsnorm(h)])`` (embedding zeroed at position 0) through a one-layer DeepSeek-V3
    model holding the MTP layer's decoder layer, with the shared head as its final norm and LM head."""
    import transformers

    tensors = read_tensors(model_dir)
    config = json.loads((Path(model_dir) / "config.json").read_text())
    n, eps = config["num_hidden_layers"], config["rms_norm_eps"]
    with torch.no_grad():
        h = hf_model(model_dir).model(input_ids=torch.tensor([prompt])).last_hidden_state[0]
    block_dir = Path(model_dir).parent / (Path(model_dir).name + "-block")
    if not block_dir.exists():
        block_dir.mkdir()
        block_config = dict(config, num_hidden_layers=1, num_nextn_predict_layers=0,
                            first_k_dense_replace=0 if n >= config["first_k_dense_replace"] else 1)
        (block_dir / "config.json").write_text(json.dumps(block_config))
        prefix = f"model.layers.{n}."
        block = {"model.layers.0." + name[len(prefix):]: t for name, t in tensors.items() if name.startswith(prefix)}
        block = {k: v for k, v in block.items() if not re.search(r"\.(enorm|hnorm|eh_proj|shared_head|embed_tokens)\.", k)}
        block.update({"model.norm.weight": tensors[f"{prefix}shared_head.norm.weight"],
                      "lm_head.weight": tensors[f"{prefix}shared_head.head.weight"],
                      "model.embed_tokens.weight": tensors["model.embed_tokens.weight"]})
        save_file(block, str(block_dir / "model.safetensors"), metadata={"format": "pt"})
    block_model = transformers.AutoModelForCausalLM.from_pretrained(str(block_dir), dtype=torch.float32).eval()

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    embeds = tensors["model.embed_tokens.weight"][torch.tensor(prompt[1:] + [next_token])].clone()
    embeds[0] = 0
    x = torch.cat([rms(embeds, tensors[f"model.layers.{n}.enorm.weight"]),
                   rms(h, tensors[f"model.layers.{n}.hnorm.weight"])], dim=-1) @ tensors[f"model.layers.{n}.eh_proj.weight"].T
    with torch.no_grad():
        return block_model(inputs_embeds=x[None]).logits[0].float()


def test_mtp_layer_matches_reference(mtp_dir):
    model_dir = mtp_dir()
    runner = Runner(model_dir, device="cpu", dtype=torch.float32, speculative_tokens=1)
    assert_draft_logits_match(runner, lambda prompt, token: reference_draft_logits(model_dir, prompt, token), PROMPTS,
                              DRAFT_LOGIT_ATOL)


@pytest.mark.parametrize("agreeing", [None, 0.0, 0.5])
@pytest.mark.parametrize("k", [1, 3])
def test_speculative_output_equals_greedy(mtp_dir, agreeing, k):
    stats = assert_drafts_keep_greedy(mtp_dir(agreeing), k, PROMPTS, 1e-4)
    assert stats.proposed > 0


def test_agreeing_draft_is_accepted(mtp_dir):
    _, stats = speculative_generate(mtp_dir(0.0), 3, PROMPTS, max_new_tokens=16)
    assert stats.acceptance_rate >= MIN_ACCEPTANCE_AGREEING, f"acceptance {stats.acceptance_rate:.3f}"


def test_speculative_stops_at_eos(mtp_dir):
    """An end-of-sequence token among the accepted ones ends the sequence there, as it does without drafts."""
    model_dir = mtp_dir(0.0)
    plain, _ = speculative_generate(model_dir, 0, PROMPTS[:1], max_new_tokens=12)
    eos = plain[0].token_ids[5]
    runner = Runner(model_dir, device="cpu", dtype=torch.float32, speculative_tokens=3)
    runner.eos_token_ids = {eos}
    out = runner.generate(PROMPTS[:1], SamplingParams(max_new_tokens=12))[0]
    assert out.finish_reason == "stop" and out.token_ids == plain[0].token_ids[: plain[0].token_ids.index(eos) + 1]


def test_speculative_refusals(mtp_dir, tiny):
    runner = Runner(mtp_dir(), device="cpu", dtype=torch.float32, speculative_tokens=2)
    with pytest.raises(UsageError, match="greedy only"):
        runner.generate(PROMPTS[:1], SamplingParams(temperature=0.7))
    with pytest.raises(UnsupportedConfigError, match="num_nextn_predict_layers"):
        Runner(tiny(ARCH, num_nextn_predict_layers=0), device="cpu", dtype=torch.float32, speculative_tokens=2)
    # transformers writes num_nextn_predict_layers=1 but no MTP weights: the load names what is missing
    with pytest.raises(CheckpointError, match=r"did not provide: model\.layers\.3\.enorm\.weight"):
        Runner(tiny(ARCH), device="cpu", dtype=torch.float32, speculative_tokens=2)
    with pytest.raises(UnsupportedArchitectureError, match="no draft model"):
        Runner(tiny("Qwen2ForCausalLM"), device="cpu", dtype=torch.float32, speculative_tokens=2)
    with pytest.raises(UsageError, match=r"plain \(one-row\) positions"):  # multimodal rotary positions
        Runner(tiny("Qwen3VLForConditionalGeneration"), device="cpu", dtype=torch.float32, speculative_tokens=2)
    with pytest.raises(UsageError, match="at least 1 draft token"):
        Runner(mtp_dir(), device="cpu", dtype=torch.float32, speculative_tokens=-1)


def test_generate_command_speculative(mtp_dir, capsys):
    """``atom generate --speculative N`` prints the tokens greedy decoding gives and the acceptance on stderr."""
    from atom_core.cli import main

    model_dir = mtp_dir(0.0)
    args = ["generate", "--model", model_dir, "--prompt-token-ids", "5,17,99", "--max-new-tokens", "8", "--ignore-eos",
            "--dtype", "float32", "--device", "cpu", "--json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*args, "--speculative", "2"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["token_ids"] == plain["token_ids"]
    assert re.search(r"speculative decoding: \d+/\d+ draft tokens accepted", captured.err)
    assert main([*args, "--speculative", "2", "--temperature", "0.5"]) == 2
    assert "--speculative decodes greedily" in capsys.readouterr().err
