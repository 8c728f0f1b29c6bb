"""LoRA adapters applied in ATOM's own linear layers: peft adapter directories (:mod:`.adapter`) and the
per-token, many-adapters-per-batch delta those layers add (:mod:`.layers`)."""

from atom_core.lora.adapter import LoraAdapter, load_adapter, parse_lora_option
from atom_core.lora.layers import LoraSet, LoraSlots, attach_adapters

__all__ = ["LoraAdapter", "LoraSet", "LoraSlots", "attach_adapters", "load_adapter", "parse_lora_option"]
