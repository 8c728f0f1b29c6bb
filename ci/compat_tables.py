"""Generate what ci/pins.toml decides for each adapter: the README compatibility tables and the
supported range each adapter package ships (``<import package>/_pins.py``).

    python ci/compat_tables.py           # rewrite the generated parts
    python ci/compat_tables.py --check   # exit 1 when any of them is stale (nox -s pins)

An adapter section of pins.toml (``[sglang]``, ``[vllm]``) has ``distribution``, ``upstream``,
``supported`` (a PEP 440 range) and ``versions.<version>`` tables with ``ci`` (run in CI or not) and
the stack that release pins (``python``, ``torch``, ``transformers``).  Sections without ``versions``
are left alone, so an adapter can adopt this schema on its own schedule.

A README holds each table between ``<!-- BEGIN GENERATED: <section> -->`` and ``<!-- END GENERATED: <section> -->``
(the marker style of ci/readme_tables.py, which owns the catalog and core tables; the two can be folded
into one generator by adding :func:`table` per adapter section to its ``TABLES``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
PINS_FILE = ROOT / "ci" / "pins.toml"
# Files that carry a section's table: the root README and the adapter's own README.
READMES = ("README.md", "packages/{distribution}/README.md")


def adapter_sections(pins: dict) -> dict[str, dict]:
    return {name: body for name, body in pins.items() if isinstance(body, dict) and "versions" in body}


def sort_key(version: str) -> tuple:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"[.+-]", version))


def table(section: str, body: dict) -> str:
    upstream = body.get("upstream", section)
    rows = [
        f"| {upstream} | Python | torch | transformers | checked in CI (CPU, light install of the release) |",
        "|---|---|---|---|---|",
    ]
    for version in sorted(body["versions"], key=sort_key, reverse=True):
        pins = body["versions"][version]
        checks = body.get("checks", "yes")
        ci = f"`nox -s {section}-{version}`: {checks}" if pins.get("ci") else "not run (inside the supported range)"
        rows.append(
            f"| {version} | {pins.get('python', '')} | {pins.get('torch', '')} | {pins.get('transformers', '')} | {ci} |"
        )
    rows.append("")
    rows.append(
        f"`{body['distribution']}` accepts {upstream} `{body['supported']}`; its plugin refuses any other version "
        f"with an error. Generated from `ci/pins.toml` by `ci/compat_tables.py`."
    )
    return "\n".join(rows)


def pins_module(section: str, body: dict) -> str:
    tested = tuple(v for v in sorted(body["versions"], key=sort_key) if body["versions"][v].get("ci"))
    return (
        f'"""Generated from ci/pins.toml [{section}] by ci/compat_tables.py; do not edit (CI checks it)."""\n\n'
        f"SUPPORTED = {body['supported']!r}\n"
        f"TESTED = {tested!r}\n"
    )


def replace_block(text: str, section: str, block: str) -> str | None:
    start, end = f"<!-- BEGIN GENERATED: {section} -->", f"<!-- END GENERATED: {section} -->"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.DOTALL)
    if not pattern.search(text):
        return None
    return pattern.sub(lambda _: f"{start}\n{block}\n{end}", text)


def generated_files(pins: dict) -> dict[Path, str]:
    """Every generated file's expected content (only the files whose markers exist, for READMEs)."""
    out: dict[Path, str] = {}
    for section, body in adapter_sections(pins).items():
        distribution = body["distribution"]
        package = distribution.replace("-", "_")
        out[ROOT / "packages" / distribution / "src" / package / "_pins.py"] = pins_module(section, body)
        for readme in READMES:
            path = ROOT / readme.format(distribution=distribution)
            current = out.get(path, path.read_text() if path.exists() else "")
            updated = replace_block(current, section, table(section, body))
            if updated is not None:
                out[path] = updated
            elif "{distribution}" in readme:
                raise SystemExit(f"{path.relative_to(ROOT)} has no <!-- BEGIN/END GENERATED: {section} --> markers")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail when a generated file is stale")
    args = parser.parse_args(argv)
    pins = tomllib.loads(PINS_FILE.read_text())
    stale = []
    for path, content in generated_files(pins).items():
        current = path.read_text() if path.exists() else None
        if current == content:
            continue
        if args.check:
            stale.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(content)
            print(f"wrote {path.relative_to(ROOT)}")
    if stale:
        print(f"stale (run `python ci/compat_tables.py`): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
