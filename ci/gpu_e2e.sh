#!/usr/bin/env bash
# vLLM end to end on the air-gapped GPU machine (Python 3.12, torch 2.11.0+cu130, no package registry;
# README "vLLM on an air-gapped GPU machine"). Copy the parts and manifest.json written by
# `ci/host_bundle.py build --host vllm` (`nox -s vllm-bundle`) into $PARTS_DIR (default: .bundle in this
# checkout), all at once or one transfer at a time: each run unpacks the parts that have arrived into
# $BUNDLE_DIR (default /tmp/vllm-bundle; parts already unpacked are skipped) and exits 3 naming the missing
# ones until all are there; then it runs `python3 -m atom_tools.e2e.vllm "$@"`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
BUNDLE_DIR="${BUNDLE_DIR:-/tmp/vllm-bundle}"
PARTS_DIR="${PARTS_DIR:-.bundle}"
source ci/bundle_env.sh
# the bundle's atom-vllm dist-info carries the `vllm.general_plugins` entry point (atom_vllm.plugin:register):
# without it vLLM would run its own models
bundle_on_path gpu_e2e "$PARTS_DIR" "$BUNDLE_DIR" atom-vllm
export VLLM_USE_FLASHINFER_SAMPLER=0   # the FlashInfer sampler imports flashinfer, which is not bundled
export HF_HUB_OFFLINE=1                # no network there
export VLLM_ALLOW_INSECURE_SERIALIZATION=1  # collective_rpc with Python functions
export PYTHONUNBUFFERED=1
# vLLM caches the capability flags of plugin classes keyed by atom_vllm/models.py alone: a fresh cache per run.
export VLLM_CACHE_ROOT="${VLLM_CACHE_ROOT:-$(mktemp -d "${TMPDIR:-/tmp}/vllm-cache.XXXXXX")}"
exec "$PY" -m atom_tools.e2e.vllm "$@"
