"""Names taken from a checkpoint, resolved inside it: the one check every reader and writer uses.

A checkpoint is untrusted input: its index names shard files, and any file in it may be a symbolic link.
:func:`inside` turns such a name into a path and refuses (a :class:`CheckpointError` naming the file the
name came from and the name) one that is absolute, climbs out with ``..``, or resolves, through links, to
a place outside the checkpoint directory.  :func:`check_links` does the same for every link in a
directory, before the directory is handed to a library that opens files of its own choosing
(transformers' tokenizer and image-processor loaders).

Links are followed only where they stay inside.  The one exception is the Hugging Face hub cache, whose
``snapshots/<revision>/`` directories hold links into the repository's ``blobs/`` directory: a
snapshot's links may resolve there too (and nowhere else).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath, PureWindowsPath

from atom_core.errors import CheckpointError


def allowed_roots(root: str | Path) -> tuple[Path, ...]:
    """Where names under ``root`` may resolve: ``root`` itself (links in its own path are the user's choice,
    so it is resolved first) and, for a hub-cache snapshot, the repository's ``blobs`` directory."""
    real = Path(root).resolve()
    roots = [real]
    if real.parent.name == "snapshots" and (real.parent.parent / "blobs").is_dir():
        roots.append((real.parent.parent / "blobs").resolve())
    return tuple(roots)


def _within(path: Path, roots: tuple[Path, ...]) -> bool:
    return any(path == r or path.is_relative_to(r) for r in roots)


def inside(root: str | Path, name: object, *, source: str | Path | None = None, what: str = "file") -> Path:
    """``root / name``, after checking that ``name`` (read from ``source``, a file of the checkpoint, or from
    the directory listing) is a relative path that stays inside ``root``, links included.

    The path returned is ``root / name`` as given (not resolved), so messages name it as the user knows it."""
    where = f"{source}: " if source is not None else ""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise CheckpointError(f"{where}{what} name {name!r} is not a file name")
    parts = PurePosixPath(name).parts
    if PurePosixPath(name).is_absolute() or PureWindowsPath(name).is_absolute() or PureWindowsPath(name).drive:
        raise CheckpointError(f"{where}{what} {name!r} is an absolute path; a checkpoint names files inside itself only")
    if ".." in parts or ".." in PureWindowsPath(name).parts:
        raise CheckpointError(f"{where}{what} {name!r} climbs out of the checkpoint directory ('..')")
    path = Path(root) / name
    roots = allowed_roots(root)
    real = path.resolve()
    if not _within(real, roots):
        raise CheckpointError(f"{where}{what} {name!r} is a link to {real}, outside the checkpoint directory {Path(root)}")
    return path


def escapes(root: str | Path, path: Path) -> Path | None:
    """Where ``path`` (an entry under ``root``) resolves when that is outside ``root``; None when it stays inside."""
    real = path.resolve()
    return None if _within(real, allowed_roots(root)) else real


def check_links(root: str | Path) -> None:
    """A :class:`CheckpointError` naming the first symbolic link under ``root`` that resolves outside it (links
    to directories are not descended into: the link itself is checked)."""
    root = Path(root)
    roots = allowed_roots(root)
    for folder, dirs, files in os.walk(root):
        for entry in (*dirs, *files):
            path = Path(folder) / entry
            if path.is_symlink() and not _within(path.resolve(), roots):
                raise CheckpointError(f"{path} is a link to {path.resolve()}, outside the checkpoint directory {root}: "
                                      "ATOM reads nothing outside a checkpoint")


def read_json_object(path: Path, expected: str = "an object", object_pairs_hook: Callable | None = None) -> dict:
    """A checkpoint's JSON file that must hold an object (``expected`` says which, in the error): its content, or a
    one-line :class:`CheckpointError` naming the file (not valid JSON or UTF-8, or another JSON type)."""
    try:
        data = json.loads(path.read_text(), object_pairs_hook=object_pairs_hook)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} holds a JSON {type(data).__name__}, not {expected}")
    return data
