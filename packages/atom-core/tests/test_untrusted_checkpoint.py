"""A checkpoint is untrusted input: names from it resolve inside it, links out of it are never followed, its code
never runs, writers touch only their output directory, and a config that contradicts its weights is refused
rather than silently followed one way.  Each case crafts the bad checkpoint and runs the ``atom`` command (in
process, through ``main``): one line naming the file and the name, a non-zero exit, nothing outside the output
directory changed (contents and modification times)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_bad_input import ARCH, GEN, assert_error, atom

from atom_core.errors import CheckpointError, UnsupportedConfigError
from atom_core.loader import Checkpoint
from atom_core.loader.checkpoint import INDEX_FILE

QUANTIZE = ["--scheme", "ptpc-fp8", "--device", "cpu"]


@pytest.fixture(scope="module")
def base(tiny):
    return Path(tiny(ARCH))


@pytest.fixture(scope="module")
def sharded(tiny):
    return Path(tiny(ARCH, max_shard_size="1MB"))


def state(path: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``path`` (links not followed): its bytes and modification time."""
    out = {}
    for p in sorted(path.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(path))] = (p.read_bytes(), p.stat().st_mtime_ns)
    return out


def edit_index(model: Path, edit) -> None:
    index = json.loads((model / INDEX_FILE).read_text())
    edit(index["weight_map"])
    (model / INDEX_FILE).write_text(json.dumps(index))


def steer_first_shard(model: Path, name: str) -> str:
    """Point every tensor of the index's first shard at ``name``; returns the shard's own name."""
    first = sorted(set(json.loads((model / INDEX_FILE).read_text())["weight_map"].values()))[0]
    edit_index(model, lambda wm: wm.update({k: name for k, v in wm.items() if v == first}))
    return first


# ------------------------------------------------------------------------------ names from the index
@pytest.mark.parametrize("kind", ["dotdot", "absolute"])
def test_index_names_outside_the_model_are_refused(sharded, tmp_path, capsys, kind):
    """``../x.safetensors`` or an absolute path in the index: a real shard lies there (another model's), so the
    old code read it (generate) and overwrote it with its fp8 version (quantize); now both refuse."""
    model = Path(shutil.copytree(sharded, tmp_path / "m"))
    other = tmp_path / "other"
    other.mkdir()
    first = sorted(model.glob("model-*.safetensors"))[0]
    shutil.copy(first, other / "victim.safetensors")
    name = "../other/victim.safetensors" if kind == "dotdot" else str(other / "victim.safetensors")
    steer_first_shard(model, name)
    (model / first.name).unlink()
    before = state(tmp_path)
    why = "climbs out of the checkpoint directory" if kind == "dotdot" else "is an absolute path"
    assert_error(capsys, ["generate", "--model", model, *GEN, "--prompt-token-ids", "1"], 3,
                 str(model / INDEX_FILE), repr(name), why)
    out = tmp_path / "q"
    assert_error(capsys, ["quantize", "--model", model, "--out", out, *QUANTIZE], 3, repr(name), why)
    assert state(tmp_path) == before and not out.exists()


def test_a_shard_linked_out_of_the_model_is_refused(sharded, tmp_path, capsys):
    model = Path(shutil.copytree(sharded, tmp_path / "m"))
    first = sorted(model.glob("model-*.safetensors"))[0]
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(first, outside)
    first.symlink_to(outside)
    before = state(tmp_path)
    assert_error(capsys, ["generate", "--model", model, *GEN, "--prompt-token-ids", "1"], 3,
                 repr(first.name), f"is a link to {outside}, outside the checkpoint directory")
    assert_error(capsys, ["quantize", "--model", model, "--out", tmp_path / "q", *QUANTIZE], 3, repr(first.name))
    assert state(tmp_path) == before and not (tmp_path / "q").exists()


def test_a_single_file_checkpoint_linked_out_is_refused(base, tmp_path, capsys):
    model = Path(shutil.copytree(base, tmp_path / "m"))
    shutil.move(model / "model.safetensors", tmp_path / "weights.safetensors")
    (model / "model.safetensors").symlink_to(tmp_path / "weights.safetensors")
    assert_error(capsys, ["generate", "--model", model, *GEN, "--prompt-token-ids", "1"], 3,
                 "'model.safetensors' is a link to", "outside the checkpoint directory")


def test_config_linked_out_of_the_model_is_refused(base, tmp_path, capsys):
    model = Path(shutil.copytree(base, tmp_path / "m"))
    shutil.move(model / "config.json", tmp_path / "config.json")
    (model / "config.json").symlink_to(tmp_path / "config.json")
    assert_error(capsys, ["generate", "--model", model, *GEN, "--prompt-token-ids", "1"], 3,
                 "'config.json' is a link to", "outside the checkpoint directory")


def test_links_inside_the_model_and_the_hub_cache_layout_load(sharded, tmp_path):
    """Links that stay inside are followed: a shard linked to another name in the model, and the hub cache's
    ``snapshots/<rev>/`` links into the repository's ``blobs/``."""
    model = Path(shutil.copytree(sharded, tmp_path / "m"))
    first = sorted(model.glob("model-*.safetensors"))[0]
    (model / "store").mkdir()
    shutil.move(first, model / "store" / "blob")
    first.symlink_to(Path("store") / "blob")
    assert len(dict(Checkpoint(model).tensors())) == len(Checkpoint(sharded).weight_map)

    repo = tmp_path / "models--org--tiny"
    snapshot = repo / "snapshots" / "abc123"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, file in enumerate(sorted(sharded.iterdir())):
        blob = repo / "blobs" / f"{i:040x}"
        shutil.copy(file, blob)
        (snapshot / file.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    assert len(dict(Checkpoint(snapshot).tensors())) == len(Checkpoint(sharded).weight_map)


def test_chat_refuses_a_tokenizer_linked_out(base, tmp_path, capsys):
    """transformers opens tokenizer files of its own choosing: every link in the model must stay inside first."""
    model = Path(shutil.copytree(base, tmp_path / "m"))
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"chat_template": "{{ 'leaked' }}"}))
    (model / "tokenizer_config.json").unlink()
    (model / "tokenizer_config.json").symlink_to(secret)
    assert_error(capsys, ["generate", "--model", model, "--chat", "--prompt", "hi", *GEN], 3,
                 "tokenizer_config.json is a link to", "outside the checkpoint directory")


# ------------------------------------------------------------------------------ atom quantize copies
def test_quantize_copies_no_link_out_of_the_model(base, tmp_path, capsys, caplog):
    """The source's other files are copied; a README.md linking to a private file is skipped with a warning
    (never copied as that file's contents), a link that stays inside is copied as the file it names."""
    model = Path(shutil.copytree(base, tmp_path / "m"))
    private = tmp_path / "private.txt"
    private.write_text("do not copy me")
    (model / "README.md").symlink_to(private)
    (model / "docs").mkdir()
    (model / "docs" / "LICENSE").write_text("Apache-2.0")
    (model / "LICENSE").symlink_to(Path("docs") / "LICENSE")
    before = state(tmp_path)
    out = tmp_path / "q"
    rc, err = atom(capsys, "quantize", "--model", model, "--out", out, *QUANTIZE)
    assert rc == 0, err
    assert not (out / "README.md").exists() and "do not copy me" not in "".join(
        p.read_text(errors="ignore") for p in out.iterdir() if p.is_file() and p.suffix != ".safetensors")
    assert any("not copying" in r.getMessage() and "README.md" in r.getMessage() for r in caplog.records)
    assert (out / "LICENSE").read_text() == "Apache-2.0" and not (out / "LICENSE").is_symlink()
    assert (out / "tokenizer.json").read_bytes() == (model / "tokenizer.json").read_bytes()
    after = state(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("q/")} == before  # only --out changed


# ------------------------------------------------------------------------------ checkpoint code never runs
def _with_code(model: Path, sentinel: Path) -> None:
    """A ``configuration_evil.py`` that writes ``sentinel`` when imported, named by the config's ``auto_map``."""
    (model / "configuration_evil.py").write_text(
        f"import pathlib\npathlib.Path({str(sentinel)!r}).write_text('ran')\n"
        "from transformers import PretrainedConfig\nclass EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n"
    )
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "configuration_evil.EvilConfig"}
    (model / "config.json").write_text(json.dumps(config))


def test_auto_map_without_model_type_is_one_line_and_never_prompts(base, tmp_path):
    """Run from a terminal-like stdin answering "y": the old code asked whether to run the checkpoint's Python and
    ran it; now the config is refused before transformers sees it."""
    model = Path(shutil.copytree(base, tmp_path / "m"))
    sentinel = tmp_path / "ran"
    _with_code(model, sentinel)
    config = json.loads((model / "config.json").read_text())
    del config["model_type"]
    (model / "config.json").write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k != "ATOM_DEBUG"}
    proc = subprocess.run([sys.executable, "-m", "atom_core.cli", "generate", "--model", str(model),
                           "--prompt-token-ids", "1", "--device", "cpu"], input="y\ny\n", capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"atom generate: error: {model / 'config.json'} has no model_type (it names checkpoint code in auto_map, "
        f"which ATOM never runs); ATOM supports: {', '.join(__import__('atom_core.catalog').catalog.supported())}"
    ]
    assert "Do you wish" not in proc.stdout + proc.stderr and not sentinel.exists()


def test_auto_map_beside_a_known_model_type_is_not_run(base, tmp_path, capsys):
    model = Path(shutil.copytree(base, tmp_path / "m"))
    sentinel = tmp_path / "ran"
    _with_code(model, sentinel)
    rc, err = atom(capsys, "generate", "--model", model, "--prompt-token-ids", "1", *GEN)
    assert rc == 0, err
    assert not sentinel.exists()


def test_every_transformers_loader_is_called_without_remote_code():
    """Every ``from_pretrained`` call in the packages' sources passes ``trust_remote_code=False`` (a call without
    it lets transformers ask, from a terminal, whether to run a checkpoint's code)."""
    import ast

    root = Path(__file__).resolve().parents[3] / "packages"
    missing = []
    for file in root.glob("*/src/**/*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "from_pretrained":
                flag = next((kw.value for kw in node.keywords if kw.arg == "trust_remote_code"), None)
                if not (isinstance(flag, ast.Constant) and flag.value is False):
                    missing.append(f"{file.relative_to(root)}:{node.lineno}")
    assert not missing, missing


# ------------------------------------------------------------------------------ tied embeddings
@pytest.fixture(scope="module")
def tied(tiny):
    return Path(tiny(ARCH, tie_word_embeddings=True))


def _with_lm_head(tied: Path, dst: Path, make_head, drop_embedding: bool = False) -> Path:
    model = Path(shutil.copytree(tied, dst))
    tensors = load_file(str(model / "model.safetensors"))
    tensors["lm_head.weight"] = make_head(tensors["model.embed_tokens.weight"])
    if drop_embedding:
        del tensors["model.embed_tokens.weight"]
    save_file(tensors, str(model / "model.safetensors"), metadata={"format": "pt"})
    return model


def _hf(model: Path):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()


def test_tied_config_with_a_different_lm_head_is_refused(tied, tmp_path, capsys):
    """transformers 5 keeps a separate lm_head.weight that differs from the embedding (untied, with a warning); ATOM
    ties them, so it refuses and says why, instead of generating other tokens."""
    gen = torch.Generator().manual_seed(0)
    model = _with_lm_head(tied, tmp_path / "m", lambda e: e + 0.05 * torch.randn(e.shape, generator=gen))
    head = load_file(str(model / "model.safetensors"))["lm_head.weight"]
    hf = _hf(model)
    assert torch.equal(hf.lm_head.weight, head) and not torch.equal(hf.model.embed_tokens.weight, head)  # the reference
    assert_error(capsys, ["generate", "--model", model, "--prompt-token-ids", "1,2", *GEN], 3,
                 "config.json sets tie_word_embeddings", "lm_head.weight differs from its model.embed_tokens.weight",
                 "set tie_word_embeddings to false")


@pytest.mark.parametrize("case", ["equal copy", "lm_head only"])
def test_tied_config_follows_transformers(tied, tmp_path, case):
    """An lm_head.weight equal to the embedding (as .bin checkpoints store both) loads tied; one without the
    embedding is what both get tied to (transformers swaps the tie's direction)."""
    from atom_core.runtime.runner import Runner

    model = _with_lm_head(tied, tmp_path / "m", lambda e: e.clone(), drop_embedding=case == "lm_head only")
    ids = [[5, 6, 7, 8]]
    with torch.no_grad():
        expected = _hf(model)(torch.tensor(ids)).logits[0]
    got = Runner(model).prompt_logits(ids)[0]
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------ tables sized by what runs
@pytest.mark.parametrize("positions", [10**8, 10**12])
def test_huge_max_position_embeddings_costs_nothing_natively(base, tmp_path, capsys, positions):
    """1e8 took 17 GB before it was stopped, 1e12 was a traceback: the native runner's rotary tables cover what
    it runs."""
    model = Path(shutil.copytree(base, tmp_path / "m"))
    config = json.loads((model / "config.json").read_text())
    config["max_position_embeddings"] = positions
    (model / "config.json").write_text(json.dumps(config))
    rc, err = atom(capsys, "generate", "--model", model, "--prompt-token-ids", "1,2,3", *GEN)
    assert rc == 0, err

    from atom_core.runtime.runner import Runner

    runner = Runner(model)
    assert max(b.numel() for b in runner.model.buffers()) < 10**7


def test_a_host_without_a_length_bound_refuses_a_huge_table(base):
    """vLLM and SGLang build the tables for max_position_embeddings: above the bound, a one-line refusal naming
    the number, before anything is allocated."""
    from atom_core import catalog
    from atom_core.config import load_hf_config
    from atom_core.runtime.host import NativeHost

    config = load_hf_config(base)
    config.max_position_embeddings = 10**12
    with torch.device("meta"), pytest.raises(UnsupportedConfigError, match="max_position_embeddings is 1000000000000"):
        catalog.resolve(config).model_class()(config, NativeHost(max_positions=None))


def test_runner_grows_its_tables_to_what_it_runs(base, monkeypatch):
    """Tables that start short and grow give the tokens and logits tables of full length give."""
    from atom_core.runtime import runner as runner_module
    from atom_core.runtime.sampler import SamplingParams

    prompt = [[(7 * i) % 500 + 1 for i in range(20)]]
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    full = runner_module.Runner(base)
    assert full.host.max_positions == 512
    monkeypatch.setattr(runner_module, "INITIAL_POSITIONS", 8)
    short = runner_module.Runner(base)
    assert short.host.max_positions == 8
    assert short.generate(prompt, params)[0].token_ids == full.generate(prompt, params)[0].token_ids
    assert short.host.max_positions == 50
    torch.testing.assert_close(short.prompt_logits(prompt)[0], full.prompt_logits(prompt)[0], atol=0, rtol=0)


# ------------------------------------------------------------------------------ writers
def test_overwrite_refuses_a_checkpoint_atom_did_not_write(sharded, tmp_path, capsys):
    """A directory holding config.json and shards beside the user's own files: the old code deleted it whole."""
    out = tmp_path / "downloaded"
    shutil.copytree(sharded, out)
    (out / ".atom-checkpoint.json").unlink()
    (out / "notes.txt").write_text("mine")
    before = state(tmp_path)
    for argv in (["quantize", "--model", sharded, "--out", out, *QUANTIZE, "--overwrite"],
                 ["make-tiny", ARCH, out, "--overwrite"]):
        assert_error(capsys, argv, 2, f"{out} is not empty and was not written by ATOM", "--overwrite replaces only")
    assert state(tmp_path) == before


def test_stale_partial_directories_are_removed(base, tmp_path, capsys):
    """A run killed outright leaves ``.NAME.partial-*``; the next write to NAME removes it, unless its writer
    still runs."""
    out = tmp_path / "q"
    dead = tmp_path / ".q.partial-deadbeef"
    dead.mkdir()
    (dead / "model.safetensors").write_bytes(b"half")
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    (dead / ".atom-checkpoint.json").write_text(json.dumps({"written_by": "atom quantize", "pid": proc.pid,
                                                            "host": os.uname().nodename}))
    no_marker = tmp_path / ".q.partial-00000000"
    no_marker.mkdir()
    alive = tmp_path / ".q.partial-a1a1a1a1"
    alive.mkdir()
    (alive / ".atom-checkpoint.json").write_text(json.dumps({"written_by": "atom quantize", "pid": os.getpid(),
                                                             "host": os.uname().nodename}))
    rc, err = atom(capsys, "quantize", "--model", base, "--out", out, *QUANTIZE)
    assert rc == 0, err
    assert not dead.exists() and not no_marker.exists() and alive.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".q.partial-a1a1a1a1", "q"]
    Checkpoint(out)


def test_checkpoint_error_names_the_index_for_a_name_that_is_not_a_path(sharded, tmp_path):
    model = Path(shutil.copytree(sharded, tmp_path / "m"))
    steer_first_shard(model, "")
    with pytest.raises(CheckpointError, match=rf"^{model / INDEX_FILE}: shard name '' is not a file name"):
        Checkpoint(model)
