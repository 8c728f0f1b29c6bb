"""SGLang's ``SGLANG_EXTERNAL_MODEL_PACKAGE`` target: its top-level modules expose ``EntryClass``."""
