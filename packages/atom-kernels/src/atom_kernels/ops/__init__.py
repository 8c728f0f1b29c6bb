"""One folder per op: ``__init__`` declares it, ``reference``/``triton``/``aiter`` implement it."""
