"""ATOM inside vLLM. Importing this package never imports vLLM; the plugin entry point does."""

__version__ = "0.1.0"
