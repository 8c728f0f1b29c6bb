"""The model-level benchmark's plumbing, at a tiny shape on the CPU (its numbers come from a GPU run)."""

from atom_tools.native import run


def test_model_bench_runs_every_implementation():
    shape = dict(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                 vocab_size=256, max_position_embeddings=128)
    rows = run("Qwen3ForCausalLM", 1, 2, 8, 3, device="cpu", reps=1, shape=shape)
    assert [r["impl"] for r in rows] == ["atom-native", "atom-native-graphs", "hf-eager"]
    # wall-clock on a loaded CPU is noise; the plumbing is what is checked here
    assert all(r["prefill_ms"] > 0 and {"decode_step_ms", "decode_tok_per_s"} <= r.keys() for r in rows)


QWEN3_5_MOE = "Qwen3_5MoeForConditionalGeneration"


def test_qwen3_5_moe_real_shape_nests_the_text_model_and_keeps_prompts_off_placeholders():
    from atom_tools.checkpoints import checkpoint_config, prompt_vocab

    config = checkpoint_config(QWEN3_5_MOE, 4)  # the config only: no weights at the real shape
    text, vision = config.text_config, config.vision_config
    assert text.num_hidden_layers == 4
    assert text.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    assert (text.hidden_size, text.num_experts, text.num_experts_per_tok, text.linear_num_value_heads) == (2048, 256, 8, 32)
    assert vision.out_hidden_size == text.hidden_size and vision.depth == 2
    assert prompt_vocab(config.to_dict()) == config.vision_start_token_id < text.vocab_size


def test_qwen3_5_moe_checkpoint_at_a_scaled_down_shape_loads_in_atom_and_transformers(tmp_path):
    """The bench's Qwen3.5-MoE shape (nested text_config, real schedule) with small widths: written by
    write_checkpoint, ATOM's native runner and transformers load it and choose the same greedy tokens."""
    import json

    import torch
    from transformers import AutoModelForCausalLM

    from atom_core.runtime.runner import Runner
    from atom_core.runtime.sampler import SamplingParams
    from atom_core.tiny import merged
    from atom_tools.checkpoints import SHAPES, prompt_vocab, write_checkpoint

    small = merged(SHAPES[QWEN3_5_MOE], dict(
        text_config=dict(hidden_size=64, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=8,
                         num_experts_per_tok=2, num_attention_heads=2, linear_num_key_heads=2, linear_num_value_heads=4,
                         linear_key_head_dim=32, linear_value_head_dim=32, vocab_size=512),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64),
        image_token_id=500, video_token_id=501, vision_start_token_id=502, vision_end_token_id=503))
    ckpt = write_checkpoint(QWEN3_5_MOE, 4, tmp_path / "ckpt", torch.float32, "cpu", shape=small)
    config = json.loads((ckpt / "config.json").read_text())
    assert config["text_config"]["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    assert prompt_vocab(config) == 500

    prompt = [5, 9, 13, 2, 400, 499, 7]
    atom = Runner(ckpt, device="cpu", dtype=torch.float32).generate([prompt], SamplingParams(max_new_tokens=3,
                                                                                              ignore_eos=True))
    hf = AutoModelForCausalLM.from_pretrained(str(ckpt), dtype=torch.float32).eval()
    with torch.inference_mode():
        ids = hf.generate(torch.tensor([prompt]), max_new_tokens=3, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert atom[0].token_ids == ids[0, len(prompt):].tolist()


def test_a_model_with_its_own_shape_gets_it_not_its_architectures():
    """smollm2-135m is a Llama of the demo model's shape (tied embeddings, head 64), not Llama-3-8B's."""
    from atom_tools.checkpoints import SHAPES, checkpoint_config
    from atom_tools.e2e.driver import MODEL_SHAPES, MODELS

    assert set(MODEL_SHAPES) <= set(MODELS)
    arch, layers = MODELS["smollm2-135m"]
    config = checkpoint_config(arch, layers, MODEL_SHAPES["smollm2-135m"])
    assert (config.hidden_size, config.num_hidden_layers, config.num_key_value_heads, config.head_dim) == (576, 30, 3, 64)
    assert config.tie_word_embeddings and config.rope_parameters["rope_theta"] == 100000.0
    assert checkpoint_config(arch, 2).hidden_size == SHAPES[arch]["hidden_size"] == 4096


def test_qwen3_next_checkpoint_config_names_its_full_attention_interval(tmp_path):
    """SGLang's own Qwen3NextConfig places the full-attention layers by the published `full_attention_interval`,
    which transformers' class no longer writes: the bench's config.json carries it, agreeing with `layer_types`."""
    import json

    from atom_tools.checkpoints import checkpoint_config

    config = checkpoint_config("Qwen3NextForCausalLM", 8)
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    interval = saved["full_attention_interval"]
    assert interval == 4
    assert saved["layer_types"] == ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(8)]
