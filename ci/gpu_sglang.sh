#!/usr/bin/env bash
# SGLang on the air-gapped GPU machine (Python 3.12, torch 2.11.0+cu130, no package registry; docs/sglang.md
# "SGLang on an air-gapped GPU machine"). Copy the parts and manifest.json written by
# `ci/host_bundle.py build --host sglang` (`nox -s sglang-bundle`) into $PARTS_DIR (default: .bundle/sglang in
# this checkout), all at once or one transfer at a time: each run unpacks the parts that have arrived into
# $BUNDLE_DIR (default /tmp/sglang-bundle; parts already unpacked are skipped) and exits 3 naming the missing
# ones until all are there; then it runs `python3 ARGS...` with the bundle on PYTHONPATH, e.g.
#   bash ci/gpu_sglang.sh -m sglang.launch_server --model-path DIR --attention-backend triton \
#     --sampling-backend pytorch
# (the bundle has neither FA3 nor FlashInfer; vision encoders: --mm-attention-backend triton_attn).
# ATOM's classes against SGLang's own through two servers: bash ci/gpu_sglang.sh -m atom_tools.e2e.sglang --out X.json
# (the bench sets SGLANG_EXTERNAL_MODEL_PACKAGE per server itself; --atom is not needed).
# `--atom` as the first argument also sets SGLANG_EXTERNAL_MODEL_PACKAGE=atom_sglang.models and ATOM_TAKE_OVER=all,
# so ATOM's classes replace SGLang's own (without ATOM_TAKE_OVER only where atom_core.takeover measured a fast path) (atom-sglang's plugin accepts only the SGLang releases in ci/pins.toml [sglang]).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
BUNDLE_DIR="${BUNDLE_DIR:-/tmp/sglang-bundle}"
PARTS_DIR="${PARTS_DIR:-.bundle/sglang}"
atom=0
if [[ "${1:-}" == "--atom" ]]; then atom=1; shift; fi
if (( $# == 0 )); then
  echo "usage: bash ci/gpu_sglang.sh [--atom] PYTHON_ARGS... (e.g. -m sglang.launch_server --model-path DIR)" >&2
  exit 2
fi
source ci/bundle_env.sh
# the bundle's site dir also holds sglang-kernel and the pinned transformers (shadowing the machine's); the
# atom-sglang dist-info carries the `sglang.srt.plugins` entry point SGLang loads
bundle_on_path gpu_sglang "$PARTS_DIR" "$BUNDLE_DIR" atom-sglang
if (( atom )); then export SGLANG_EXTERNAL_MODEL_PACKAGE=atom_sglang.models ATOM_TAKE_OVER=all; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # no network there
export PYTHONUNBUFFERED=1
# SGLang's caches (compiled kernels, tuned configs) in a fresh temp dir per run unless given.
export SGLANG_CACHE_DIR="${SGLANG_CACHE_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/sglang-cache.XXXXXX")}"
exec "$PY" "$@"
