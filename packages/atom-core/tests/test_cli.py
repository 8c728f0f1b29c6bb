import json

import pytest

from atom_core import catalog
from atom_core.cli import main
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
