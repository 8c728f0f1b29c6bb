"""One module per model family; :mod:`atom_core.catalog` lists which class serves which architecture."""
