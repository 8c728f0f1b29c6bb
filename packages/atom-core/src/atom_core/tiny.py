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
    import shutil

    from safetensors.torch import load_file, save_file

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
    with staged_dir(dst, writer="atom_core.tiny.add_mtp_layer") as out:
        for file in src.iterdir():
            if file.is_file() and not file.name.startswith("model.safetensors") and file.name != MARKER:
                shutil.copy(file, out / file.name)
        (out / "config.json").write_text(json.dumps(dict(config, num_nextn_predict_layers=1), indent=2))
        save_file({**tensors, **mtp}, str(out / "model.safetensors"), metadata={"format": "pt"})
    return dst


def add_qwen3_next_mtp(src: str | Path, dst: str | Path, *, seed: int = 0, agreeing: float | None = None) -> Path:
    """A copy at ``dst`` of the tiny Qwen3-Next checkpoint at ``src`` with one multi-token-prediction layer, named as
    Qwen publishes it (``mtp.*``; transformers writes none): ``mtp.layers.0`` a copy of the last full-attention layer,
    the pre-projection norms and ``fc`` random, ``mtp.norm`` the target's final norm.

    ``agreeing`` (a scale in [0, 1]) makes a checkpoint whose draft is accepted often: the target's MLP outputs are
    zeroed and its attention and linear-attention outputs scaled by ``agreeing``, and the MTP layer reduced to
    ``lm_head(norm(embed(next token)))``.  At 0 the target's next token depends on the current token alone and the
    draft predicts it exactly; above 0 the target also reads its context and the draft is right less often."""
    import shutil

    from safetensors.torch import load_file, save_file

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
    with staged_dir(dst, writer="atom_core.tiny.add_qwen3_next_mtp") as out:
        for file in src.iterdir():
            if file.is_file() and not file.name.startswith("model.safetensors") and file.name != MARKER:
                shutil.copy(file, out / file.name)
        (out / "config.json").write_text(json.dumps(dict(config, num_nextn_predict_layers=1), indent=2))
        save_file({**tensors, **mtp}, str(out / "model.safetensors"), metadata={"format": "pt"})
    return dst
