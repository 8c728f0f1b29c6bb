"""Writing a checkpoint directory so that it is either complete or untouched (``atom quantize --out``,
``atom make-tiny``).

A writer fills a fresh directory beside the destination (``.NAME.partial-XXXXXXXX`` in the same parent,
so the final rename stays on one file system); it is renamed into place only once everything is written.
A run that fails leaves the destination as it was and removes its partial directory (a run killed outright
leaves the partial directory behind; nothing reads it).

An existing destination must be empty, unless ``overwrite``: then it must look like a checkpoint (it holds
``config.json`` or ``*.safetensors``: ``--overwrite`` never replaces an arbitrary directory), and it is
moved aside (``.NAME.old-XXXXXXXX``), the new directory renamed in and the old one deleted, so the
destination never holds a mix of two checkpoints (stale shards, a stale index).  Between the two renames
(two system calls) the destination is briefly absent; a kill exactly there leaves the old checkpoint
whole under its ``.old`` name.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from atom_core.errors import UsageError


def looks_like_checkpoint(path: Path) -> bool:
    return (path / "config.json").is_file() or any(path.glob("*.safetensors"))


def check_destination(out: Path, overwrite: bool) -> None:
    """A :class:`UsageError` unless ``out`` is absent, an empty directory, or (with ``overwrite``) a checkpoint."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a directory")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        raise UsageError(f"{out} is not empty; choose another directory, or pass --overwrite to replace the "
                         "checkpoint in it")
    if not looks_like_checkpoint(out):
        raise UsageError(f"{out} is not empty and holds no checkpoint (no config.json or *.safetensors); "
                         "--overwrite replaces checkpoint directories only")


def _sibling(out: Path, tag: str) -> Path:
    return out.parent / f".{out.name}.{tag}-{secrets.token_hex(4)}"


@contextmanager
def staged_dir(out_dir: str | Path, *, overwrite: bool = False) -> Iterator[Path]:
    """``with staged_dir(out) as tmp:`` write into ``tmp``; on a clean exit ``tmp`` becomes ``out``."""
    out = Path(out_dir)
    check_destination(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(out, "partial")
    tmp.mkdir()
    try:
        yield tmp
        _install(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _install(tmp: Path, out: Path) -> None:
    if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        out.rmdir()
    if not os.path.lexists(out):
        os.rename(tmp, out)
        return
    old = _sibling(out, "old")
    os.rename(out, old)
    try:
        os.rename(tmp, out)
    except BaseException:
        os.rename(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
