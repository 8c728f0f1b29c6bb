"""``SGLANG_EXTERNAL_MODEL_PACKAGE=atom_sglang.models``.

SGLang imports each *top-level module* of this package (not this ``__init__``) and collects its
``EntryClass``; :mod:`atom_sglang.models.catalog` holds one class per atom-core catalog architecture.
"""
