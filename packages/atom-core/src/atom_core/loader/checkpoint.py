"""Reading safetensors checkpoints lazily.

A checkpoint is either one ``model.safetensors`` or shards listed by ``model.safetensors.index.json``.
Tensors are yielded as :class:`LazySlice` views: a tensor-parallel rank narrows them to its part
before anything is read from disk (``safe_open(...).get_slice``).

A file safetensors cannot open (truncated, a garbage header length, a header that is not JSON) is a
:class:`CheckpointError` naming the file and where it breaks; so is a tensor stored in two shards.  When a
host (vLLM, SGLang) reads the files itself, :func:`host_tensors` turns its reader's safetensors error into
the same error, naming the file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from tqdm.auto import tqdm

from atom_core.errors import CheckpointError
from atom_core.paths import escapes, inside, read_json_object

logger = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
if hasattr(torch, "float8_e8m0fnu"):
    _DTYPES["F8_E8M0"] = torch.float8_e8m0fnu


def open_safetensors(path: Path):
    """``safe_open(path)``; a file that cannot be opened is a :class:`CheckpointError` naming it and, where
    the header says, the byte offset or the tensor where it breaks."""
    try:
        return safe_open(str(path), framework="pt")
    except (SafetensorError, OSError) as err:
        detail = _diagnose(path) if isinstance(err, SafetensorError) else None
        raise CheckpointError(f"{path}: not a readable safetensors file: {detail or err}") from err


def _diagnose(path: Path) -> str | None:
    """What is wrong with a safetensors file, from its 8-byte header length and JSON header alone."""
    size = path.stat().st_size
    if size < 8:
        return f"the file has {size} bytes, fewer than the 8-byte header length"
    with path.open("rb") as f:
        length = int.from_bytes(f.read(8), "little")
        if length > size - 8:
            return (f"the header length at byte 0 says {length} bytes, but only {size - 8} follow "
                    "(truncated, or not a safetensors file)")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"the header (bytes 8 to {8 + length}) is not valid JSON: {err}"
    spans = sorted((info["data_offsets"][1], info["data_offsets"][0], name) for name, info in header.items()
                   if isinstance(info, dict) and len(info.get("data_offsets") or ()) == 2)
    data = size - 8 - length
    cut = [(end, start, name) for end, start, name in spans if end > data]
    if cut:
        end, start, name = cut[0]
        return (f"truncated at byte {size}: the tensors need {spans[-1][0]} data bytes after the header, the file "
                f"holds {data}; {name} (data bytes {start} to {end}) is the first cut")
    return None


def host_tensors(weights: Iterable[tuple[str, Any]], checkpoint_dir: str | Path | None) -> Iterator[tuple[str, Any]]:
    """``weights``, a host's ``(name, tensor)`` iterator over the safetensors files of ``checkpoint_dir``, with
    the error its reader raises on a file safetensors cannot open turned into the :class:`CheckpointError`
    :func:`open_safetensors` gives for that file (found by opening each file of the checkpoint)."""
    iterator = iter(weights)
    while True:
        try:
            item = next(iterator)
        except StopIteration:
            return
        except SafetensorError as err:
            raise unreadable_file_error(checkpoint_dir, err) from err
        yield item


def unreadable_file_error(checkpoint_dir: str | Path | None, err: Exception) -> CheckpointError:
    """The error for the first safetensors file of ``checkpoint_dir`` (a directory, or a Hugging Face repo id in
    the local cache) that :func:`open_safetensors` refuses; ``err`` in one line when none is found."""
    local = _local_dir(checkpoint_dir)
    for file in sorted(local.glob("*.safetensors")) if local is not None else ():
        if escapes(local, file) is not None:  # a link out of the checkpoint: not ATOM's to open
            continue
        try:
            with open_safetensors(file):
                pass
        except CheckpointError as found:
            return found
    where = f"checkpoint {checkpoint_dir}" if checkpoint_dir else "the checkpoint"
    detail = " ".join(str(err).split())
    return CheckpointError(f"a safetensors file of {where} is not readable: {detail}")


def _local_dir(checkpoint_dir: str | Path | None) -> Path | None:
    if not checkpoint_dir:
        return None
    if Path(checkpoint_dir).is_dir():
        return Path(checkpoint_dir)
    try:  # a repo id the host downloaded: its snapshot in the local cache, if any
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(checkpoint_dir), local_files_only=True))
    except Exception:  # not a repo id, or not in the cache: no file to name
        return None


class LazySlice:
    """A view of one checkpoint tensor that reads from disk only when materialised."""

    def __init__(self, handle: Any, name: str, ranges: tuple[tuple[int, int], ...] | None = None):
        self._handle = handle
        self.name = name
        info = handle.get_slice(name)
        self._slice = info
        full = tuple(info.get_shape())
        self._ranges = ranges if ranges is not None else tuple((0, n) for n in full)
        self.dtype = _DTYPES.get(info.get_dtype(), info.get_dtype())

    @property
    def shape(self) -> torch.Size:
        return torch.Size(stop - start for start, stop in self._ranges)

    def dim(self) -> int:
        return len(self._ranges)

    def narrow(self, dim: int, start: int, length: int) -> LazySlice:
        dim = dim % self.dim()
        lo, hi = self._ranges[dim]
        if start < 0 or length < 0 or lo + start + length > hi:
            raise ValueError(f"narrow({dim}, {start}, {length}) out of range for shape {tuple(self.shape)}")
        ranges = list(self._ranges)
        ranges[dim] = (lo + start, lo + start + length)
        out = LazySlice.__new__(LazySlice)
        out._handle, out.name, out._slice, out._ranges, out.dtype = self._handle, self.name, self._slice, tuple(ranges), self.dtype
        return out

    def reshape(self, *shape: int) -> torch.Tensor:
        return self.to_tensor().reshape(*shape)

    def to_tensor(self) -> torch.Tensor:
        if not self._ranges:
            return self._handle.get_tensor(self.name)
        return self._slice[tuple(slice(start, stop) for start, stop in self._ranges)]

    def __repr__(self) -> str:
        return f"LazySlice({self.name!r}, shape={tuple(self.shape)}, dtype={self.dtype})"


class Checkpoint:
    """The safetensors files of a model directory and the tensors each holds."""

    def __init__(self, model_dir: str | Path):
        self.model_dir = Path(model_dir)
        self.weight_map = self._weight_map()

    def _weight_map(self) -> dict[str, str]:
        index = inside(self.model_dir, INDEX_FILE)
        if index.is_file():
            weight_map = _index_weight_map(index)
            missing: dict[str, list[str]] = {}
            for name, file in weight_map.items():
                if not inside(self.model_dir, file, source=index, what="shard").is_file():
                    missing.setdefault(file, []).append(name)
            if missing:
                detail = "; ".join(f"{file} (holds {len(names)} tensors, e.g. {names[0]})" for file, names in missing.items())
                raise CheckpointError(f"checkpoint {self.model_dir} is missing shard(s): {detail}")
            return weight_map
        single = self.model_dir / SINGLE_FILE
        if single.is_file():
            with open_safetensors(self.path(SINGLE_FILE)) as handle:
                return {name: SINGLE_FILE for name in handle.keys()}
        others = sorted(p.name for p in self.model_dir.glob("*.safetensors"))
        if others:
            weight_map: dict[str, str] = {}
            for file in others:
                with open_safetensors(self.path(file)) as handle:
                    for name in handle.keys():
                        if name in weight_map:
                            raise CheckpointError(f"{self.model_dir}: tensor {name} is in both {weight_map[name]} and {file}")
                        weight_map[name] = file
            return weight_map
        raise CheckpointError(f"{self.model_dir} holds no safetensors weights ({SINGLE_FILE} or {INDEX_FILE})")

    def path(self, file: str) -> Path:
        """The path of the checkpoint file ``file`` (a name from the index or the directory), checked to stay
        inside the checkpoint (:func:`atom_core.paths.inside`)."""
        source = self.model_dir / INDEX_FILE if (self.model_dir / INDEX_FILE).is_file() else None
        return inside(self.model_dir, file, source=source, what="shard")

    @property
    def files(self) -> list[str]:
        return sorted(set(self.weight_map.values()))

    def __iter__(self) -> Iterator[tuple[str, LazySlice]]:
        return self.tensors()

    def tensors(self, progress: bool | None = None) -> Iterator[tuple[str, LazySlice]]:
        """Every tensor as ``(name, LazySlice)``, file by file, with a progress bar on long loads."""
        by_file: dict[str, list[str]] = {}
        for name, file in self.weight_map.items():
            by_file.setdefault(file, []).append(name)
        show = progress if progress is not None else len(self.weight_map) > 2000 or len(by_file) > 4
        bar = tqdm(total=len(self.weight_map), desc="loading weights", unit="tensor", disable=not show)
        try:
            for file in sorted(by_file):
                with open_safetensors(self.path(file)) as handle:
                    present = set(handle.keys())
                    elsewhere = sorted(name for name in present if self.weight_map.get(name, file) != file)
                    if elsewhere:
                        name = elsewhere[0]
                        more = f", and {len(elsewhere) - 1} more like it" if len(elsewhere) > 1 else ""
                        raise CheckpointError(
                            f"{self.model_dir}: tensor {name} is in both {file} and {self.weight_map[name]} (where the "
                            f"index places it){more}: shards of two checkpoints mixed in one directory?"
                        )
                    for name in by_file[file]:
                        if name not in present:
                            raise CheckpointError(f"{file} does not hold {name}, which the index places there")
                        yield name, LazySlice(handle, name)
                        bar.update(1)
        finally:
            bar.close()


def _index_weight_map(index: Path) -> dict[str, str]:
    """The ``weight_map`` of an index file: a JSON object whose ``weight_map`` maps tensor names to file names."""
    data = read_json_object(index, "an object with a weight_map", object_pairs_hook=_unique_keys(index))
    weight_map = data.get("weight_map")
    if not weight_map:
        raise CheckpointError(f"{index} has no weight_map")
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index}: weight_map is a JSON {type(weight_map).__name__}, not an object of "
                              "tensor name -> file name")
    bad = next(((name, file) for name, file in weight_map.items() if not isinstance(file, str)), None)
    if bad is not None:
        raise CheckpointError(f"{index}: weight_map places {bad[0]} in {bad[1]!r}, which is not a file name")
    return dict(weight_map)


def _unique_keys(path: Path):
    """A ``json`` object hook: a key listed twice with different values (a tensor placed in two shards) is an error."""

    def build(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out and out[key] != value:
                raise CheckpointError(f"{path}: {key} is listed twice ({out[key]} and {value})")
            out[key] = value
        return out

    return build
