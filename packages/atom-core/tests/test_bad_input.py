"""Bad input, as a new user gives it: broken checkpoints, wrong arguments, output directories that hold
something.  Each case runs the ``atom`` command (in process, through ``main``) and checks the exit code
(``atom_core.errors``: 2 usage, 3 checkpoint, 4 unsupported, 70 internal), that the one-line message
names the cause and the file / tensor / argument, and for the writers that nothing there before is lost."""

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from atom_core import cli
from atom_core.errors import CheckpointError
from atom_core.loader import Checkpoint
from atom_core.loader.checkpoint import INDEX_FILE
from atom_core.quant.quantize import quantize_checkpoint
from atom_core.runtime.runner import Runner

ARCH = "Qwen3ForCausalLM"  # vocab 512, 512 positions, 2 layers
GEN = ["--max-new-tokens", "2", "--dtype", "float32", "--device", "cpu"]
QUANTIZE = ["--scheme", "ptpc-fp8", "--device", "cpu"]


@pytest.fixture(scope="module")
def base(tiny):
    return Path(tiny(ARCH))


@pytest.fixture(scope="module")
def sharded(tiny):
    return Path(tiny(ARCH, max_shard_size="1MB"))


@pytest.fixture(scope="module")
def fp8_block(base, tmp_path_factory):
    return quantize_checkpoint(base, tmp_path_factory.mktemp("fp8") / "q", "fp8-block")


def atom(capsys, *argv) -> tuple[int, str]:
    """Run ``atom ARGV`` in process: (exit code, stderr)."""
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    return code, capsys.readouterr().err


def assert_error(capsys, argv, code, *needles):
    rc, err = atom(capsys, *argv)
    line = err.strip().splitlines()[-1]  # lines before it: progress bars
    assert rc == code, err
    assert line.startswith(f"atom {argv[0]}: error: ") and "Traceback" not in err, err
    for needle in needles:
        assert needle in line, (needle, line)


def snapshot(path: Path) -> dict[str, str]:
    """Every file under ``path`` and a hash of its bytes."""
    return {str(p.relative_to(path)): hashlib.sha1(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*"))
            if p.is_file()}


def siblings(path: Path) -> list[str]:
    """Hidden directories a writer left next to ``path`` (partial or old copies)."""
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}."))


def rewrite(path: Path, edit) -> None:
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def edit_config(model: Path, **changes) -> None:
    config = json.loads((model / "config.json").read_text())
    config.update(changes)
    (model / "config.json").write_text(json.dumps(config))


# ------------------------------------------------------------------------------ broken checkpoints
def _int32(m):
    rewrite(m / "model.safetensors", lambda t: t.update({"model.layers.0.mlp.down_proj.weight":
                                                         t["model.layers.0.mlp.down_proj.weight"].to(torch.int32)}))


def _fp8_no_config(m):
    rewrite(m / "model.safetensors",
            lambda t: t.update({k: v.to(torch.float8_e4m3fn) for k, v in t.items() if k.endswith("proj.weight")}))


def _truncate(m, file="model.safetensors"):
    data = (m / file).read_bytes()
    (m / file).write_bytes(data[: len(data) // 2])


def _garbage_header(m, file="model.safetensors"):
    data = (m / file).read_bytes()
    (m / file).write_bytes(struct.pack("<Q", 0x4141414141414141) + data[8:])


def _shape(m):
    name = "model.layers.1.mlp.down_proj.weight"
    rewrite(m / "model.safetensors", lambda t: t.update({name: t[name][:, :-8].contiguous()}))


def _missing_tensor(m):
    rewrite(m / "model.safetensors", lambda t: t.pop("model.norm.weight"))


def _nan(m):
    def poison(t):
        t["model.layers.1.self_attn.o_proj.weight"][3, 5] = float("nan")
        t["model.norm.weight"][0] = float("inf")

    rewrite(m / "model.safetensors", poison)


def _kv_heads(m):
    edit_config(m, num_key_value_heads=3)


def _hidden_heads(m):  # a Llama config (no head_dim): heads must divide the hidden size
    config = json.loads((m / "config.json").read_text())
    del config["head_dim"]
    config.update(model_type="llama", architectures=["LlamaForCausalLM"], num_attention_heads=3, num_key_value_heads=3)
    (m / "config.json").write_text(json.dumps(config))


def _no_layers(m):  # no layer_types for transformers to compare with: ATOM's own check names the field
    config = json.loads((m / "config.json").read_text())
    config.pop("layer_types", None)
    config["num_hidden_layers"] = 0
    (m / "config.json").write_text(json.dumps(config))


def _index(m, data):
    (m / "model.safetensors.index.json").write_text(json.dumps(data))


BROKEN = {
    "quantization_config a string": (lambda m: edit_config(m, quantization_config="fp8"),
                                     "/config.json: quantization_config must be a JSON object, got 'fp8'"),
    "zero kv heads": (lambda m: edit_config(m, num_key_value_heads=0),
                      "/config.json: num_key_value_heads must be a positive integer (or absent), got 0"),
    "zero layers": (_no_layers, "/config.json: num_hidden_layers must be a positive integer, got 0"),
    "zero vocabulary": (lambda m: edit_config(m, vocab_size=0), "/config.json: vocab_size must be a positive integer"),
    "zero positions": (lambda m: edit_config(m, max_position_embeddings=0),
                       "/config.json: max_position_embeddings must be a positive integer, got 0"),
    "negative norm eps": (lambda m: edit_config(m, rms_norm_eps=-1.0), "/config.json: rms_norm_eps must be a finite"),
    "model_type not a string": (lambda m: edit_config(m, model_type=["qwen3"]), "/config.json: model_type must be a string"),
    "index a list": (lambda m: _index(m, [1, 2]), "model.safetensors.index.json holds a JSON list, not an object"),
    "index weight_map a list": (lambda m: _index(m, {"weight_map": ["model.safetensors"]}),
                                "model.safetensors.index.json: weight_map is a JSON list"),
    "index file name a number": (lambda m: _index(m, {"weight_map": {"model.norm.weight": 5}}),
                                 "model.safetensors.index.json: weight_map places model.norm.weight in 5"),
    "generation_config not JSON": (lambda m: (m / "generation_config.json").write_text("{bad"),
                                   "generation_config.json is not valid JSON"),
    "generation_config a list": (lambda m: (m / "generation_config.json").write_text("[1]"),
                                 "generation_config.json holds a JSON list, not an object"),
    "eos_token_id a string": (lambda m: (m / "generation_config.json").write_text('{"eos_token_id": "</s>"}'),
                              "generation_config.json: eos_token_id must be a token id or a list of them"),

    "int32 weight": (_int32, "model.layers.0.mlp.down_proj.weight is int32, expected float16"),
    "fp8 without quantization_config": (_fp8_no_config, "float8_e4m3fn, expected float16 / bfloat16 / float32"),
    "truncated file": (_truncate, "model.safetensors: not a readable safetensors file: truncated at byte"),
    "garbage header length": (_garbage_header, "model.safetensors: not a readable safetensors file: the header length"),
    "wrong shape": (_shape, "model.layers.1.mlp.down_proj.weight into model.layers.1.mlp.down_proj.weight: shape mismatch"),
    "missing tensor": (_missing_tensor, "did not provide: model.norm.weight"),
    "non-finite weights": (_nan, "model.layers.1.self_attn.o_proj.weight, model.norm.weight hold NaN or infinity"),
    "kv heads do not divide heads": (_kv_heads, "/config.json: num_attention_heads (4) is not a multiple of "
                                                "num_key_value_heads (3)"),
    "heads do not divide hidden size": (_hidden_heads, "/config.json: Class validation error for validator "
                                        "'validate_architecture': ValueError: The hidden size (256) is not a multiple "
                                        "of the number of attention heads (3)"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_broken_checkpoint(base, tmp_path, capsys, case):
    break_it, message = BROKEN[case]
    model = Path(shutil.copytree(base, tmp_path / "m"))
    break_it(model)
    assert_error(capsys, ["generate", "--model", model, "--prompt-token-ids", "1,2", *GEN], 3, message)


def test_sharded_checkpoint_faults(sharded, tmp_path, capsys):
    """A shard the index names is gone; a tensor lies in two shards (two checkpoints mixed)."""
    model = Path(shutil.copytree(sharded, tmp_path / "m"))
    shards = sorted(model.glob("model-*.safetensors"))
    second = load_file(str(shards[1]))
    shards[1].unlink()
    assert_error(capsys, ["generate", "--model", model, "--prompt-token-ids", "1", *GEN], 3,
                 f"missing shard(s): {shards[1].name}")
    save_file(second, str(shards[1]), metadata={"format": "pt"})
    name = next(iter(second))
    rewrite(shards[0], lambda t: t.update({name: second[name]}))
    assert_error(capsys, ["generate", "--model", model, "--prompt-token-ids", "1", *GEN], 3,
                 f"tensor {name} is in both {shards[0].name} and {shards[1].name}")


@pytest.mark.parametrize("change,code,message", [
    ({"weight_block_size": [64, 64]}, 3, "weight_scale_inv"),  # the scales were written for 128 x 128 blocks
    ({"weight_block_size": [128]}, 4, "weight_block_size [bn, bk]"),
    ({"weight_block_size": [0, 128]}, 4, "two positive integers"),
    ({"quant_method": "int3"}, 4, "unsupported quantization scheme 'int3'"),
])
def test_bad_quantization_config(fp8_block, tmp_path, capsys, change, code, message):
    model = Path(shutil.copytree(fp8_block, tmp_path / "m"))
    config = json.loads((model / "config.json").read_text())
    config["quantization_config"].update(change)
    (model / "config.json").write_text(json.dumps(config))
    assert_error(capsys, ["generate", "--model", model, "--prompt-token-ids", "1", *GEN], code, message)


def test_scales_of_the_wrong_shape(fp8_block, tmp_path, capsys):
    model = Path(shutil.copytree(fp8_block, tmp_path / "m"))
    name = "model.layers.0.mlp.down_proj.weight_scale_inv"
    rewrite(model / "model.safetensors", lambda t: t.update({name: t[name][:, :1].contiguous()}))
    assert_error(capsys, ["generate", "--model", model, "--prompt-token-ids", "1", *GEN], 3, name, "shape mismatch")


def test_missing_dir_and_unknown_architecture(base, tmp_path, capsys):
    assert_error(capsys, ["generate", "--model", tmp_path / "nowhere", "--prompt-token-ids", "1", *GEN], 3,
                 f"{tmp_path / 'nowhere'} does not exist")
    model = Path(shutil.copytree(base, tmp_path / "m"))
    edit_config(model, architectures=["FooForCausalLM"])
    assert_error(capsys, ["generate", "--model", model, "--prompt-token-ids", "1", *GEN], 4,
                 "FooForCausalLM", "supported: ")


@pytest.mark.parametrize("file,args,message", [
    ("tokenizer.json", ["--prompt", "hi"], "tokenizer.json is not a tokenizer file the tokenizers library can read"),
    ("tokenizer_config.json", ["--prompt", "hi", "--chat"], "transformers cannot load its tokenizer (for --chat)"),
])
def test_unreadable_tokenizer_files(base, tmp_path, capsys, file, args, message):
    model = Path(shutil.copytree(base, tmp_path / "m"))
    (model / file).write_text("{not json")
    assert_error(capsys, ["generate", "--model", model, *args, *GEN], 3, str(model), message)


# ------------------------------------------------------------------------------ bad arguments
@pytest.fixture
def no_model_built(monkeypatch):
    """These are argument errors: they must be found before the model is built or loaded."""
    import atom_core.runtime.runner as runner

    def refuse(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr(runner.Runner, "__init__", refuse)


@pytest.mark.parametrize("args,code,message", [
    (["--prompt-token-ids", "1,512"], 2, "token id 512 (position 1) is outside the model's vocabulary [0, 512)"),
    (["--prompt-token-ids", "1000000"], 2, "token id 1000000 (position 0)"),
    (["--prompt-token-ids", "3,-5"], 2, "token id -5 (position 1)"),
    (["--prompt-token-ids", "1", "--prompt-token-ids", "1,2,512"], 2, "prompt 1: token id 512"),
    (["--prompt-token-ids", "1", "--max-new-tokens", "0"], 2, "max_new_tokens must be >= 1, got 0"),
    (["--prompt-token-ids", ",".join(["1"] * 500), "--max-new-tokens", "13"], 2,
     "500 prompt tokens + max_new_tokens 13 exceed the model's 512 positions"),
    (["--prompt-token-ids", "1", "--temperature", "-1"], 2, "temperature must be a finite number >= 0"),
    (["--prompt-token-ids", "1", "--top-p", "0"], 2, "top_p must be in (0, 1]"),
    (["--prompt-token-ids", "1", "--device", "cuda"], 4, "device 'cuda' asked for"),
])
def test_bad_arguments_fail_before_the_model_is_built(base, capsys, no_model_built, args, code, message):
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    argv = ["generate", "--model", base, "--dtype", "float32", *args]
    if "--device" not in args:
        argv += ["--device", "cpu"]
    assert_error(capsys, argv, code, message)


@pytest.mark.parametrize("env,message", [
    ({"ATOM_KERNEL_BACKEND": "bogus"}, "ATOM_KERNEL_BACKEND='bogus' names unknown backend 'bogus'"),
    ({"ATOM_KERNEL_BACKEND": "rms_norm=bogus"}, "names unknown backend 'bogus'"),
    ({"ATOM_KERNEL_BACKEND": "rms_nrom=reference"}, "names unknown op 'rms_nrom' (did you mean 'rms_norm'?); ops: "),
    ({"ATOM_KERNEL_BACKEND": "=triton"}, "'=triton' is not op=backend"),
    ({"ATOM_KERNEL_BACKEND": "rms_norm_gated=aiter"}, "op 'rms_norm_gated' has no 'aiter' backend"),
    ({"ATOM_KERNEL_BACKEND": "aiter"}, "asks for 'aiter' on cpu: aiter runs only on GPU tensors"),  # at model build
    ({"ATOM_AITER_MXFP4_A4W4": "2"}, "ATOM_AITER_MXFP4_A4W4='2' is not a switch value"),
    ({"ATOM_DISABLE_VLLM_PLUGIN": "maybe"}, "ATOM_DISABLE_VLLM_PLUGIN='maybe' is not a switch value"),
    ({"ATOM_MXFP4_LAYOUT": "cols"}, "ATOM_MXFP4_LAYOUT='cols': expected one of auto, rows"),
])
def test_bad_switches_fail_at_start(base, capsys, monkeypatch, no_model_built, env, message):
    """Every ATOM_* switch is checked before anything is loaded: a bad kernel backend was "a bug in ATOM" after the
    model had loaded, a misspelt op name was silently ignored."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert_error(capsys, ["generate", "--model", base, "--prompt-token-ids", "1", *GEN], 2, message)
    if "on cpu" not in message:  # the device is known once a command picks it: `atom env` names none
        assert_error(capsys, ["env"], 2, message)


def test_debug_shows_the_traceback(base, capsys, monkeypatch):
    argv = ["generate", "--model", base, "--prompt-token-ids", "512", *GEN]
    for extra, env in ((["--debug"], None), ([], "1")):
        if env:
            monkeypatch.setenv("ATOM_DEBUG", env)
        rc, err = atom(capsys, *argv, *extra)
        assert rc == 2 and "Traceback (most recent call last)" in err and "in check_prompts" in err
        assert err.strip().splitlines()[-1].startswith("atom generate: error: prompt 0: token id 512")


def test_exit_codes_from_a_real_process(tmp_path):
    """One subprocess: the installed entry point exits with the code, no traceback, one line."""
    env = {k: v for k, v in os.environ.items() if k != "ATOM_DEBUG"}
    proc = subprocess.run([sys.executable, "-m", "atom_core.cli", "generate", "--model", str(tmp_path / "none"),
                           "--prompt-token-ids", "1"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip() == f"atom generate: error: {tmp_path / 'none'} does not exist"


def test_unexpected_errors_keep_their_traceback(base, capsys, monkeypatch):
    import atom_core.runtime.runner as runner

    def bug(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(runner.Runner, "generate", bug)
    rc, err = atom(capsys, "generate", "--model", base, "--prompt-token-ids", "1", *GEN)
    assert rc == 70 and "Traceback (most recent call last)" in err and "KeyError: 'a bug'" in err


# ------------------------------------------------------------------------------ writers
@pytest.fixture
def occupied(sharded, tmp_path):
    """A directory holding another (sharded) checkpoint, and its contents."""
    out = Path(shutil.copytree(sharded, tmp_path / "out"))
    return out, snapshot(out)


def test_writers_refuse_a_directory_holding_a_checkpoint(base, occupied, capsys):
    out, before = occupied
    assert_error(capsys, ["quantize", "--model", base, "--scheme", "ptpc-fp8", "--out", out, "--device", "cpu"], 2,
                 f"{out} is not empty", "--overwrite")
    assert_error(capsys, ["make-tiny", ARCH, out], 2, f"{out} is not empty", "--overwrite")
    assert snapshot(out) == before and not siblings(out)


def test_overwrite_replaces_only_checkpoints(tmp_path, capsys):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me")
    assert_error(capsys, ["make-tiny", ARCH, notes, "--overwrite"], 2, "was not written by ATOM")
    assert (notes / "todo.txt").read_text() == "keep me"


def test_quantize_overwrite_replaces_the_whole_directory(base, occupied, capsys):
    out, _ = occupied
    rc, err = atom(capsys, "quantize", "--model", base, "--scheme", "ptpc-fp8", "--out", out, "--device", "cpu",
                   "--overwrite")
    assert rc == 0, err
    assert sorted(p.name for p in out.glob("*.safetensors")) == ["model.safetensors"]
    assert not (out / INDEX_FILE).exists() and not siblings(out)  # no stale index, no partial or old copies
    assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == "compressed-tensors"
    assert len(Checkpoint(out).weight_map) > 0


def test_make_tiny_overwrite_leaves_a_loadable_checkpoint(occupied, capsys):
    out, _ = occupied
    rc, err = atom(capsys, "make-tiny", "LlamaForCausalLM", out, "--overwrite")
    assert rc == 0, err
    assert not (out / INDEX_FILE).exists() and not siblings(out)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    Checkpoint(out)  # one model.safetensors, no stale index or shards


@pytest.mark.parametrize("overwrite", [False, True])
def test_quantize_killed_halfway_leaves_the_old_directory(sharded, tmp_path, capsys, monkeypatch, overwrite):
    """Fault injection: the second shard's write raises.  The destination is untouched (the old checkpoint
    there, or nothing) and no partial directory is left."""
    import atom_core.quant.quantize as quantize

    out = tmp_path / "out"
    if overwrite:
        shutil.copytree(sharded, out)
    before = snapshot(out) if overwrite else None
    real_save, written = quantize.save_file, []

    def save_then_die(tensors, path, **kwargs):
        if written:
            raise RuntimeError("killed mid-write")
        real_save(tensors, path, **kwargs)
        written.append(path)

    monkeypatch.setattr(quantize, "save_file", save_then_die)
    argv = ["quantize", "--model", sharded, "--scheme", "fp8-block", "--out", out, "--device", "cpu"]
    rc, err = atom(capsys, *argv, *(["--overwrite"] if overwrite else []))
    assert rc == 70 and "RuntimeError: killed mid-write" in err and written
    assert (snapshot(out) == before) if overwrite else not out.exists()
    assert not siblings(out)


@pytest.mark.parametrize("command", ["quantize", "make-tiny"])
def test_out_below_a_file(base, tmp_path, capsys, command):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "sub"
    argv = (["quantize", "--model", base, "--out", out, *QUANTIZE] if command == "quantize" else ["make-tiny", ARCH, out])
    assert_error(capsys, argv, 2, f"cannot write {out}: {tmp_path / 'file'} is a file, not a directory")
    assert (tmp_path / "file").read_text() == "x"


@pytest.mark.parametrize("size", ["lots", "-5", "0"])
def test_bad_max_shard_size(tmp_path, capsys, size):
    assert_error(capsys, ["make-tiny", ARCH, tmp_path / "t", "--max-shard-size", size], 2,
                 f"--max-shard-size {size!r} is not a size")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("failure", ["OSError", "SafetensorError"])
def test_disk_full_while_quantizing(sharded, occupied, capsys, monkeypatch, failure):
    """A full disk halfway: one line naming the output and the cause; the old checkpoint there stays whole."""
    import errno

    from safetensors import SafetensorError

    import atom_core.quant.quantize as quantize

    out, before = occupied
    real_save, written = quantize.save_file, []

    def save_then_fill(tensors, path, **kwargs):
        if written:
            if failure == "OSError":
                raise OSError(errno.ENOSPC, "No space left on device", path)
            raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: '
                                  '"No space left on device" })')
        real_save(tensors, path, **kwargs)
        written.append(path)

    monkeypatch.setattr(quantize, "save_file", save_then_fill)
    argv = ["quantize", "--model", sharded, "--out", out, *QUANTIZE, "--overwrite"]
    assert_error(capsys, argv, 1, f"writing {out} failed, nothing was changed there", "No space left on device")
    assert snapshot(out) == before and not siblings(out)


def test_ctrl_c_while_quantizing(sharded, occupied, capsys, monkeypatch):
    """Ctrl-C halfway through ``atom quantize``: one line, exit 130, the old checkpoint whole, no partial copy."""
    import atom_core.quant.quantize as quantize

    out, before = occupied
    real_save, written = quantize.save_file, []

    def save_then_interrupt(tensors, path, **kwargs):
        if written:
            raise KeyboardInterrupt
        real_save(tensors, path, **kwargs)
        written.append(path)

    monkeypatch.setattr(quantize, "save_file", save_then_interrupt)
    rc, err = atom(capsys, "quantize", "--model", sharded, "--out", out, *QUANTIZE, "--overwrite")
    assert rc == 130 and "Traceback" not in err and err.strip().splitlines()[-1].startswith("atom quantize: interrupted")
    assert snapshot(out) == before and not siblings(out)


def test_mxfp4_without_triton(base, tmp_path, capsys, monkeypatch):
    """The README's install lines bring no Triton: an MXFP4 checkpoint runs through the reference kernels (it was
    a ModuleNotFoundError)."""
    from atom_kernels import dispatch

    out = quantize_checkpoint(base, tmp_path / "mx", "mxfp4")
    monkeypatch.setitem(sys.modules, "triton", None)
    for name in [m for m in sys.modules if m.startswith("atom_kernels.ops.mxfp4_mm.") and m.endswith(("planner", "triton"))]:
        monkeypatch.delitem(sys.modules, name)
    dispatch._triton_present.cache_clear()
    try:
        rc, err = atom(capsys, "generate", "--model", out, "--prompt-token-ids", "1,2", *GEN)
    finally:
        dispatch._triton_present.cache_clear()
    assert rc == 0, err


def test_make_tiny_failing_mid_write_leaves_the_old_directory(occupied, capsys, monkeypatch):
    import atom_core.tiny as tiny

    out, before = occupied

    def die(*args):
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(tiny, "text_config", die)  # after the weights and tokenizer are written
    rc, err = atom(capsys, "make-tiny", ARCH, out, "--overwrite")
    assert rc == 70 and "killed mid-write" in err
    assert snapshot(out) == before and not siblings(out)


# ------------------------------------------------------------------------------ through a host's loader
def test_host_loaders_get_the_same_checks(base):
    """vLLM and SGLang hand ``model.load_weights`` the tensors they read: the dtype and value checks are
    ATOM's loader's, so a bad checkpoint fails at load with ATOM's message there too."""
    model = Runner(base).model
    tensors = load_file(str(base / "model.safetensors"))
    name = "model.layers.0.self_attn.q_proj.weight"
    with pytest.raises(CheckpointError, match=rf"{name} is float8_e4m3fn.*quantization_config"):
        model.load_weights({**tensors, name: tensors[name].to(torch.float8_e4m3fn)}.items())
    poisoned = tensors[name].clone()
    poisoned[0, 0] = float("nan")
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.self_attn\.qkv_proj\.weight hold NaN"):
        model.load_weights({**tensors, name: poisoned}.items())


def host_reader(model_dir: Path):
    """A host's own safetensors iterator, as vLLM's and SGLang's read a checkpoint: file by file, ``safe_open``."""
    from safetensors import safe_open

    for file in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


@pytest.mark.parametrize("break_it,message", [(_truncate, "truncated at byte"), (_garbage_header, "the header length")])
def test_host_reader_failing_on_a_corrupt_shard_names_the_file(sharded, tmp_path, break_it, message):
    """A host's reader raises safetensors' own error while ``load_weights`` consumes it: ATOM's error names the
    broken shard of ``model.checkpoint_dir`` (the adapters set it) as ATOM's reader would."""
    model = Runner(sharded).model
    broken = Path(shutil.copytree(sharded, tmp_path / "m"))
    second = sorted(broken.glob("model-*.safetensors"))[1]
    break_it(broken, second.name)
    model.checkpoint_dir = str(broken)
    with pytest.raises(CheckpointError, match=rf"^{second}: not a readable safetensors file: {message}"):
        model.load_weights(host_reader(broken))
    model.checkpoint_dir = None  # not known: still ATOM's error, with safetensors' words
    with pytest.raises(CheckpointError, match="a safetensors file of the checkpoint is not readable: Error while"):
        model.load_weights(host_reader(broken))
