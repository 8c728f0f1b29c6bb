"""The installed ATOM distributions and the ranges they declare on each other.

Each distribution's version has one source (``__version__`` in its package, read by hatch); each declares
the range of the one below it (``Requires-Dist: atom-core>=0.1,<0.2``). pip enforces those ranges at install;
:func:`check_requirements` enforces them at run time too, for an install that bypassed the resolver
(``--no-deps``, a copied site-packages): the adapters call it before registering with their host.
Imports only the standard library and ``packaging``.
"""

from __future__ import annotations

import importlib.metadata

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

DISTRIBUTIONS = ("atom-kernels", "atom-core", "atom-vllm", "atom-sglang")


class VersionMismatch(ImportError):
    """An installed ATOM distribution is outside the range another one declares."""


def installed() -> dict[str, str | None]:
    """``{distribution: version}`` of every ATOM distribution (None when not installed)."""
    out: dict[str, str | None] = {}
    for name in DISTRIBUTIONS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def mismatches(distribution: str) -> list[str]:
    """One line per ATOM requirement of ``distribution`` that the installed versions do not meet (empty when
    ``distribution`` is not installed, e.g. run from a source tree)."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return []
    problems = []
    for line in dist.requires or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        name = canonicalize_name(req.name)
        if name not in DISTRIBUTIONS or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"{distribution} {dist.version} requires {name}{req.specifier}, which is not installed")
            continue
        try:
            ok = req.specifier.contains(Version(have), prereleases=True)
        except InvalidVersion:
            ok = False
        if not ok:
            problems.append(f"{distribution} {dist.version} requires {name}{req.specifier}, but {name} {have} is installed")
    return problems


def check_requirements(distribution: str) -> None:
    """Raise :class:`VersionMismatch` naming both versions when an installed ATOM distribution is outside the
    range ``distribution`` declares for it."""
    problems = mismatches(distribution)
    if problems:
        raise VersionMismatch("; ".join(problems) + f" (install matching versions: pip install -U {distribution})")
