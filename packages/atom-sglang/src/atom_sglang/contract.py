"""Every SGLang symbol atom-sglang calls, with the parameters (or fields) it relies on and the releases that have it
as described: test_contract checks each on the installed SGLang, test_unit that every symbol exists in some release
of the supported range.  Data only; :mod:`atom_sglang.compat` holds the accessors that use them."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from atom_sglang.compat import installed_version


@dataclass(frozen=True)
class Symbol:
    """One SGLang symbol the adapter uses and the parameters (or fields) it relies on, in call order: every
    parameter without a default is among them (the adapter passes them all)."""

    path: str  # "module:qualified.name"
    params: tuple[str, ...] = ()
    fields: tuple[str, ...] = ()  # attributes read from instances (dataclass fields or annotations)
    used_by: str = ""
    releases: str = ""  # the supported releases that have it as described (a PEP 440 specifier); "": all of them

    def present_in(self, version: Version | str | None = None) -> bool:
        """Whether SGLang ``version`` (default: the installed one) has this symbol as described."""
        version = installed_version() if version is None else Version(str(version))
        return version is not None and SpecifierSet(self.releases).contains(version, prereleases=True)

    def resolve(self) -> Any:
        module, _, qualname = self.path.partition(":")
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj

    def owner(self) -> type:
        """The class whose instances carry :attr:`fields` (the symbol itself, or the class of a method)."""
        obj = self.resolve()
        if isinstance(obj, type):
            return obj
        module, _, qualname = self.path.partition(":")
        return Symbol(f"{module}:{qualname.rsplit('.', 1)[0]}").resolve()


CONTRACT: tuple[Symbol, ...] = (
    Symbol("sglang.srt.layers.radix_attention:RadixAttention.__init__",
           ("self", "num_heads", "head_dim", "scaling", "num_kv_heads", "layer_id", "sliding_window_size",
            "quant_config", "prefix"), used_by="host.SGLangHost.attention"),
    Symbol("sglang.srt.layers.radix_attention:RadixAttention.forward",
           ("self", "q", "k", "v", "forward_batch"), used_by="host.SGLangAttention.forward"),
    Symbol("sglang.srt.layers.logits_processor:LogitsProcessor.__init__", ("self", "config"),
           used_by="wrapper.SGLangCausalLM.__init__"),
    Symbol("sglang.srt.layers.logits_processor:LogitsProcessor.forward",
           ("self", "input_ids", "hidden_states", "lm_head", "logits_metadata"), used_by="wrapper.SGLangCausalLM.forward"),
    Symbol("sglang.srt.layers.logits_processor:LogitsProcessorOutput", fields=("next_token_logits",),
           used_by="wrapper.SGLangCausalLM.forward (return type)"),
    Symbol("sglang.srt.model_executor.forward_batch_info:ForwardBatch",
           fields=("forward_mode", "positions", "mrope_positions", "input_embeds"), used_by="wrapper, host"),
    Symbol("sglang.srt.runtime_context:get_parallel", (), used_by="compat.parallel"),
    Symbol("sglang.srt.distributed.parallel_state:GroupCoordinator.all_reduce", ("self", "input_"),
           fields=("rank_in_group", "world_size"), used_by="host.SGLangTP"),
    Symbol("sglang.srt.distributed.parallel_state:GroupCoordinator.all_gather", ("self", "input_", "dim"),
           used_by="host.SGLangTP"),
    Symbol("sglang.srt.models.registry:import_model_classes", ("package_name", "strict"),
           used_by="SGLANG_EXTERNAL_MODEL_PACKAGE=atom_sglang.models"),
    Symbol("sglang.srt.configs.linear_attn_model_registry:register_linear_attn_model", ("spec",),
           used_by="compat.register_linear_attn_model (hybrid configs SGLang does not know by class)"),
    Symbol("sglang.srt.configs.linear_attn_model_registry:LinearAttnModelSpec",
           fields=("config_class", "backend_class_name", "arch_names"), used_by="compat.register_linear_attn_model"),
    # hybrid linear attention (linear_attention.py)
    Symbol("sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph:is_in_breakable_cuda_graph",
           used_by="compat.in_breakable_cuda_graph (linear_attention.SGLangLinearAttentionState.run)"),
    Symbol("sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph:eager_on_graph", ("enable",),
           used_by="compat.eager_break (linear_attention: the GDN state step between captured segments)"),
    Symbol("sglang.srt.model_executor.forward_context:get_attn_backend", (), used_by="compat.attention_backend"),
    Symbol("sglang.srt.layers.attention.hybrid_linear_attn_backend:HybridLinearAttnBackend.__init__",
           ("self", "full_attn_backend", "linear_attn_backend", "full_attn_layers"),
           used_by="compat.linear_attention_backend (its linear_attn_backend attribute; exercised by test_hybrid)"),
    Symbol("sglang.srt.layers.attention.hybrid_linear_attn_backend:MambaAttnBackendBase.init_forward_metadata",
           ("self", "forward_batch"),
           used_by="linear_attention.SGLangLinearAttentionState.step (forward_metadata, req_to_token_pool)"),
    Symbol("sglang.srt.layers.attention.mamba.mamba2_metadata:ForwardMetadata",
           fields=("query_start_loc", "mamba_cache_indices"), used_by="linear_attention.SGLangLinearAttentionState.step"),
    Symbol("sglang.srt.mem_cache.memory_pool:HybridReqToTokenPool.mamba2_layer_cache", ("self", "layer_id"),
           used_by="linear_attention.SGLangLinearAttentionState.step"),
    Symbol("sglang.srt.mem_cache.memory_pool:MambaPool.State", fields=("conv", "temporal"),
           used_by="linear_attention.SGLangLinearAttentionState.step"),
    Symbol("sglang.srt.configs.qwen3_next:Qwen3NextConfig", fields=("mamba2_cache_params",),
           used_by="linear_attention.check_state_plan"),
    Symbol("sglang.srt.configs.mamba_utils:Mamba2StateShape", fields=("conv", "temporal"),
           used_by="linear_attention.check_state_plan"),
    Symbol("sglang.srt.model_executor.forward_batch_info:ForwardBatch",
           fields=("extend_num_tokens", "extend_prefix_lens", "mm_inputs"), used_by="linear_attention, multimodal"),
    # multimodal (multimodal.py)
    Symbol("sglang.srt.managers.mm_utils:general_mm_embed_routine",
           ("input_ids", "forward_batch", "language_model", "multimodal_model", "data_embedding_funcs",
            "placeholder_tokens", "use_deepstack"), used_by="multimodal.SGLangMultimodal._run_model"),
    Symbol("sglang.srt.managers.mm_utils:MultiModalityDataPaddingPatternMultimodalTokens.pad_input_tokens",
           ("self", "input_ids", "mm_inputs"), used_by="compat.PAD_MULTIMODAL_TOKENS", releases="<0.5.23"),
    Symbol("sglang.srt.managers.mm_utils:pad_mm_tokens", ("input_ids", "mm_inputs"),
           used_by="compat.PAD_MULTIMODAL_TOKENS", releases=">=0.5.23"),
    Symbol("sglang.srt.managers.schedule_batch:MultimodalDataItem", fields=("feature", "offsets", "model_specific_data"),
           used_by="multimodal.SGLangMultimodal.get_image_feature (image_grid_thw from model_specific_data)"),
    Symbol("sglang.srt.managers.schedule_batch:MultimodalDataItem.reconstruct", ("self", "target_device"),
           used_by="multimodal.SGLangMultimodal.get_image_feature (CUDA-IPC features, GPU only)"),
    Symbol("sglang.srt.multimodal.mm_utils:materialize_multimodal_features", ("features", "device", "dtype"),
           used_by="compat.materialize_multimodal_features"),
    Symbol("sglang.srt.managers.schedule_batch:Modality.IMAGE", used_by="compat.deepstack_modalities"),
    # SGLang's processor choice by architecture name (test_multimodal): by the classes its processors list
    Symbol("sglang.srt.managers.multimodal_processor:PROCESSOR_MAPPING", releases="<0.5.18",
           used_by="SGLang's processor choice by architecture name (get_mm_processor's loop; tested)"),
    Symbol("sglang.srt.managers.multimodal_processor:get_mm_processor_cls", ("hf_config", "server_args"),
           releases=">=0.5.18,<0.5.20", used_by="SGLang's processor choice by architecture name (tested)"),
    Symbol("sglang.srt.managers.multimodal_processor:get_mm_processor_cls", ("hf_config",), releases=">=0.5.20",
           used_by="SGLang's processor choice by architecture name (tested)"),
    Symbol("sglang.srt.runtime_context:get_server_args", (), used_by="compat.MAMBA_EXTRA_BUFFER (< 0.5.20)"),
    Symbol("sglang.srt.runtime_context:get_lora", (), used_by="compat.lora_enabled"),
    # SGLang's LoRA manager wrapping ATOM's linear layers (lora.py), on the releases in compat.LORA_INTERNALS_CHECKED
    Symbol("sglang.srt.lora.lora_manager:get_lora_layer", ("layer", "lora_backend"), releases="==0.5.23",
           used_by="compat.install_lora_layers (LoRAManager.set_lora_module calls it by this module's name)"),
    Symbol("sglang.srt.lora.layers:BaseLayerWithLoRA.__init__", ("self", "base_layer", "lora_backend"),
           releases="==0.5.23", used_by="lora.AtomLinearWithLoRA"),
    Symbol("sglang.srt.lora.layers:BaseLayerWithLoRA.set_lora_info", ("self",), releases="==0.5.23",
           used_by="lora.AtomLinearWithLoRA.set_lora_info (LoRAManager.update_lora_info passes A, B buffers)"),
    Symbol("sglang.srt.lora.layers:BaseLayerWithLoRA.slice_lora_a_weights", ("self", "A"), releases="==0.5.23",
           used_by="lora.AtomLinearWithLoRA"),
    Symbol("sglang.srt.lora.layers:BaseLayerWithLoRA.slice_lora_b_weights", ("self", "B"), releases="==0.5.23",
           used_by="lora.AtomLinearWithLoRA"),
    Symbol("sglang.srt.lora.lora_manager:LoRAManager._notify_lora_slots_updated", ("self", "slot_ids"),
           releases="==0.5.23", used_by="lora.AtomLinearWithLoRA.on_lora_slots_updated (called when present)"),
    Symbol("sglang.srt.lora.utils:get_hidden_dim", ("module_name", "config", "base_model", "layer_idx"),
           releases="==0.5.23", used_by="wrapper.SGLangCausalLM.get_hidden_dim (called as (module_name, layer_idx))"),
    Symbol("sglang.srt.lora.backend.base_backend:BaseLoRABackend.__init__", ("self", "max_loras_per_batch", "device"),
           releases="==0.5.23", used_by="lora.AtomLinearWithLoRA (reads max_loras_per_batch)"),
    Symbol("sglang.srt.lora.backend.base_backend:BaseLoRABackend.get_batch_info", ("self",), releases="==0.5.23",
           used_by="lora.BatchTokens"),
    Symbol("sglang.srt.lora.utils:LoRABatchInfo",
           fields=("num_segments", "seg_lens", "weight_indices", "lora_ranks", "scalings", "permutation"),
           releases="==0.5.23", used_by="lora.BatchTokens, lora.AtomLinearWithLoRA._sync"),
    Symbol("sglang.srt.server_args:ServerArgs.enable_mamba_extra_buffer", ("self",), releases="<0.5.20",
           used_by="compat.MAMBA_EXTRA_BUFFER"),
    Symbol("sglang.srt.runtime_context:get_exec", (),
           used_by="compat.MAMBA_EXTRA_BUFFER (exec.mamba.enable_mamba_extra_buffer, >= 0.5.20)"),
    Symbol("sglang.srt.runtime_context:get_spec", (), used_by="compat.unsupported_linear_attention_settings"),
    # latent attention (latent.py): the absorbed form on one RadixAttention over SGLang's MLA pool
    Symbol("sglang.srt.layers.radix_attention:RadixAttention.__init__",
           ("self", "num_heads", "head_dim", "scaling", "num_kv_heads", "layer_id", "v_head_dim", "quant_config",
            "prefix"), used_by="latent.SGLangLatentAttention"),
    Symbol("sglang.srt.mem_cache.memory_pool:MLATokenToKVPool.__init__",
           ("self", "size", "page_size", "dtype", "kv_lora_rank", "qk_rope_head_dim", "layer_num", "device",
            "enable_memory_saver"), used_by="SGLang's latent KV pool for DeepseekV3ForCausalLM (test_forward builds it)"),
    Symbol("sglang.srt.configs.model_config:AttentionArch.MLA",
           used_by="SGLang's ModelConfig choosing the latent pool from the architecture (test_registry)"),
    # DeepSeek sparse attention (sparse.py): SGLang's DSA pool, read and written by ATOM's layers
    Symbol("sglang.srt.configs.model_config:is_deepseek_dsa", ("config",),
           used_by="SGLang's ModelConfig choosing its DSA pool for DeepseekV32/GlmMoeDsa configs (test_sparse)"),
    Symbol("sglang.srt.mem_cache.memory_pool:DSATokenToKVPool.__init__",
           ("self", "size", "page_size", "kv_lora_rank", "dtype", "qk_rope_head_dim", "layer_num", "device",
            "index_head_dim", "enable_memory_saver", "kv_cache_dim"),
           used_by="SGLang's DSA KV pool (the test harness builds it as the ModelRunner does)"),
    Symbol("sglang.srt.mem_cache.memory_pool:DSATokenToKVPool.get_index_k_with_scale_buffer", ("self", "layer_id"),
           used_by="sparse.SGLangSparseLatentAttention (one layer's FP8 indexer-key pages)"),
    Symbol("sglang.srt.mem_cache.memory_pool:MLATokenToKVPool.set_kv_buffer",
           ("self", "layer", "loc_info", "cache_k", "cache_v"), used_by="sparse.SGLangSparseLatentAttention"),
    Symbol("sglang.srt.mem_cache.memory_pool:MLATokenToKVPool.get_key_buffer", ("self", "layer_id"),
           used_by="sparse.SGLangSparseLatentAttention (the latent rows sparse_mla reads)"),
    Symbol("sglang.srt.model_executor.forward_context:get_token_to_kv_pool", (), used_by="compat.kv_pools"),
    Symbol("sglang.srt.model_executor.forward_context:get_req_to_token_pool", (), used_by="compat.kv_pools"),
    # ATOM's paged attention as an SGLang attention backend (attention_backend.py, --attention-backend atom)
    Symbol("sglang.srt.layers.attention.attention_registry:register_attention_backend", ("name",),
           used_by="compat.register_attention_backend"),
    Symbol("sglang.srt.server_args:add_attention_backend_choices", used_by="compat.register_attention_backend"),
    Symbol("sglang.srt.server_args:ATTENTION_BACKEND_CHOICES", used_by="compat.register_attention_backend"),
    Symbol("sglang.srt.layers.attention.base_attn_backend:AttentionBackend.forward_extend",
           ("self", "q", "k", "v", "layer", "forward_batch", "save_kv_cache"), used_by="attention_backend.AtomAttnBackend"),
    Symbol("sglang.srt.layers.attention.base_attn_backend:AttentionBackend.forward_decode",
           ("self", "q", "k", "v", "layer", "forward_batch", "save_kv_cache"), used_by="attention_backend.AtomAttnBackend"),
    Symbol("sglang.srt.layers.attention.base_attn_backend:AttentionBackend.init_forward_metadata", ("self", "forward_batch"),
           used_by="attention_backend.AtomAttnBackend (eager steps)"),
    Symbol("sglang.srt.layers.attention.base_attn_backend:AttentionBackend.init_forward_metadata_out_graph",
           ("self", "forward_batch", "in_capture"), used_by="attention_backend.AtomAttnBackend (CUDA-graph capture, replay)"),
    Symbol("sglang.srt.layers.attention.base_attn_backend:AttentionBackend.init_forward_metadata_in_graph",
           ("self", "forward_batch"), used_by="attention_backend.AtomAttnBackend"),
    Symbol("sglang.srt.layers.attention.base_attn_backend:AttentionBackend.init_cuda_graph_state",
           ("self", "max_bs", "max_num_tokens"), used_by="attention_backend.AtomAttnBackend"),
    Symbol("sglang.srt.layers.attention.base_attn_backend:AttentionBackend.get_cuda_graph_seq_len_fill_value", ("self",),
           used_by="attention_backend.AtomAttnBackend"),
    Symbol("sglang.srt.model_executor.forward_batch_info:ForwardBatch",
           fields=("batch_size", "req_pool_indices", "seq_lens", "seq_lens_cpu", "extend_seq_lens", "out_cache_loc",
                   "encoder_lens"), used_by="attention_backend.AtomAttnBackend"),
    Symbol("sglang.srt.mem_cache.memory_pool:MHATokenToKVPool.get_key_buffer", ("self", "layer_id"),
           fields=("is_quantized_kv_cache",), used_by="attention_backend.AtomAttnBackend (its K/V buffers as ATOM's cache)"),
    Symbol("sglang.srt.mem_cache.memory_pool:MHATokenToKVPool.get_value_buffer", ("self", "layer_id"),
           used_by="attention_backend.AtomAttnBackend"),
    # speculative decoding (drafts.py): SGLang's EAGLE worker hands the draft its hidden states in spec_info and takes
    # the next ones from the LogitsProcessorOutput; EAGLE-3 targets hand their captured layers to the LogitsProcessor
    Symbol("sglang.srt.layers.logits_processor:LogitsProcessor.forward",
           ("self", "input_ids", "hidden_states", "lm_head", "logits_metadata", "aux_hidden_states"),
           used_by="wrapper.SGLangCausalLM.forward (EAGLE-3 targets), drafts.SGLangDraft.forward"),
    Symbol("sglang.srt.layers.logits_processor:LogitsProcessorOutput", fields=("hidden_states",),
           used_by="drafts.SGLangDraft.forward (the next draft step's hidden states)"),
    Symbol("sglang.srt.model_executor.forward_batch_info:ForwardBatch", fields=("spec_info",),
           used_by="drafts.SGLangDraft.forward"),
    Symbol("sglang.srt.speculative.eagle_info:EagleDraftInput", fields=("hidden_states",),
           used_by="drafts.SGLangDraft.forward (forward_batch.spec_info)"),
    Symbol("sglang.srt.runtime_context:get_model", (), used_by="compat.target_model_path (model_path)"),
    Symbol("sglang.srt.mem_cache.memory_pool:HybridLinearKVPool", used_by="compat.kv_pool_classes"),
    Symbol("sglang.srt.mem_cache.base_swa_memory_pool:BaseSWAKVPool", used_by="compat.kv_pool_classes (refused)"),
)
