"""The end-to-end bench's bookkeeping (atom_tools.e2e.vllm): spread of repeated runs, agreement between two
implementations and kernel tables from profiler traces.  The GPU runs themselves are not part of CI."""

import gzip
import json

import pytest

from atom_tools.e2e import driver
from atom_tools.e2e import vllm as bench
from atom_tools.e2e.driver import AGREEMENT_PROMPTS
from atom_tools.e2e.profile import kernel_table
from atom_tools.e2e.vllm import compare_agreement, main, reference_quantization, reference_scores, summarize


def test_summarize_states_median_and_spread():
    runs = [{"batch": 4, "repeat": r, "ttft_s": 0.1, "total_s": t, "triton_compiles": 3 - r} for r, t in enumerate((1.0, 2.0, 4.0))]
    runs.append({"batch": 8, "repeat": 0, "ttft_s": 9.0, "total_s": 9.0, "triton_compiles": 0})
    row = summarize(runs, 4, output_len=11)
    assert row["output_tok_per_s"] == {"median": 22.0, "min": 11.0, "max": 44.0, "samples": [44.0, 22.0, 11.0]}
    assert row["tpot_ms"]["median"] == round((2.0 - 0.1) / 10 * 1e3, 2)
    assert row["ttft_ms"] == {"median": 100.0, "min": 100.0, "max": 100.0, "samples": [100.0] * 3}
    assert row["triton_compiles"] == [3, 2, 1]  # per repeat, in run order
    assert "compiled" not in row  # no kernel named: the key is left out
    runs[1]["compiled"] = [{"kernel": "_out_kernel", "aligned": ["q_ptr"]}]
    assert summarize(runs, 4, output_len=11)["compiled"] == [[], [{"kernel": "_out_kernel", "aligned": ["q_ptr"]}], []]


def test_agreement_counts_divergence_and_compares_logprobs_only_on_shared_tokens():
    ref = [{"tokens": [1, 2, 3], "logprobs": [-1.0, -2.0, -3.0], "prompt_logprobs": [-0.5, -0.5]},
           {"tokens": [4, 5, 6], "logprobs": [-1.0, -1.0, -1.0], "prompt_logprobs": [-1.0]}]
    other = [{"tokens": [1, 2, 3], "logprobs": [-1.5, -2.0, -3.0], "prompt_logprobs": [-0.5, -0.7]},
             {"tokens": [4, 9, 6], "logprobs": [-1.0, -8.0, -8.0], "prompt_logprobs": [-1.0]}]
    got = compare_agreement(ref, other)
    assert got["identical_greedy"] == 1 and got["mean_first_divergence"] == 2
    assert abs(got["prompt_logprob_max_abs_diff"] - 0.2) < 1e-9
    # output log-probabilities of the first prompt (3 tokens) and the second's first token only
    assert abs(got["output_logprob_mean_abs_diff"] - 0.5 / 4) < 1e-9


def test_reference_scores_say_which_implementation_follows_transformers(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from atom_core.tiny import make_tiny

    model_dir = make_tiny("Qwen3ForCausalLM", tmp_path / "ckpt")
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    prompts = [[5, 9, 13, 2], [7, 3, 11]]
    exact, wrong = [], []
    for prompt in prompts:  # transformers' own greedy continuation, then the same with its second token replaced
        ids = list(prompt)
        for _ in range(3):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0], -1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
        n = len(prompt) - 1
        exact.append({"tokens": ids[len(prompt):], "prompt_logprobs": logp[:n].tolist(), "logprobs": logp[n:].tolist()})
        swapped = ids[len(prompt):]
        swapped[1] = (swapped[1] + 1) % 64
        wrong.append({**exact[-1], "tokens": swapped})
    got = reference_scores(model_dir, prompts, {"exact": exact, "wrong": wrong}, device="cpu")
    assert got["exact"]["output_regret_max"] == 0.0 and got["exact"]["output_reference_greedy"] == 1.0
    assert got["exact"]["prompt_logprob_max_abs_diff"] < 1e-5 and got["exact"]["output_logprob_mean_abs_diff"] < 1e-5
    assert got["wrong"]["output_regret_max"] > 0.0 and got["wrong"]["output_reference_greedy"] < 1.0
    assert got["wrong"]["prompt_logprob_max_abs_diff"] < 1e-5  # the prompts are scored alike


def test_mxfp4_reference_is_dequantized_by_transformers(tmp_path):
    """An MXFP4 checkpoint's reference is read through transformers' dequantizing reader (its kernel path would
    fetch from the Hub, which the offline GPU machine cannot); other checkpoints load as they are."""
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "mxfp4"}}))
    assert reference_quantization(tmp_path)["quantization_config"].dequantize is True
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "fp8"}}))
    assert reference_quantization(tmp_path) == {}


class FakeEngine:
    """Stands in for an engine subprocess: fixed agreement outputs, a timed run takes ``batch`` ms, and the
    run at ``fail_batch`` raises as a cut-off run would."""

    fail_batch = None

    jobs: list = []

    def __init__(self, impl, job, workdir):
        self.impl, self.ready = impl, {"module": f"{impl}.models", "startup_s": 1.0}
        FakeEngine.jobs.append((impl, job["attention_backend"]))
        self.drafting = job.get("speculative_config")

    def triton_compiles(self):
        return 0

    def new_compiles(self):
        return []

    def request(self, op, **kw):
        if op == "agreement":
            return [{"tokens": [1, 2], "logprobs": [-1.0, -1.0], "prompt_logprobs": [-2.0]}]
        if op == "acceptance":
            return {"draft_tokens": 10, "accepted_tokens": 9, "acceptance": 0.9, "config": self.drafting}
        if kw["batch"] == self.fail_batch:
            raise RuntimeError("engine gone")
        return kw["batch"] / 1000 * (1 if kw["max_tokens"] == 1 else 4)

    def close(self):
        pass


def test_compare_saves_each_step_and_keeps_what_a_cut_off_run_measured(monkeypatch, tmp_path):
    monkeypatch.setattr(bench, "EngineProcess", FakeEngine)
    monkeypatch.setattr(FakeEngine, "fail_batch", 8)
    args = bench.argparse.Namespace(max_num_batched_tokens=64, gpu_memory_utilization=0.4, profile=False,
                                    traces_out=None, reference=False, prompt_len=4, output_len=5, repeats=2)
    saved = []
    entry = {"model": "m"}
    with pytest.raises(RuntimeError, match="engine gone"):
        bench.compare(entry, tmp_path / "ckpt", ["vllm", "atom"], [2, 8], args, {}, [[5, 6]],
                      lambda: saved.append(json.loads(json.dumps(entry))))
    # one engine up, both up, agreement, batch 2 timed; batch 8 never finished
    assert [sorted(s["impls"]) for s in saved] == [["vllm"], ["atom", "vllm"], ["atom", "vllm"], ["atom", "vllm"]]
    assert saved[2]["agreement"]["identical_greedy"] == 1
    assert list(entry["impls"]["atom"]["batches"]) == ["2"]
    assert entry["impls"]["vllm"]["batches"]["2"]["output_tok_per_s"]["samples"] == [2 * 5 / 0.008] * 2


def test_kernel_table_sums_gpu_time_per_kernel(tmp_path):
    # gemm 0-3 and 10-12, copy 11-12 inside the second gemm, sum 11-15 started early by programmatic dependent launch
    # (waiting 11-12 for the gemm): busy 8 µs, of which sum's own 3 and copy's none
    events = [{"cat": "kernel", "name": "gemm", "ts": 0.0, "dur": 3.0}, {"cat": "kernel", "name": "gemm", "ts": 10.0, "dur": 2.0},
              {"cat": "kernel", "name": "sum", "ts": 11.0, "dur": 4.0},
              {"cat": "cpu_op", "name": "aten::mm", "dur": 50.0}, {"cat": "gpu_memcpy", "name": "copy", "ts": 11.0, "dur": 1.0},
              {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "dur": 4.0},
              {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "dur": 4.0},
              {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "dur": 4.0},
              {"cat": "cuda_runtime", "name": "cudaFuncGetAttributes", "dur": 1.0}]
    with gzip.open(tmp_path / "rank0.pt.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events[:3]}, f)
    (tmp_path / "rank1.pt.trace.json").write_text(json.dumps({"traceEvents": events[3:]}))
    assert kernel_table(tmp_path) == {"total_us": 10.0, "busy_us": 8.0, "gpu_ops": 4,
                                      "host_calls": {"cudaGraphLaunch": 1, "cudaLaunchKernel": 2},
                                      "kernels": [["gemm", 5.0, 5.0, 2], ["sum", 4.0, 3.0, 1], ["copy", 1.0, 0.0, 1]],
                                      "host_ops": [["aten::mm", 1, 50.0]]}


def test_attention_backends_run_each_implementation_once_per_backend(monkeypatch, tmp_path):
    """``--attention-backends default,CUSTOM``: one engine per implementation and backend, named IMPL@BACKEND, each
    started with its backend; agreement is stated against the first engine."""
    monkeypatch.setattr(bench, "EngineProcess", FakeEngine)
    monkeypatch.setattr(FakeEngine, "jobs", [])
    args = bench.argparse.Namespace(max_num_batched_tokens=64, gpu_memory_utilization=0.4, profile=False,
                                    traces_out=None, reference=False, prompt_len=4, output_len=5, repeats=1)
    impls = [bench.engine_name("atom", b) for b in ("default", "FLASH_ATTN", "CUSTOM")]
    entry = {"model": "m"}
    bench.compare(entry, tmp_path / "ckpt", impls, [2], args, {}, [[5, 6]], lambda: None)
    assert FakeEngine.jobs == [("atom", None), ("atom@FLASH_ATTN", "FLASH_ATTN"), ("atom@CUSTOM", "CUSTOM")]
    assert list(entry["impls"]) == ["atom", "atom@FLASH_ATTN", "atom@CUSTOM"]
    assert sorted(entry["agreement_with_first"]) == ["atom@CUSTOM", "atom@FLASH_ATTN"]
    assert "agreement" not in entry


def test_speculative_runs_each_implementation_again_with_drafts(monkeypatch, tmp_path):
    """``--speculative 2``: beside each engine the same implementation drafting 2 tokens (``+mtp``) on the same
    checkpoint; only those engines get the speculative config, each reports its acceptance, and each is compared
    with the same engine without drafts."""
    monkeypatch.setattr(bench, "EngineProcess", FakeEngine)
    monkeypatch.setattr(FakeEngine, "jobs", [])
    args = bench.argparse.Namespace(max_num_batched_tokens=64, gpu_memory_utilization=0.2, profile=False,
                                    traces_out=None, reference=False, prompt_len=4, output_len=5, repeats=1,
                                    speculative=2)
    impls = ["vllm", "atom", "vllm+mtp", "atom+mtp"]
    entry = {"model": "m"}
    bench.compare(entry, tmp_path / "ckpt", impls, [2], args, {}, [[5, 6]], lambda: None)
    assert [impl for impl, _ in FakeEngine.jobs] == impls
    mtp = {"method": "mtp", "num_speculative_tokens": 2}
    assert {i: r.get("speculative", {}).get("config") for i, r in entry["impls"].items()} == {
        "vllm": None, "atom": None, "vllm+mtp": mtp, "atom+mtp": mtp}
    assert sorted(entry["agreement_with_plain"]) == ["atom+mtp", "vllm+mtp"]
    assert entry["agreement_with_plain"]["atom+mtp"]["identical_greedy"] == 1
    assert entry["agreement"]["identical_greedy"] == 1  # ATOM's plain engine against vLLM's, as without drafts


@pytest.mark.parametrize("argv, message", [
    (["--models", "qwen3-9b"], "unknown model, implementation or format: qwen3-9b"),
    (["--models", "deepseek-v3,qwen3-8b", "--speculative", "2"], "--speculative: no draft for qwen3-8b"),
    (["--models", "deepseek-v3", "--formats", "fp8-block", "--speculative", "2"], "bf16 checkpoints only"),
    (["--formats", "int3"], "unknown model, implementation or format: int3"),
    (["--checkpoint", "smol=/nonexistent"], "--checkpoint: no config.json in /nonexistent"),
    (["--attention-backends", "default,flash"], "--attention-backends: flash is not a vLLM backend name"),
    (["--attention-backends", "CUSTOM"], "--attention-backends CUSTOM needs ATOM's plugin"),
])
def test_bad_arguments_are_refused_before_any_work(argv, message, capsys):
    with pytest.raises(SystemExit):
        main([*argv, "--out", "unused.json"])
    assert message in capsys.readouterr().err


def test_every_model_has_a_real_shape_and_the_engine_arguments_its_kind_needs():
    """Hybrid models take the Triton GDN prefill (vLLM's FlashInfer one is not in the offline bundle) and
    multimodal ones run text-only (a random checkpoint has no tokenizer or image processor), both classes alike."""
    from atom_core import catalog
    from atom_tools.checkpoints import SHAPES

    assert set(bench.ENGINE_ARGS) <= set(driver.MODELS)
    for name, (arch, _) in driver.MODELS.items():
        assert arch in SHAPES, name
        caps, args = catalog.get(arch).capabilities, bench.ENGINE_ARGS.get(name, {})
        assert (args.get("additional_config", {}).get("gdn_prefill_backend") == "triton") == (catalog.HYBRID in caps)
        assert args.get("language_model_only", False) == (catalog.MULTIMODAL in caps), name


def test_random_prompts_of_a_multimodal_checkpoint_stay_below_its_placeholder_ids(tmp_path):
    # Qwen3.5-MoE's config.json: the vocabulary in text_config, placeholder ids inside it
    config = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "text_config": {"vocab_size": 248320},
              "image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
              "vision_end_token_id": 248054}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert driver.checkpoint_prompt_vocab(tmp_path) == 248053
    prompts = driver.agreement_prompts(tmp_path)
    assert len(prompts) == AGREEMENT_PROMPTS and max(max(p) for p in prompts) < 248053
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 151936}))  # a text model's
    assert driver.checkpoint_prompt_vocab(tmp_path) == 151936


def test_attention_backends_names_backend_classes_and_encoder_enum_members():
    """vLLM's decoder attention layers hold a backend class; its vision-encoder attention (Qwen3.5's own class) an
    ``AttentionBackendEnum`` member, which has no ``get_name`` (the H100 run of 2026-12-07 died on it)."""
    import enum

    from torch import nn

    class FlashAttentionBackend:
        @staticmethod
        def get_name():
            return "FLASH_ATTN"

    class Backends(enum.Enum):
        TORCH_SDPA = "sdpa"

    class Layer(nn.Module):
        def __init__(self, backend):
            super().__init__()
            self.attn_backend = backend

    model = nn.Sequential(Layer(FlashAttentionBackend), Layer(Backends.TORCH_SDPA), Layer(FlashAttentionBackend))
    assert bench.attention_backends(model) == ["FLASH_ATTN", "TORCH_SDPA"]
