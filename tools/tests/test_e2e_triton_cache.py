"""The e2e benches' record of what Triton compiled during a timed run (atom_tools.e2e.triton_cache): read from cache
entries laid out as Triton 3.6 writes them (the IR signature below is a real sm_90 compile's, trimmed)."""

from __future__ import annotations

import json

from atom_tools.e2e.triton_cache import CompileLog, describe

TTIR = """#loc = loc("/tmp/k.py":5:0)
#loc13 = loc("x_ptr"(#loc))
module {
  tt.func public @_copy_kernel(%x_ptr: !tt.ptr<bf16> {tt.divisibility = 16 : i32} loc("x_ptr"(#loc)), \
%y_ptr: !tt.ptr<bf16> loc("y_ptr"(#loc)), %n: i32 {tt.divisibility = 16 : i32} loc("n"(#loc)), \
%stride: i32 loc("stride"(#loc))) attributes {noinline = false} {
    %i = tt.get_program_id x : i32 loc(#loc17)
    %c = arith.constant BLOCK : i32 loc(#loc18)
    tt.return loc(#loc)
  } loc(#loc)
} loc(#loc)
"""


def write_entry(cache, name: str, ttir: str, num_warps: int = 4):
    entry = cache / name
    entry.mkdir(parents=True)
    (entry / "_copy_kernel.json").write_text(json.dumps({"name": "_copy_kernel", "num_warps": num_warps, "num_stages": 3}))
    (entry / "__grp___copy_kernel.json").write_text(json.dumps({"child_paths": {}}))
    (entry / "_copy_kernel.ttir").write_text(ttir)
    return entry


def test_describe_names_the_kernel_its_launch_options_and_aligned_arguments(tmp_path):
    entry = write_entry(tmp_path, "A", TTIR.replace("BLOCK", "128"))
    got = describe(entry)
    assert got["kernel"] == "_copy_kernel" and (got["num_warps"], got["num_stages"]) == (4, 3)
    assert got["aligned"] == ["x_ptr", "n"]
    # a pointer that lost its alignment: same IR otherwise, so only `aligned` (and the hash) differ
    unaligned = describe(write_entry(tmp_path, "B", TTIR.replace("BLOCK", "128").replace(
        "%x_ptr: !tt.ptr<bf16> {tt.divisibility = 16 : i32}", "%x_ptr: !tt.ptr<bf16>")))
    assert unaligned["aligned"] == ["n"] and unaligned["ir"] != got["ir"]
    # a constexpr that changed: the same signature, different IR
    other = describe(write_entry(tmp_path, "C", TTIR.replace("BLOCK", "64")))
    assert other["aligned"] == got["aligned"] and other["ir"] != got["ir"]
    # source locations do not count
    moved = describe(write_entry(tmp_path, "D", TTIR.replace("BLOCK", "128").replace("#loc17", "#loc99")))
    assert moved["ir"] == got["ir"]


def test_compile_log_reports_each_entry_once(tmp_path):
    log = CompileLog(tmp_path / "cache")
    assert log.new() == [] and log.count() == 0  # no cache directory yet
    write_entry(tmp_path / "cache", "A", TTIR)
    (tmp_path / "cache" / "launcher").mkdir()  # a directory without kernel metadata counts but is not described
    assert [d["kernel"] for d in log.new()] == ["_copy_kernel"] and log.count() == 2
    assert log.new() == []
    write_entry(tmp_path / "cache", "B", TTIR, num_warps=8)
    assert [d["num_warps"] for d in log.new()] == [8]
