#!/usr/bin/env bash
# GPU checks for a person on a CUDA machine (CI has no GPU): the Triton kernels against their torch
# references on the GPU, model parity in bf16 on CUDA, then the kernel benchmarks.
# Runs with the machine's own python3 (torch + triton + transformers + safetensors + tokenizers present);
# the packages and tools/ are used from the source tree. Results: $OUT (default bench/results).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="packages/atom-kernels/src:packages/atom-core/src:packages/atom-vllm/src:tools${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
OUT="${OUT:-bench/results}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
status=0
what="${1:-all}"
if [[ "$what" == all || "$what" == tests ]]; then
  "$PY" -m pytest -q -p no:cacheprovider packages/atom-kernels/tests --junitxml="$OUT/kernel-tests.xml" || status=1
  "$PY" -m pytest -q -p no:cacheprovider packages/atom-core/tests -k "cuda" --junitxml="$OUT/core-tests.xml" || status=1
  # the kernel suites' plumbing at toy sizes on the GPU (tools/atom_tools/kernels)
  "$PY" -m pytest -q -p no:cacheprovider tools/tests/test_kernels_*.py --junitxml="$OUT/tools-tests.xml" || status=1
  ctx=$("$PY" -c 'import json, datetime, torch, triton; print(json.dumps({"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(), "torch": torch.__version__, "triton": triton.__version__}))')
  "$PY" ci/junit_summary.py "$ctx" "$OUT"/kernel-tests.xml "$OUT"/core-tests.xml "$OUT"/tools-tests.xml > "$OUT/gpu-tests.json" || status=1
fi
if [[ "$what" == all || "$what" == bench ]]; then
  shift || true
  # vLLM's kernels as peers where vLLM is importable (its bundle on PYTHONPATH); cells saying why where not
  "$PY" -m atom_tools.kernels --peers atom_tools.kernel_peers_vllm "$@" --out "$OUT/kernels.json" || status=1
fi
exit $status
