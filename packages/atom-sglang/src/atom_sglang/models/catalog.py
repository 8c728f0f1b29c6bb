"""``EntryClass``: one SGLang model class per atom-core catalog architecture atom-sglang serves, each
named like its architecture (SGLang looks classes up by ``__name__``).  Generated from
:data:`atom_core.catalog.ARCHITECTURES`, so a new catalog entry needs no change here."""

from atom_sglang.wrapper import entry_classes

EntryClass = entry_classes(__name__)
globals().update({cls.__name__: cls for cls in EntryClass})
