"""Small random checkpoints for any catalog architecture (``atom make-tiny``).

The weights are written by the architecture's transformers reference class (``save_pretrained``), so
the checkpoint's names and layout are exactly Hugging Face's — the thing ATOM's loader must read.
A small byte-level BPE tokenizer is trained on a built-in text and saved beside them.  The directory is
written whole or not at all (:mod:`atom_core.staging`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from atom_core import catalog
from atom_core.config import hybrid_layer_types, text_config
from atom_core.errors import UsageError
from atom_core.staging import MARKER, staged_dir

EOS_TOKEN = "<|endoftext|>"
_CORPUS = """\
The quick brown fox jumps over the lazy dog. ATOM runs modern language models inside the serving
frameworks people already use. A tiny model has random weights, so what it says means nothing, but
every number it computes must match the reference implementation exactly. Hello world! 0123456789
"""


def build_tokenizer(vocab_size: int, special_tokens: dict[str, int] | None = None):
    """A byte-level BPE tokenizer with at most ``vocab_size`` tokens, ``<|endoftext|>`` among them, and each of
    ``special_tokens`` (text -> id, above the trained vocabulary) at its id (``<|reserved_N|>`` fill the ids between)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=min(vocab_size, 384), special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tokenizer.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    for text, token_id in sorted((special_tokens or {}).items(), key=lambda item: item[1]):
        first = tokenizer.get_vocab_size(with_added_tokens=True)
        if not first <= token_id < vocab_size:
            raise ValueError(f"special token {text!r} at id {token_id}: ids {first} to {vocab_size - 1} are free")
        tokenizer.add_special_tokens([f"<|reserved_{i}|>" for i in range(first, token_id)] + [text])
    return tokenizer


def merged(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``overrides``; nested dicts (a multimodal config's ``text_config``,
    ``vision_config``) are merged key by key rather than replaced."""
    out = dict(base)
    for key, value in overrides.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def tiny_config(arch: str, **overrides: Any):
    from transformers import AutoConfig

    spec = catalog.get(arch)
    kwargs = merged(spec.tiny, overrides)
    config = AutoConfig.for_model(spec.model_type, **kwargs)
    config.architectures = [arch]
    return config


def shard_size_bytes(size: str | int) -> int:
    """``--max-shard-size`` in bytes (``"200KB"``, ``"5GiB"``, an integer): a :class:`UsageError` unless positive."""
    from transformers.utils.hub import convert_file_size_to_int

    try:
        value = convert_file_size_to_int(size)
    except (ValueError, TypeError):
        value = None
    if not isinstance(value, int) or value <= 0:
        raise UsageError(f"--max-shard-size {size!r} is not a size: use a positive number of bytes or a number with a "
                         "unit, e.g. 200KB or 5GB")
    return value


def make_tiny(arch: str, out_dir: str | Path, *, seed: int = 0, max_shard_size: str | int | None = None,
              dtype: torch.dtype = torch.float32, overwrite: bool = False, **overrides: Any) -> Path:
    """Write config, random weights (``seed``) and a tokenizer for ``arch`` into ``out_dir``: a new or empty
    directory, or with ``overwrite`` a checkpoint directory to replace (whole: see :mod:`atom_core.staging`)."""
    spec = catalog.get(arch)
    out = Path(out_dir)
    if max_shard_size is not None:
        max_shard_size = shard_size_bytes(max_shard_size)
    tokenizer = build_tokenizer(spec.tiny.get("text_config", spec.tiny).get("vocab_size", 512), spec.tiny_tokens)
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    config = tiny_config(arch, bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id, **overrides)
    with staged_dir(out, writer="atom make-tiny", overwrite=overwrite) as tmp:
        torch.manual_seed(seed)
        model = spec.hf_model_class()(config).to(dtype)
        save_reference(model, arch, tmp, max_shard_size=max_shard_size)
        write_processor_files(arch, config, tmp, tokenizer)
    return out


def save_reference(model, arch: str, out: str | Path, *, max_shard_size: str | int | None = None) -> None:
    """``model.save_pretrained(out)`` under the names the architecture's published checkpoints use: config.json's
    ``architectures`` is ``arch`` (transformers writes its class name, which may be spelled otherwise), and where
    transformers' reverse name conversion misses some tensor names (``ArchSpec.published_names``) the written
    safetensors files (and their index) are renamed in place."""
    save_kwargs = {"max_shard_size": max_shard_size} if max_shard_size is not None else {}
    model.save_pretrained(str(out), safe_serialization=True, **save_kwargs)
    config_file = Path(out) / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "architectures": [arch]}, indent=2))
    renames = [(re.compile(pattern), repl) for pattern, repl in catalog.get(arch).published_names]
    if not renames:
        return

    def published(name: str) -> str:
        for pattern, repl in renames:
            name = pattern.sub(repl, name)
        return name

    from safetensors.torch import load_file, save_file

    for file in sorted(Path(out).glob("*.safetensors")):
        tensors = load_file(str(file))
        save_file({published(k): v for k, v in tensors.items()}, str(file), metadata={"format": "pt"})
    index = Path(out) / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        data["weight_map"] = {published(k): v for k, v in data["weight_map"].items()}
        index.write_text(json.dumps(data, indent=2))


def write_processor_files(arch: str, config, out: Path, tokenizer=None) -> None:
    """The tokenizer files (``tokenizer``, default :func:`build_tokenizer`'s) and, for a multimodal
    architecture, its tiny image processor's config, into the checkpoint directory ``out``."""
    spec = catalog.get(arch)
    if tokenizer is None:
        tokenizer = build_tokenizer(spec.tiny.get("text_config", spec.tiny).get("vocab_size", 512), spec.tiny_tokens)
    tokenizer.save(str(Path(out) / "tokenizer.json"))
    (Path(out) / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS_TOKEN, "bos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN, "model_max_length": text_config(config).max_position_embeddings,
    }, indent=1))
    if spec.tiny_preprocessor:
        (Path(out) / "preprocessor_config.json").write_text(json.dumps(spec.tiny_preprocessor, indent=1))


def add_mtp_layer(src: str | Path, dst: str | Path, *, seed: int = 0, agreeing: float | None = None) -> Path:
    """A copy at ``dst`` of the tiny DeepSeek-V3 checkpoint at ``src`` with one multi-token-prediction layer, named
    as DeepSeek publishes it (``model.layers.<num_hidden_layers>.*``; transformers writes none): its decoder layer a
    copy of the last one, ``enorm``/``hnorm``/``eh_proj`` random, the shared head the target's final norm and LM head.

    ``agreeing`` (a scale in [0, 1]) makes a checkpoint whose draft is accepted often: the target's MLP outputs are
    zeroed and its attention outputs scaled by ``agreeing``, and the MTP layer reduced to
    ``head(norm(embed(next token)))``.  At 0 the target's next token depends on the current token alone and the draft
    predicts it exactly; above 0 the target also reads its context and the draft is right less often."""

    from safetensors.torch import load_file

    src, dst = Path(src), Path(dst)
    config = json.loads((src / "config.json").read_text())
    n, hidden = config["num_hidden_layers"], config["hidden_size"]
    tensors = {}
    for file in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    gen = torch.Generator().manual_seed(seed)
    last, layer = f"model.layers.{n - 1}.", f"model.layers.{n}."
    mtp = {layer + name[len(last):]: t.clone() for name, t in tensors.items() if name.startswith(last)}
    mtp.update({
        f"{layer}enorm.weight": 1 + 0.1 * torch.randn(hidden, generator=gen),
        f"{layer}hnorm.weight": 1 + 0.1 * torch.randn(hidden, generator=gen),
        f"{layer}eh_proj.weight": torch.randn(hidden, 2 * hidden, generator=gen) / (2 * hidden) ** 0.5,
        f"{layer}shared_head.norm.weight": tensors["model.norm.weight"].clone(),
        f"{layer}shared_head.head.weight": tensors["lm_head.weight"].clone(),
        f"{layer}embed_tokens.weight": tensors["model.embed_tokens.weight"].clone(),
    })
    if agreeing is not None:
        for name in tensors:
            if name.endswith("down_proj.weight"):
                tensors[name] = torch.zeros_like(tensors[name])
            elif name.endswith("o_proj.weight"):
                tensors[name] = tensors[name] * agreeing
        for name in mtp:
            if name.endswith(("down_proj.weight", "o_proj.weight")):
                mtp[name] = torch.zeros_like(mtp[name])
        mtp[f"{layer}enorm.weight"] = torch.ones(hidden)
        mtp[f"{layer}eh_proj.weight"] = torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1)
    dtype = tensors["model.norm.weight"].dtype  # the new tensors in the checkpoint's own precision
    for name in ("enorm.weight", "hnorm.weight", "eh_proj.weight"):
        mtp[layer + name] = mtp[layer + name].to(dtype)
    return _write_with_mtp(src, dst, config, {**tensors, **mtp}, "atom_core.tiny.add_mtp_layer")


def add_qwen3_next_mtp(src: str | Path, dst: str | Path, *, seed: int = 0, agreeing: float | None = None) -> Path:
    """A copy at ``dst`` of the tiny Qwen3-Next checkpoint at ``src`` with one multi-token-prediction layer, named as
    Qwen publishes it (``mtp.*``; transformers writes none): ``mtp.layers.0`` a copy of the last full-attention layer,
    the pre-projection norms and ``fc`` random, ``mtp.norm`` the target's final norm.

    ``agreeing`` (a scale in [0, 1]) makes a checkpoint whose draft is accepted often: the target's MLP outputs are
    zeroed and its attention and linear-attention outputs scaled by ``agreeing``, and the MTP layer reduced to
    ``lm_head(norm(embed(next token)))``.  At 0 the target's next token depends on the current token alone and the
    draft predicts it exactly; above 0 the target also reads its context and the draft is right less often."""

    from safetensors.torch import load_file

    src, dst = Path(src), Path(dst)
    config = json.loads((src / "config.json").read_text())
    hidden = config["hidden_size"]
    tensors = {}
    for file in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    gen = torch.Generator().manual_seed(seed)
    types = hybrid_layer_types(SimpleNamespace(**config))
    last = f"model.layers.{max(i for i, t in enumerate(types) if t == 'full_attention')}."
    mtp = {"mtp.layers.0." + name[len(last):]: t.clone() for name, t in tensors.items() if name.startswith(last)}
    mtp.update({
        "mtp.pre_fc_norm_embedding.weight": 0.1 * torch.randn(hidden, generator=gen),  # zero-centred: scale 1 + w
        "mtp.pre_fc_norm_hidden.weight": 0.1 * torch.randn(hidden, generator=gen),
        "mtp.fc.weight": torch.randn(hidden, 2 * hidden, generator=gen) / (2 * hidden) ** 0.5,
        "mtp.norm.weight": tensors["model.norm.weight"].clone(),
    })
    if agreeing is not None:
        for name in tensors:
            if name.endswith("down_proj.weight"):
                tensors[name] = torch.zeros_like(tensors[name])
            elif name.endswith(("self_attn.o_proj.weight", "linear_attn.out_proj.weight")):
                tensors[name] = tensors[name] * agreeing
        for name in mtp:
            if name.endswith(("down_proj.weight", "o_proj.weight")):
                mtp[name] = torch.zeros_like(mtp[name])
        mtp["mtp.pre_fc_norm_embedding.weight"] = torch.zeros(hidden)
        mtp["mtp.fc.weight"] = torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1)
    return _write_with_mtp(src, dst, config, {**tensors, **mtp}, "atom_core.tiny.add_qwen3_next_mtp")


def _write_with_mtp(src: Path, dst: Path, config: dict, tensors: dict, writer: str) -> Path:
    """``src``'s files (its weights excepted) with ``tensors`` as its one weights file and one MTP layer in the config."""
    import shutil

    from safetensors.torch import save_file

    with staged_dir(dst, writer=writer) as out:
        for file in src.iterdir():
            if file.is_file() and not file.name.startswith("model.safetensors") and file.name != MARKER:
                shutil.copy(file, out / file.name)
        (out / "config.json").write_text(json.dumps(dict(config, num_nextn_predict_layers=1), indent=2))
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return dst


def random_lora_adapter(base, out: str | Path, targets: list[str], *, seed: int, r: int, alpha: int,
                        rslora: bool = False):
    """A peft LoRA adapter of the transformers model ``base`` on ``targets``, saved at ``out``, with random A **and**
    B (peft starts B at zero, which would make every adapter the base model); returns the peft model.  Needs peft."""
    import peft

    model = peft.get_peft_model(base, peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0,
                                                      use_rslora=rslora))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    model.save_pretrained(out)
    return model


EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"  # as EAGLE-3 checkpoints' config.json spell it


def _load_tensors(src: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors = {}
    for file in sorted(src.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def _write_eagle3(dst: Path, target_config: dict, tensors: dict[str, torch.Tensor], draft_vocab: torch.Tensor,
                  layer_ids: list[int]) -> Path:
    """An EAGLE-3 checkpoint at ``dst``: ``tensors`` (``midlayer.*``, ``fc``, ``norm``, ``lm_head``) with ``d2t`` / ``t2d``
    for ``draft_vocab`` (the target token of each draft token), its config derived from the target's."""
    from safetensors.torch import save_file

    vocab = target_config["vocab_size"]
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[draft_vocab] = True
    tensors = dict(tensors, d2t=draft_vocab - torch.arange(len(draft_vocab)), t2d=t2d)
    keep = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "max_position_embeddings", "rms_norm_eps", "rope_parameters", "rope_theta", "vocab_size", "bos_token_id",
            "eos_token_id")
    config = {k: target_config[k] for k in keep if k in target_config}
    config.update(architectures=[EAGLE3_ARCHITECTURE], model_type="llama", num_hidden_layers=1,
                  draft_vocab_size=len(draft_vocab), target_hidden_size=target_config["hidden_size"],
                  tie_word_embeddings=False, eagle_config={"eagle_aux_hidden_state_layer_ids": layer_ids})
    with staged_dir(dst, writer="atom_core.tiny.eagle3") as out:
        (out / "config.json").write_text(json.dumps(config, indent=2))
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _eagle3_layer(target: dict[str, torch.Tensor], gen: torch.Generator, hidden: int) -> dict[str, torch.Tensor]:
    """``midlayer.*``: the target's layer 0 with q/k/v over ``[embedding ; hidden]`` (2H wide), random norms."""
    layer = {"midlayer." + name[len("model.layers.0."):]: t.clone() for name, t in target.items()
             if name.startswith("model.layers.0.") and not re.search(r"\.(q|k)_norm\.", name)}  # Qwen3's q/k norms
    for proj in ("q_proj", "k_proj", "v_proj"):
        w = layer[f"midlayer.self_attn.{proj}.weight"]
        layer[f"midlayer.self_attn.{proj}.weight"] = torch.randn(w.shape[0], 2 * hidden, generator=gen) / (2 * hidden) ** 0.5
    layer["midlayer.hidden_norm.weight"] = 1 + 0.1 * torch.randn(hidden, generator=gen)
    return layer


def make_eagle3_draft(target: str | Path, dst: str | Path, *, seed: int = 0, draft_vocab_size: int = 128,
                      layer_ids: list[int] | None = None) -> Path:
    """A random EAGLE-3 draft at ``dst`` for the tiny Llama / Qwen3 checkpoint at ``target``: its decoder layer shaped
    like the target's, ``fc`` over three target layers' hidden states (``layer_ids``, default the first, middle and
    last), a draft vocabulary of ``draft_vocab_size`` random target tokens (``d2t``)."""
    target, dst = Path(target), Path(dst)
    config = json.loads((target / "config.json").read_text())
    tensors = _load_tensors(target)
    hidden, vocab, n = config["hidden_size"], config["vocab_size"], config["num_hidden_layers"]
    gen = torch.Generator().manual_seed(seed)
    draft_vocab = torch.randperm(vocab, generator=gen)[:draft_vocab_size].sort().values
    draft = _eagle3_layer(tensors, gen, hidden)
    draft.update({
        "fc.weight": torch.randn(hidden, 3 * hidden, generator=gen) / (3 * hidden) ** 0.5,
        "norm.weight": 1 + 0.1 * torch.randn(hidden, generator=gen),
        "lm_head.weight": torch.randn(draft_vocab_size, hidden, generator=gen) / hidden**0.5,
    })
    return _write_eagle3(dst, config, draft, draft_vocab, layer_ids or [0, n // 2, n - 1])


def make_agreeing_eagle3_pair(target: str | Path, dst_target: str | Path, dst_draft: str | Path, *,
                              seed: int = 0) -> tuple[Path, Path]:
    """A target at ``dst_target`` and an EAGLE-3 draft at ``dst_draft`` that predicts it exactly.

    The target is the tiny Llama / Qwen3 checkpoint at ``target`` with its attention outputs zeroed and its LM head
    rebuilt so that its next token is a permutation ``s`` of the current one: ``lm_head[s(t)]`` is the final hidden
    state of token ``t`` (after the norm) scaled to a common length, which that state's logits peak at.  The draft
    reads the hidden state entering the target's last layer (``fc`` picks it; the other two layers' are weighted 0),
    passes it through its decoder layer (attention and MLP outputs zeroed), and its LM head holds that state for every
    token ``t`` (unit norm weight), so its top draft token is the current token ``t``, which ``d2t`` maps to
    ``s(s(t))``: the token after the next."""
    import shutil

    import transformers
    from safetensors.torch import save_file

    target, dst_target = Path(target), Path(dst_target)
    config = json.loads((target / "config.json").read_text())
    tensors = _load_tensors(target)
    hidden, vocab, n = config["hidden_size"], config["vocab_size"], config["num_hidden_layers"]
    eps = config["rms_norm_eps"]
    gen = torch.Generator().manual_seed(seed)
    for name in tensors:
        if name.endswith("self_attn.o_proj.weight"):
            tensors[name] = torch.zeros_like(tensors[name])
    model = transformers.AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32, trust_remote_code=False).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
        out = model.model(input_ids=torch.arange(vocab)[:, None], output_hidden_states=True)
    final, entering_last = out.last_hidden_state[:, 0], out.hidden_states[n - 1][:, 0]
    perm = torch.randperm(vocab, generator=gen)  # s(t) = perm[t]
    head = torch.empty_like(final)
    # equal lengths: the logits peak at the state itself (a token whose embedding is zero, the padding one, has none)
    head[perm] = final / final.norm(dim=-1, keepdim=True).clamp_min(1e-6) * hidden**0.5
    tensors["lm_head.weight"] = head
    with staged_dir(dst_target, writer="atom_core.tiny.make_agreeing_eagle3_pair") as out_dir:
        for file in target.iterdir():
            if file.is_file() and not file.name.startswith("model.safetensors") and file.name != MARKER:
                shutil.copy(file, out_dir / file.name)
        (out_dir / "config.json").write_text(json.dumps(dict(config, tie_word_embeddings=False), indent=2))
        save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    draft = _eagle3_layer(tensors, gen, hidden)
    for name in draft:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            draft[name] = torch.zeros_like(draft[name])
    draft.update({
        "fc.weight": torch.cat([torch.zeros(hidden, 2 * hidden), torch.eye(hidden)], dim=1),
        "norm.weight": torch.ones(hidden),
        "lm_head.weight": entering_last * torch.rsqrt(entering_last.pow(2).mean(-1, keepdim=True) + eps),
    })
    _write_eagle3(Path(dst_draft), config, draft, perm[perm], [0, n // 2, n - 1])
    return dst_target, Path(dst_draft)
