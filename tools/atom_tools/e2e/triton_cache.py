"""What Triton compiled in an engine, read from its cache directory (``TRITON_CACHE_DIR``, one per engine).

Every kernel variant Triton compiles becomes one cache entry (a directory).  The entries that appear during a
timed run are the compiles that run paid for in the middle of serving: a step size, batch composition or pointer
alignment seen for the first time.  Each is described well enough to tell two variants of one kernel apart:

* ``kernel``: the kernel's name;
* ``num_warps`` / ``num_stages``: its launch options (a different launch config);
* ``aligned``: the non-constexpr arguments Triton specialized as multiples of 16 (pointer alignment, integer
  divisibility; from the ``tt.divisibility`` attributes of the compiled IR's signature);
* ``ir``: a short hash of the Triton IR without source locations (equal IR and launch options: only the
  specialization differs; different IR with equal ``aligned``: a constexpr differs).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

_SIGNATURE = re.compile(r"tt\.func public @\w+\((.*?)\)\s*(?:attributes|\{)", re.S)
_LOCATION = re.compile(r"\s*loc\([^()]*(?:\([^()]*\)[^()]*)*\)")


def describe(entry: Path) -> dict | None:
    """One cache entry's compile (None: not a kernel entry, e.g. a launcher or an unfinished write)."""
    metadata = [p for p in entry.glob("*.json") if not p.name.startswith("__grp__")]
    if not metadata:
        return None
    try:
        meta = json.loads(metadata[0].read_text())
    except (OSError, ValueError):
        return None
    out = {"kernel": meta.get("name", metadata[0].stem), "num_warps": meta.get("num_warps"),
           "num_stages": meta.get("num_stages")}
    ttir = entry / f"{metadata[0].stem}.ttir"
    if ttir.is_file():
        text = _LOCATION.sub("", ttir.read_text(errors="replace"))
        match = _SIGNATURE.search(text)
        if match:
            args = [a.split(":", 1)[0].strip().lstrip("%") for a in re.split(r",\s*(?=%)", match.group(1))
                    if "tt.divisibility = 16" in a]
            out["aligned"] = args
        out["ir"] = hashlib.sha256(text.encode()).hexdigest()[:12]
    return out


class CompileLog:
    """The entries of one Triton cache directory, and those new since the last look."""

    def __init__(self, cache_dir: Path):
        self.cache_dir = Path(cache_dir)
        self._seen: set[str] = set()

    def entries(self) -> list[Path]:
        return sorted(p for p in self.cache_dir.iterdir() if p.is_dir()) if self.cache_dir.is_dir() else []

    def count(self) -> int:
        return len(self.entries())

    def new(self) -> list[dict]:
        """The compiles since the last call (the first call: every one so far)."""
        fresh = [p for p in self.entries() if p.name not in self._seen]
        self._seen.update(p.name for p in fresh)
        return [d for d in map(describe, fresh) if d is not None]
