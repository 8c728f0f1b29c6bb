"""Writing a checkpoint directory so that it is either complete or untouched (``atom quantize --out``,
``atom make-tiny``, ``atom fetch-demo``).

A writer fills a fresh directory beside the destination (``.NAME.partial-XXXXXXXX`` in the same parent,
so the final rename stays on one file system); it is renamed into place only once everything is written.
A run that fails or is interrupted leaves the destination as it was and removes its partial directory; a
run killed outright leaves it behind, and the next writer to the same destination removes it (a partial
directory whose owning process is gone).  Nothing is written outside the destination's parent directory.

Every directory ATOM writes holds :data:`MARKER` (which command wrote it).  An existing destination must be
empty, unless ``overwrite``: then it must hold that marker (``--overwrite`` replaces only what ATOM wrote,
never a directory of the user's or a checkpoint downloaded from elsewhere), and it is moved aside
(``.NAME.old-XXXXXXXX``), the new directory renamed in and the old one deleted, so the destination never
holds a mix of two checkpoints (stale shards, a stale index).  Between the two renames (two system calls)
the destination is briefly absent; a kill exactly there leaves the old checkpoint whole under its ``.old``
name (kept: it is the user's data).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from atom_core.errors import AtomError, UsageError

logger = logging.getLogger(__name__)

MARKER = ".atom-checkpoint.json"  # {"written_by": "atom quantize", "pid": ..., "host": ...}
PARTIAL = "partial"


def written_by(path: Path) -> str | None:
    """The command that wrote the directory ``path`` (from its :data:`MARKER`); None when ATOM did not."""
    marker = path / MARKER
    if marker.is_symlink() or not marker.is_file():
        return None
    try:
        data = json.loads(marker.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    writer = data.get("written_by") if isinstance(data, dict) else None
    return writer if isinstance(writer, str) else None


def write_marker(directory: Path, writer: str) -> None:
    (directory / MARKER).write_text(json.dumps({"written_by": writer, "pid": os.getpid(),
                                                "host": socket.gethostname()}) + "\n")


def check_destination(out: Path, overwrite: bool) -> None:
    """A :class:`UsageError` unless ``out`` can be written: absent (below directories, not files), an empty
    directory, or with ``overwrite`` a directory ATOM wrote."""
    ancestor = next((p for p in out.parents if p.exists() or p.is_symlink()), None)
    if ancestor is not None and not ancestor.is_dir():
        raise UsageError(f"cannot write {out}: {ancestor} is a file, not a directory")
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} exists and is not a directory")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        raise UsageError(f"{out} is not empty; choose another directory, or pass --overwrite to replace the "
                         "checkpoint ATOM wrote there")
    if written_by(out) is None:
        raise UsageError(f"{out} is not empty and was not written by ATOM (it has no {MARKER}); --overwrite "
                         "replaces only directories ATOM wrote: remove it yourself or choose another directory")


def _sibling(out: Path, tag: str) -> Path:
    return out.parent / f".{out.name}.{tag}-{secrets.token_hex(4)}"


def _owner_alive(partial: Path) -> bool:
    """Whether the writer that owns ``partial`` still runs (a partial directory of another machine counts as alive)."""
    try:
        data = json.loads((partial / MARKER).read_text())
        pid, host = int(data["pid"]), data["host"]
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return False  # no readable marker: left by a run killed before it wrote one
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_partials(out: Path) -> list[Path]:
    """Remove the partial directories of ``out`` that runs killed outright left behind; returns them."""
    removed = []
    if not out.parent.is_dir():
        return removed
    for partial in out.parent.glob(f".{out.name}.{PARTIAL}-*"):
        if partial.is_dir() and not partial.is_symlink() and not _owner_alive(partial):
            shutil.rmtree(partial, ignore_errors=True)
            logger.warning("removed %s, the partial output of an earlier run that was killed", partial)
            removed.append(partial)
    return removed


@contextmanager
def staged_dir(out_dir: str | Path, *, writer: str, overwrite: bool = False) -> Iterator[Path]:
    """``with staged_dir(out, writer="atom CMD") as tmp:`` write into ``tmp``; on a clean exit ``tmp`` (with its
    :data:`MARKER`) becomes ``out``.  A failure to write (a full disk, a read-only directory) is an
    :class:`AtomError` naming ``out``; ``out`` is then as it was."""
    out = Path(out_dir)
    check_destination(out, overwrite)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create {out.parent}: {err.strerror or err}") from None
    remove_stale_partials(out)
    tmp = _sibling(out, PARTIAL)
    try:
        tmp.mkdir()
        write_marker(tmp, writer)
    except OSError as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise AtomError(f"cannot write beside {out}: {err.strerror or err} ({err.filename or tmp.parent})") from None
    try:
        yield tmp
        _install(tmp, out)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if _write_failure(err):
            raise AtomError(f"writing {out} failed, nothing was changed there: {_describe(err)}") from err
        raise


def _write_failure(err: BaseException) -> bool:
    """An error of the file system (full, read-only, quota), from Python or from safetensors' writer."""
    if isinstance(err, AtomError):
        return False
    if isinstance(err, OSError):
        return True
    from safetensors import SafetensorError

    return isinstance(err, SafetensorError) and ("IoError" in str(err) or "No space" in str(err))


def _describe(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror:
        return f"{err.strerror}" + (f" ({err.filename})" if err.filename else "")
    return " ".join(str(err).split())


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
