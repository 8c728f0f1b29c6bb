"""ATOM inside SGLang. Importing this package never imports SGLang."""

__version__ = "0.1.0"
