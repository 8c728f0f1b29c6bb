import io
import json
import sys
from pathlib import Path

import pytest

from atom_core import catalog
from atom_core.cli import TextStream, main
from atom_core.runtime.runner import Runner
from atom_core.runtime.sampler import SamplingParams


@pytest.mark.parametrize("graphs", [[], ["--cuda-graphs"]])
def test_generate_json_matches_runner(tiny, capsys, graphs):
    model_dir = tiny("Qwen3ForCausalLM")
    assert main(["generate", "--model", model_dir, "--prompt-token-ids", "5,6,7", "--prompt-token-ids", "9",
                 "--max-new-tokens", "5", "--dtype", "float32", "--device", "cpu", "--ignore-eos", "--json",
                 *graphs]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    expected = Runner(model_dir).generate([[5, 6, 7], [9]], SamplingParams(max_new_tokens=5, ignore_eos=True))
    assert [line["token_ids"] for line in lines] == [o.token_ids for o in expected]
    assert all(len(line["logprobs"]) == 5 for line in lines)


def test_generate_from_text_with_sampling(tiny, capsys):
    model_dir = tiny("LlamaForCausalLM")
    assert main(["generate", "--model", model_dir, "--prompt", "Hello world", "--max-new-tokens", "4",
                 "--temperature", "0.8", "--top-p", "0.9", "--seed", "1", "--dtype", "float32", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.strip()


def test_env_reports_backends_and_catalog(capsys):
    assert main(["env", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kernel_backends"]["rms_norm"] == "reference"
    assert info["architectures"] == catalog.supported()


def test_env_shows_which_class_serves_each_architecture(capsys, monkeypatch):
    """`atom env` prints atom_core.takeover's decision per host on this machine's platform (the CPU here)."""
    monkeypatch.delenv("ATOM_TAKE_OVER", raising=False)
    assert main(["env", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)["take_over"]
    assert list(table) == ["vLLM on CPU", "SGLang on CPU"]
    assert table["vLLM on CPU"].startswith("vLLM's own classes serve, in vLLM on CPU: " + ", ".join(catalog.ARCHITECTURES))
    monkeypatch.setenv("ATOM_TAKE_OVER", "Qwen3ForCausalLM")
    assert main(["env", "--json"]) == 0
    table = json.loads(capsys.readouterr().out)["take_over"]
    assert table["SGLang on CPU"].startswith("ATOM's classes serve, in SGLang on CPU: Qwen3ForCausalLM (forced by ")


def test_make_tiny_command(tmp_path, capsys):
    out = tmp_path / "tiny"
    assert main(["make-tiny", "MistralForCausalLM", str(out), "--max-shard-size", "1MB"]) == 0
    assert (out / "model.safetensors.index.json").is_file() and (out / "tokenizer.json").is_file()
    assert json.loads((out / "config.json").read_text())["architectures"] == ["MistralForCausalLM"]


def test_bad_token_ids_are_rejected(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--model", "x", "--prompt-token-ids", "1,a"])
    assert "comma-separated integers" in capsys.readouterr().err


def test_quantize_command_and_online_generate(tiny, tmp_path, capsys):
    model_dir = tiny("Qwen3ForCausalLM")
    out = tmp_path / "ptpc"
    assert main(["quantize", "--model", model_dir, "--scheme", "ptpc-fp8", "--out", str(out), "--device", "cpu"]) == 0
    assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == "compressed-tensors"
    capsys.readouterr()
    args = ["--prompt-token-ids", "5,6,7", "--max-new-tokens", "3", "--dtype", "float32", "--device", "cpu",
            "--ignore-eos", "--json"]
    assert main(["generate", "--model", str(out), *args]) == 0
    from_checkpoint = json.loads(capsys.readouterr().out)
    assert main(["generate", "--model", model_dir, "--quantization", "ptpc-fp8", *args]) == 0
    online = json.loads(capsys.readouterr().out)
    assert from_checkpoint == online
    with pytest.raises(SystemExit):
        main(["quantize", "--model", model_dir, "--scheme", "int3", "--out", str(tmp_path / "x")])


CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}<|im_start|>"


@pytest.fixture
def chat_model(tiny, tmp_path):
    """The tiny Qwen3 with a chat template (transformers' chat_template.jinja) beside its tokenizer."""
    import shutil

    model = Path(shutil.copytree(tiny("Qwen3ForCausalLM"), tmp_path / "chat"))
    (model / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return str(model)


def generated_prompts(monkeypatch, argv: list[str]) -> list[list[int]]:
    """The prompt token ids `atom generate argv` hands the runner."""
    seen = []
    real = Runner.generate
    monkeypatch.setattr(Runner, "generate", lambda self, prompts, *a, **k: seen.extend(prompts) or real(self, prompts, *a, **k))
    assert main(["generate", *argv, "--max-new-tokens", "2", "--dtype", "float32", "--device", "cpu", "--json"]) == 0
    return seen


def test_generate_uses_the_chat_template_by_default(chat_model, tiny, monkeypatch, capsys):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(chat_model) / "tokenizer.json"))
    text = "the cat sat"
    templated = tokenizer.encode(f"<|im_start|>{text}<|im_end|><|im_start|>", add_special_tokens=False).ids
    assert generated_prompts(monkeypatch, ["--model", chat_model, "--prompt", text]) == [templated]
    assert generated_prompts(monkeypatch, ["--model", chat_model, "--chat", "--prompt", text]) == [templated]
    plain = tokenizer.encode(text).ids
    assert generated_prompts(monkeypatch, ["--model", chat_model, "--no-chat", "--prompt", text]) == [plain]
    # no template: the text as it is, unless --chat asks for one
    assert generated_prompts(monkeypatch, ["--model", tiny("Qwen3ForCausalLM"), "--prompt", text]) == [plain]
    capsys.readouterr()
    assert main(["generate", "--model", tiny("Qwen3ForCausalLM"), "--chat", "--prompt", text]) == 2
    assert "has no chat template (--chat; --no-chat" in capsys.readouterr().err


class Terminal(io.StringIO):
    """A stdout that says it is a terminal and records each write."""

    def __init__(self):
        super().__init__()
        self.writes: list[str] = []

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


def test_generate_streams_to_a_terminal(tiny, monkeypatch, capsys):
    """On a terminal one prompt's text is written token by token, and adds up to what a pipe gets in one piece."""
    argv = ["generate", "--model", tiny("LlamaForCausalLM"), "--prompt", "the cat", "--max-new-tokens", "12",
            "--ignore-eos", "--dtype", "float32", "--device", "cpu"]
    assert main(argv) == 0
    piped = capsys.readouterr().out
    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    assert main(argv) == 0
    assert terminal.getvalue() == piped
    assert len([w for w in terminal.writes if w]) >= 4, terminal.writes  # in pieces, as the tokens come


def test_text_stream_holds_back_a_split_character():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # one token per byte
    tokenizer = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    ids = tokenizer.encode("a\u20ac").ids  # "a", then the three bytes of the euro sign
    assert len(ids) == 4
    out = io.StringIO()
    stream = TextStream(tokenizer, out)
    for token in ids[:3]:
        stream.add(token)
    assert out.getvalue() == "a"  # two of the euro sign's bytes decode to a replacement character: held back
    stream.add(ids[3])
    stream.end()
    assert out.getvalue() == "a\u20ac\n"
