"""Checkpoint loading: lazy safetensors reading, name mapping, placement and a coverage check."""

from atom_core.loader.checkpoint import Checkpoint, LazySlice
from atom_core.loader.load import load_weights
from atom_core.loader.mapper import Target, WeightMapper

__all__ = ["Checkpoint", "LazySlice", "Target", "WeightMapper", "load_weights"]
