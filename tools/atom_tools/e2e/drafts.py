"""Speculative decoding in the vLLM end-to-end bench (``--speculative N``): each implementation runs a second time
with ``N`` draft tokens from the model's own draft, so the speed-up of drafting is measured beside the plain engines
of the same run, on the same checkpoint.

A random checkpoint's draft would almost never be accepted, which measures only the cost of drafting.  So the
checkpoint gets a draft that agrees with its target (``atom_core.tiny.add_mtp_layer``'s ``agreeing`` scale: 0
makes the target's next token depend on the current token alone and the draft predict it exactly, larger values
let the target read its context and the draft miss more often); both the plain and the drafting engines run that
checkpoint, and each drafting engine reports the acceptance vLLM counted.  The agreeing target has the real shape
and does the real work per token (its zeroed projections are still multiplied), so the plain engines' speed is that
of the model.

Engines that draft are named ``NAME+METHOD`` (``atom+mtp``, ``vllm@FLASH_ATTN+mtp``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Draft:
    """The draft this bench adds to a random checkpoint of one architecture."""

    method: str  # vLLM's speculative method
    writer: str  # the atom_core.tiny function that adds it (src, dst, agreeing=)
    weight: str  # a tensor of it, formatted with the config (a checkpoint that has it carries its draft)


DRAFTS = {
    "DeepseekV3ForCausalLM": Draft("mtp", "add_mtp_layer", "model.layers.{num_hidden_layers}.eh_proj.weight"),
    "Qwen3NextForCausalLM": Draft("mtp", "add_qwen3_next_mtp", "mtp.fc.weight"),
}
# architecture -> vLLM's speculative method of the draft this bench adds to its random checkpoint
DRAFT_METHODS = {arch: draft.method for arch, draft in DRAFTS.items()}


def engine_parts(name: str) -> tuple[str, str | None, str | None]:
    """``(implementation, attention backend or None, draft method or None)`` of an engine name
    ``IMPL[@BACKEND][+METHOD]``."""
    name, _, method = name.partition("+")
    impl, _, backend = name.partition("@")
    return impl, backend or None, method or None


def drafting_name(name: str, method: str) -> str:
    return f"{name}+{method}"


def plain_name(name: str) -> str:
    """The engine a drafting engine ``NAME+METHOD`` is compared with: ``NAME`` (a plain name is its own)."""
    return name.partition("+")[0]


def refusal(archs: dict[str, str], formats: list[str]) -> str | None:
    """Why ``--speculative`` cannot run these models (name -> architecture) in these formats, or None."""
    missing = [name for name, arch in archs.items() if arch not in DRAFT_METHODS]
    if missing:
        return (f"--speculative: no draft for {', '.join(missing)} (drafts: "
                f"{', '.join(f'{arch} ({method})' for arch, method in DRAFT_METHODS.items())})")
    if set(formats) - {"bf16"}:
        return "--speculative: bf16 checkpoints only (the draft layer added to a random checkpoint is written in bf16)"
    return None


def with_draft(arch: str, model_dir: Path, agreeing: float) -> tuple[Path, str]:
    """The checkpoint the engines run with ``--speculative`` and the draft method: ``model_dir`` itself when it has
    its draft already (a real DeepSeek or Qwen3-Next checkpoint's MTP layer), else a copy beside it with an agreeing
    draft (kept: a finished copy is reused)."""
    from atom_core import tiny
    from atom_tools.e2e.driver import kept

    draft = DRAFTS[arch]
    if has_mtp_layer(model_dir, draft):
        return model_dir, draft.method
    out = model_dir.parent / f"{model_dir.name}-{draft.method}-agreeing{agreeing:g}"
    return kept(out, lambda: getattr(tiny, draft.writer)(model_dir, out, agreeing=agreeing)), draft.method


def has_mtp_layer(model_dir: Path, draft: Draft = DRAFTS["DeepseekV3ForCausalLM"]) -> bool:
    """Whether the checkpoint declares an MTP layer and carries its weights (``draft.weight``, named as DeepSeek or
    Qwen publish them); only the safetensors headers are read."""
    from safetensors import safe_open

    config = json.loads((model_dir / "config.json").read_text())
    if not config.get("num_nextn_predict_layers"):
        return False
    name = draft.weight.format(**config)
    for file in model_dir.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as f:
            if name in f.keys():
                return True
    return False


def speculative_config(method: str, num_tokens: int) -> dict:
    """vLLM's ``speculative_config`` for the checkpoint's own draft."""
    return {"method": method, "num_speculative_tokens": num_tokens}


def acceptance(counters: dict[str, float]) -> dict:
    """Draft tokens proposed and accepted (vLLM's ``spec_decode_num_*`` counters over every request the engine ran)
    and their ratio."""
    drafts = counters.get("vllm:spec_decode_num_draft_tokens", 0)
    accepted = counters.get("vllm:spec_decode_num_accepted_tokens", 0)
    return {"draft_tokens": int(drafts), "accepted_tokens": int(accepted),
            "acceptance": round(accepted / drafts, 4) if drafts else None}
