"""ATOM core: model catalog, model definitions, layers, quantization, checkpoint loading, the host
interface a model is built against, and a small native runner (``atom`` command)."""

__version__ = "0.1.0"
