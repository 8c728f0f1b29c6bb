"""The model-level benchmark's plumbing, at a tiny shape on the CPU (its numbers come from a GPU run)."""

from atom_core.bench import run


def test_model_bench_runs_every_implementation():
    shape = dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                 vocab_size=256, max_position_embeddings=128)
    rows = run("Qwen3ForCausalLM", 1, 2, 8, 3, device="cpu", reps=1, shape=shape)
    assert [r["impl"] for r in rows] == ["atom-native", "atom-native-graphs", "hf-eager"]
    # wall-clock on a loaded CPU is noise; the plumbing is what is checked here
    assert all(r["prefill_ms"] > 0 and {"decode_step_ms", "decode_tok_per_s"} <= r.keys() for r in rows)
