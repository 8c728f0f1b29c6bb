"""The SGLang end-to-end bench (atom_tools.e2e.sglang): request building, stream parsing, the timing and agreement
summaries, the served-by check and the bookkeeping of a comparison without a server; then the whole bench on the
CPU through two real ``sglang.launch_server`` processes (SGLang's own Qwen3 class and ATOM's) on a tiny checkpoint.

On the CPU SGLang's own ``RotaryEmbedding`` imports ``vllm._custom_ops.rotary_embedding`` when it is built on a
platform that is neither CUDA nor SGLang's CPU engine (whose memory pool needs sgl_kernel's CPU build), and then
runs its torch ``forward_native``: the end-to-end test puts a stand-in module on the servers' path whose function
raises if it is ever called."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from atom_tools.e2e import sglang as bench

# The end-to-end test starts SGLang servers: skipped without SGLang, unless a session that installed it says it must
# be there (the nox sessions sglang-<version> set ATOM_SGLANG_REQUIRED=1: a missing SGLang then fails the test).
needs_sglang = pytest.mark.skipif(importlib.util.find_spec("sglang") is None
                                  and os.environ.get("ATOM_SGLANG_REQUIRED") != "1", reason="SGLang is not installed")


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory) -> str:
    """A tiny random Qwen3ForCausalLM checkpoint with its tokenizer files (``atom make-tiny``)."""
    from atom_core.tiny import make_tiny

    return str(make_tiny("Qwen3ForCausalLM", tmp_path_factory.mktemp("tiny") / "Qwen3ForCausalLM", seed=1))


def sse(*events) -> list[bytes]:
    """The lines of a streamed /generate response as SGLang writes them."""
    lines = []
    for event in events:
        lines += [b"data: " + (event if isinstance(event, bytes) else json.dumps(event).encode()) + b"\n", b"\n"]
    return lines


def chunk(ids, count):
    return {"output_ids": ids, "meta_info": {"completion_tokens": count, "id": "r"}}


def test_generate_payload_is_greedy_token_ids_with_logprobs_from_the_first_prompt_token():
    payload = bench.generate_payload([[5, 6], [7]], 4, logprobs=True)
    assert payload == {"input_ids": [[5, 6], [7]], "stream": False, "return_logprob": True, "logprob_start_len": 0,
                       "sampling_params": {"temperature": 0.0, "max_new_tokens": 4, "ignore_eos": True}}
    streamed = bench.generate_payload([5], 2, stream=True)
    assert streamed["stream"] and "return_logprob" not in streamed


def test_stream_arrivals_count_tokens_per_chunk_and_stop_at_done():
    clock = iter([1.0, 2.0, 3.5, 99.0]).__next__
    # cumulative chunks; the third repeats the count (no new token), the fourth brings two tokens at once
    lines = sse(chunk([4], 1), chunk([4, 9], 2), chunk([4, 9], 2), chunk([4, 9, 1, 3], 4), b"[DONE]", chunk([0], 9))
    assert bench.stream_arrivals(lines, clock) == [(1.0, 1), (2.0, 2), (3.5, 4)]


def test_stream_error_event_raises():
    with pytest.raises(RuntimeError, match="context length"):
        bench.stream_arrivals(sse({"error": {"message": "context length"}}), lambda: 0.0)


def test_request_timing_ttft_from_sending_tpot_over_tokens_after_the_first_chunk():
    timing = bench.request_timing(10.0, [(10.5, 1), (10.7, 2), (11.1, 5)])
    assert timing["ttft_s"] == pytest.approx(0.5) and timing["tpot_s"] == pytest.approx(0.6 / 4)
    assert timing["tokens"] == 5 and timing["end"] == 11.1
    assert bench.request_timing(0.0, [(0.2, 3)])["tpot_s"] is None  # one chunk: no time per output token
    with pytest.raises(RuntimeError, match="without a token"):
        bench.request_timing(0.0, [])


def test_run_metrics_and_summary_of_repeats():
    timings = [{"ttft_s": t, "tpot_s": p, "tokens": 4, "end": e} for t, p, e in
               ((0.1, 0.01, 1.0), (0.3, 0.03, 2.0), (0.2, 0.02, 1.5))]
    run = bench.run_metrics(timings, 0.0, 3, 4)
    assert run == {"tok_per_s": pytest.approx(6.0), "ttft_ms": pytest.approx(200.0), "tpot_ms": pytest.approx(20.0)}
    with pytest.raises(RuntimeError, match=r"token counts \[3\]"):
        bench.run_metrics([*timings[:2], {**timings[2], "tokens": 3}], 0.0, 3, 4)
    with pytest.raises(RuntimeError, match="got 2 answers"):
        bench.run_metrics(timings[:2], 0.0, 3, 4)
    row = bench.summarize([run, {"tok_per_s": 2.0, "ttft_ms": 100.0, "tpot_ms": 10.0},
                           {"tok_per_s": 4.0, "ttft_ms": 400.0, "tpot_ms": 40.0}])
    assert row["output_tok_per_s"] == {"median": 4.0, "min": 2.0, "max": 6.0, "samples": [6.0, 2.0, 4.0]}
    assert row["ttft_ms"]["median"] == 200.0 and row["tpot_ms"]["max"] == 40.0


def test_agreement_record_from_sglang_logprobs():
    answer = {"output_ids": [7, 8], "meta_info": {
        "input_token_logprobs": [[None, 5, None], [-1.5, 6, None], [-2.5, 9, None]],
        "output_token_logprobs": [[-0.5, 7, None], [-0.25, 8, None]]}}
    assert bench.agreement_record([5, 6, 9], answer) == {"tokens": [7, 8], "logprobs": [-0.5, -0.25],
                                                         "prompt_logprobs": [-1.5, -2.5]}
    with pytest.raises(RuntimeError, match="2 prompt log-probabilities for a prompt of 4 tokens"):
        bench.agreement_record([5, 6, 9, 1], answer)


ATOM_LINE = ("[2026-12-05 03:49:02] atom-sglang: SGLang builds Qwen3ForCausalLM on ATOM's "
             "atom_core.models.llama:Qwen3ForCausalLM")


def test_served_by_reads_the_wrappers_log_line():
    log = f"[x] Load weight begin\n{ATOM_LINE}\n[x] Load weight end. type=Qwen3ForCausalLM\n"
    assert bench.served_by(log, "atom") == "atom_core.models.llama:Qwen3ForCausalLM"
    assert bench.served_by("[x] Load weight end. type=Qwen3ForCausalLM\n", "sglang") == "SGLang's own class"
    with pytest.raises(RuntimeError, match="did not build ATOM's class"):
        bench.served_by("[x] Load weight end. type=Qwen3ForCausalLM\n", "atom")
    with pytest.raises(RuntimeError, match="leaked"):
        bench.served_by(log, "sglang")


def test_the_wrapper_logs_the_line_the_bench_looks_for():
    """atom_sglang.wrapper's log format, as the bench's SERVED_BY constant reads it."""
    import inspect

    from atom_sglang import wrapper

    assert '"' + bench.SERVED_BY + '%s on ATOM\'s %s"' in inspect.getsource(wrapper.SGLangCausalLM.__init__)


def test_server_args_hybrid_models_and_extras_last(tmp_path):
    args = bench.server_args(tmp_path, "Qwen3NextForCausalLM", "bfloat16", 0.4, "--attention-backend torch_native")
    assert args[:2] == ["--model-path", str(tmp_path)] and "--skip-tokenizer-init" in args
    assert args[args.index("--mem-fraction-static") + 1] == "0.4000"
    assert args[-5:] == ["--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule",
                         "--attention-backend", "torch_native"]
    dense = bench.server_args(tmp_path, "Qwen3ForCausalLM", "bfloat16", 0.4, "")
    assert "--mamba-radix-cache-strategy" not in dense and dense[-4:] == ["--attention-backend", "triton",
                                                                         "--sampling-backend", "pytorch"]


def test_mem_fractions_give_each_server_an_equal_share_of_the_first_free_memory():
    free, taken = 100.0, []
    for fraction in bench.mem_fractions(0.3, 3):  # each server takes its fraction of what is free when it starts
        taken.append(free * fraction)
        free -= taken[-1]
    assert taken == pytest.approx([30.0, 30.0, 30.0])


class FakeServer:
    """Stands in for a server: fixed agreement outputs, a run at ``batch`` takes ``batch`` tokens/s, the run at
    ``fail_batch`` raises as a server gone would; records the order of the runs."""

    fail_batch = None
    log: list = []

    def __init__(self, impl, args, log_path, start_timeout):
        self.impl, self.module, self.startup_s, self.log_path = impl, f"{impl} class", 1.0, log_path
        backend = len(args) - 1 - args[::-1].index("--attention-backend")  # the last one given is the one used
        FakeServer.log.append(("start", impl, args[args.index("--mem-fraction-static") + 1], args[backend + 1]))

    def agreement(self, prompts):
        token = 9 if self.impl.startswith("atom") else 8
        return [{"tokens": [1, token], "logprobs": [-1.0, -1.0], "prompt_logprobs": [-2.0] * (len(p) - 1)}
                for p in prompts]

    def timed_run(self, prompts, max_new_tokens):
        FakeServer.log.append(("run", self.impl, len(prompts), prompts[0][0]))
        if len(prompts) == self.fail_batch:
            raise RuntimeError("server gone")
        return {"tok_per_s": float(len(prompts)), "ttft_ms": 1.0, "tpot_ms": 2.0}

    def profiled_run(self, prompts, max_new_tokens, trace_dir):
        """A trace of two kernels, 3 and 5 µs, the second starting inside the first."""
        FakeServer.log.append(("profiled", self.impl, len(prompts), max_new_tokens))
        trace_dir.mkdir(parents=True, exist_ok=True)
        events = [{"cat": "kernel", "name": "k1", "ts": 0.0, "dur": 3.0}, {"cat": "kernel", "name": "k2", "ts": 2.0, "dur": 5.0}]
        (trace_dir / "x-TP-0.trace.json").write_text(json.dumps({"traceEvents": events}))
        return 0.5

    def close(self):
        FakeServer.log.append(("close", self.impl))


def test_compare_alternates_saves_each_step_and_keeps_what_a_cut_off_run_measured(monkeypatch, tmp_path):
    monkeypatch.setattr(FakeServer, "log", [])
    monkeypatch.setattr(FakeServer, "fail_batch", 8)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 512}))
    args = bench.parse_args(["--out", str(tmp_path / "o.json"), "--repeats", "2", "--prompt-len", "3"])
    saved = []
    entry = {"model": "m", "arch": "Qwen3ForCausalLM", "format": "bf16"}
    with pytest.raises(RuntimeError, match="server gone"):
        bench.compare(entry, tmp_path, ["sglang", "atom"], [2, 8], args, [[5, 6, 7]],
                      lambda: saved.append(json.loads(json.dumps(entry))), start_server=FakeServer)
    # one server up, both up, agreement, batch 2 timed; batch 8 never finished
    assert [sorted(s["impls"]) for s in saved] == [["sglang"], ["atom", "sglang"], ["atom", "sglang"], ["atom", "sglang"]]
    assert saved[2]["agreement"]["identical_greedy"] == 0 and saved[2]["agreement"]["mean_first_divergence"] == 1
    assert list(entry["impls"]["atom"]["batches"]) == ["2"]
    assert entry["impls"]["sglang"]["batches"]["2"]["output_tok_per_s"]["samples"] == [2.0, 2.0]
    assert [e[2:] for e in FakeServer.log if e[0] == "start"] == [("0.4000", "triton"), ("0.6667", "triton")]  # 0.4 each
    runs = [(impl, first) for kind, impl, batch, first in (e for e in FakeServer.log if e[0] == "run") if batch == 2]
    # warm-up each, then repeat 0 sglang-atom, repeat 1 atom-sglang, on the same prompts per repeat
    assert [impl for impl, _ in runs] == ["sglang", "atom", "sglang", "atom", "atom", "sglang"]
    assert runs[2][1] == runs[3][1] and runs[4][1] == runs[5][1]
    assert FakeServer.log[-2:] == [("close", "sglang"), ("close", "atom")]


def test_profile_runs_each_server_once_after_the_timed_runs(monkeypatch, tmp_path):
    monkeypatch.setattr(FakeServer, "log", [])
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 512}))
    args = bench.parse_args(["--out", str(tmp_path / "o.json"), "--repeats", "1", "--profile",
                             "--profile-prompt-len", "4", "--profile-output-len", "6", "--traces-out", str(tmp_path / "t")])
    entry = {"model": "m", "arch": "Qwen3ForCausalLM", "format": "bf16"}
    bench.compare(entry, tmp_path, ["sglang", "atom"], [2, 8], args, [[5, 6, 7]], lambda: None, start_server=FakeServer)
    assert [e for e in FakeServer.log if e[0] == "profiled"] == [("profiled", "sglang", 2, 6), ("profiled", "atom", 2, 6)]
    assert FakeServer.log.index(("profiled", "sglang", 2, 6)) > max(i for i, e in enumerate(FakeServer.log) if e[0] == "run")
    for impl in ("sglang", "atom"):
        kernels = entry["impls"][impl]["kernels"]
        assert (kernels["batch"], kernels["prompt_len"], kernels["output_len"], kernels["wall_us"]) == (2, 4, 6, 500000.0)
        assert kernels["busy_us"] == 7.0 and kernels["kernels"][0][:2] == ["k2", 5.0]  # own time: 4 of its 5 µs
        assert (tmp_path / "t" / f"profile-m-bf16-{impl}").is_dir()  # kept where --traces-out says


def test_attention_backends_make_one_server_per_implementation_and_backend(monkeypatch, tmp_path):
    monkeypatch.setattr(FakeServer, "log", [])
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 512}))
    args = bench.parse_args(["--out", str(tmp_path / "o.json"), "--repeats", "1", "--attention-backends", "default,atom"])
    assert args.impl_list == ["sglang", "sglang@atom", "atom", "atom@atom"]
    entry = {"model": "m", "arch": "Qwen3ForCausalLM", "format": "bf16"}
    bench.compare(entry, tmp_path, args.impl_list, [2], args, [[5, 6, 7]], lambda: None, start_server=FakeServer)
    assert [(e[1], e[3]) for e in FakeServer.log if e[0] == "start"] == [
        ("sglang", "triton"), ("sglang@atom", "atom"), ("atom", "triton"), ("atom@atom", "atom")]
    assert entry["agreement"]["identical_greedy"] == 0  # SGLang's class against ATOM's, both on the default backend
    with_first = entry["agreement_with_first"]
    assert sorted(with_first) == ["atom@atom", "sglang@atom"]
    assert with_first["sglang@atom"]["identical_greedy"] == 1 and with_first["atom@atom"]["identical_greedy"] == 0
    assert sorted(entry["impls"]) == sorted(args.impl_list)


@pytest.mark.parametrize("argv, message", [
    (["--attention-backends", "default,FLASH_ATTN"], "--attention-backends: FLASH_ATTN is not an SGLang backend name"),
    (["--models", "qwen3-9b"], "unknown model, implementation or format: qwen3-9b"),
    (["--impls", "sglang,vllm"], "unknown model, implementation or format: vllm"),
    (["--checkpoint", "smol=/nonexistent"], "--checkpoint: no config.json in /nonexistent"),
])
def test_bad_arguments_are_refused_before_any_work(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench.main([*argv, "--out", "unused.json"])
    assert message in capsys.readouterr().err


STUB = 'def rotary_embedding(*args, **kwargs):\n    raise NotImplementedError("the CPU test stand-in was called")\n'


@needs_sglang
@pytest.mark.bench_servers
def test_bench_end_to_end_on_the_cpu(tiny_qwen3, tmp_path, monkeypatch, capsys):
    """Both servers up, the atom one built ATOM's class (the sglang one not, though the test process has
    SGLANG_EXTERNAL_MODEL_PACKAGE set), the same greedy tokens in float32, every batch size timed."""
    stub = tmp_path / "stub" / "vllm"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("")
    (stub / "_custom_ops.py").write_text(STUB)
    monkeypatch.setenv("PYTHONPATH", f"{stub.parent}:{os.environ.get('PYTHONPATH', '')}")
    # as a user launching SGLang with ATOM's classes has it: the bench keeps it out of the sglang server's environment
    monkeypatch.setenv("SGLANG_EXTERNAL_MODEL_PACKAGE", "atom_sglang.models")
    out = tmp_path / "out.json"
    cpu = "--device cpu --attention-backend torch_native --disable-cuda-graph --max-total-tokens 1024"
    assert bench.main(["--models", "", "--checkpoint", f"tiny={tiny_qwen3}", "--batches", "1,2",
                       "--prompt-len", "8", "--output-len", "4", "--repeats", "1", "--dtype", "float32",
                       "--server-args", cpu, "--start-timeout", "300", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    (entry,) = report["models"]
    assert entry["impls"]["atom"]["module"] == "atom_core.models.llama:Qwen3ForCausalLM"
    assert entry["impls"]["sglang"]["module"] == "SGLang's own class"
    agreement = entry["agreement"]
    assert agreement["identical_greedy"] == agreement["prompts"] == 8
    assert agreement["prompt_logprob_max_abs_diff"] < 1e-4 and agreement["output_logprob_mean_abs_diff"] < 1e-4
    for impl in ("sglang", "atom"):
        assert sorted(entry["impls"][impl]["batches"]) == ["1", "2"]
        assert entry["impls"][impl]["batches"]["2"]["output_tok_per_s"]["median"] > 0
    assert "ATOM / SGLang tok/s per batch" in capsys.readouterr().out


@needs_sglang
def test_sglang_own_qwen3_next_config_reads_the_bench_checkpoint(tmp_path):
    """SGLang's own Qwen3NextConfig places its full-attention layers by `full_attention_interval` (its server died
    on the bench's checkpoint without it): read through SGLang's class, the layer kinds are the checkpoint's."""
    from sglang.srt.configs.qwen3_next import Qwen3NextConfig

    from atom_tools.checkpoints import checkpoint_config

    checkpoint_config("Qwen3NextForCausalLM", 8).save_pretrained(tmp_path)
    config = Qwen3NextConfig.from_pretrained(tmp_path)
    kinds = json.loads((tmp_path / "config.json").read_text())["layer_types"]
    assert kinds.count("full_attention") == 2
    assert config.layers_block_type == ["attention" if kind == "full_attention" else kind for kind in kinds]
