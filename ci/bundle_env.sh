# Sourced by the GPU run scripts (ci/gpu_e2e.sh, ci/gpu_sglang.sh), which set PY first.
# bundle_on_path NAME PARTS_DIR BUNDLE_DIR ADAPTER: unpack the bundle parts that have arrived (ci/host_bundle.py
# install; exits 3 naming the missing ones until all are there), then put the source tree (the packages and
# tools/, the benches' home) and the bundle's site dir on PYTHONPATH. Order matters: the source tree comes first,
# so its atom_* packages are the ones imported; the
# bundle's site dir follows with the host, its requirements and the dist-info of the ADAPTER's wheel, whose plugin
# entry point is how the host finds ATOM (the source tree has no dist-info); the machine's site-packages (torch,
# triton) come after everything on PYTHONPATH.
bundle_on_path() {
  local name=$1 parts=$2 target=$3 adapter=$4 out rc=0
  out=$("$PY" ci/host_bundle.py install --parts "$parts" --target "$target" --require-all) || rc=$?
  if (( rc == 3 )); then
    echo "$name: bundle incomplete: copy the missing parts into $parts and run again" >&2
  fi
  (( rc == 0 )) || exit "$rc"
  local src="$PWD/packages"
  export PYTHONPATH="$src/atom-kernels/src:$src/atom-core/src:$src/$adapter/src:$PWD/tools:${out##*PYTHONPATH=}${PYTHONPATH:+:$PYTHONPATH}"
}
