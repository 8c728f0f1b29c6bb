"""Generate everything ci/pins.toml and the catalog decide for the docs and the adapters, or check it is current:

- the tables in README.md, docs/*.md and packages/*/README.md, each between ``<!-- BEGIN generated:NAME -->`` and
  ``<!-- END generated:NAME -->`` (a table may appear in several files, and must appear in at least one);
- each adapter's ``_pins.py`` (``atom_vllm._pins``, ``atom_sglang._pins``): the tested releases and supported range
  it ships.

    python ci/readme_tables.py          rewrite what is stale
    python ci/readme_tables.py --check  exit 1 (with a diff) when anything is stale

Add a generator to TABLES for a new table, to MODULES for a new generated module.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Callable
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "packages" / "atom-core" / "src"))

from atom_core import catalog, takeover  # noqa: E402  (import no torch)


def release_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def models_table(pins: dict) -> str:
    lines = [
        "| architecture | family | capabilities | quantization formats | reference (transformers) |",
        "|---|---|---|---|---|",
    ]
    for name in catalog.supported():
        spec = catalog.get(name)
        caps = ", ".join(sorted(spec.capabilities))
        quant = ", ".join(spec.quant_formats) or "—"
        lines.append(f"| `{name}` | {spec.family} | {caps} | {quant} | `{spec.hf_class.split(':')[1]}` |")
    return "\n".join(lines)


def core_pins_table(pins: dict) -> str:
    """[core] (what `nox -s tests` pins) beside [newest] (what `nox -s newest` last resolved from PyPI)."""
    newest = pins.get("newest", {})
    lines = [f"| package | pinned (`nox -s tests`) | newest on PyPI (`nox -s newest`; last run {newest.get('checked', '—')}) |",
             "|---|---|---|"]
    lines += [f"| {name} | {version} | {newest.get(name, 'the same' if name == 'python' else '—')} |"
              for name, version in pins["core"].items()]
    known = newest.get("known_failures", [])
    if known:
        lines += ["", f"Known breaks on the newest releases ({sum(len(k['tests']) for k in known)} tests, xfail in "
                      "`nox -s newest`, listed in `ci/pins.toml`):"]
        lines += [f"- {k['reason']}: {len(k['tests'])} tests" for k in known]
    return "\n".join(lines)


def vllm_supported(pins: dict) -> str:
    """From the oldest tested vLLM release to any patch of the newest tested minor (atom_vllm.tested's rule)."""
    versions = sorted((e["version"] for e in pins["vllm"]), key=release_key)
    newest = release_key(versions[-1])
    return f">={versions[0]},<{newest[0]}.{newest[1] + 1}"


def vllm_table(pins: dict) -> str:
    entries = sorted(pins.get("vllm", []), key=lambda e: (e["distribution"], release_key(e["version"])), reverse=True)
    if not entries:
        return "_No vLLM releases pinned._"
    lines = [
        f"atom-vllm supports vLLM `{vllm_supported(pins)}` (checked when the plugin loads). "
        "Tested on this CPU-only CI:",
        "",
        "| distribution | version | torch | transformers | serve a model | checked |",
        "|---|---|---|---|---|---|",
    ]
    for e in entries:
        checks = "; ".join(pins["vllm_checks"][c] for c in e.get("checks", []))
        if e.get("construct") == "family":
            checks = checks.replace("of every architecture", "of one architecture per model family")
        torch = e["torch"] + (f" ({e['torch_note']})" if e.get("torch_note") else "")
        if not e.get("ci", True):
            checks = f"not in CI: {e['checked']} ({checks})"
        lines.append(f"| `{e['distribution']}` | {e['version']} | {torch} | {e['transformers']} | `{e['serve']} MODEL` | "
                     f"{checks} |")
    return "\n".join(lines)


# ---- H200 headline numbers, from the newest bench/results/<date>-h200/ (what the GPU run wrote) -------------
RESULTS = ROOT / "bench" / "results"


def _documents(path: Path) -> list[dict]:
    """The result documents of one JSON file: the file itself, or the parts of a ``ci/gpu_run.py`` run.json
    (``kernels``, ``e2e``); experiment data that is not an object yields none."""
    import json

    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        return []
    return [data] + ([v for k, v in data.items() if k in ("kernels", "e2e") and isinstance(v, dict)]
                     if data.get("format", "").startswith("atom-run/") else [])


def _latest_rows(suite: str) -> tuple[dict, list[dict]]:
    """(context, rows) of the newest H200 results holding ``suite``."""
    for folder in sorted(RESULTS.glob("*-h200"), reverse=True):
        for data in (d for path in sorted(folder.glob("*.json")) for d in _documents(path)):
            rows = data.get("suites", {}).get(suite)
            if isinstance(rows, list):
                return data["context"], rows
    return {}, []


def _us(value: float | None) -> str:
    return "—" if value is None else (f"{value:.1f}" if value < 100 else f"{value:.0f}")


def _pick(rows: list[dict], **match) -> dict | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in match.items())), None)


def _time(rows: list[dict], **match) -> float | None:
    row = _pick(rows, **match)
    return None if row is None else row.get("us")


def h200_table(pins: dict) -> str:
    out = []
    ctx, dense = _latest_rows("dense")
    if dense:
        out += [f"Measured on {ctx['gpu']}, {ctx['date']} (torch {ctx['torch']}, Triton {ctx['triton']}); copy bandwidth "
                f"{ctx['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul {ctx['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s. "
                "Times in µs (CUDA-graph replay, median); floor = bytes that must move / measured copy bandwidth "
                "(or FLOPs / matmul rate).", "",
                "| op | case | ATOM | peers | floor | ATOM / floor |", "|---|---|---|---|---|---|"]
        for op in ("rms_norm+residual", "silu_and_mul", "rotary"):
            atom = _pick(dense, op=op, tokens=8192, impl="atom-triton")
            eager = _time(dense, op=op, tokens=8192, impl="torch-eager")
            comp = _time(dense, op=op, tokens=8192, impl="torch-compile")
            out.append(f"| {op} | 8192 tokens, Llama-3-8B dims | {_us(atom['us'])} | eager {_us(eager)}, torch.compile "
                       f"{_us(comp)} | {_us(atom['floor_us'])} | {atom['us'] / atom['floor_us']:.2f} |")
    _, moe = _latest_rows("moe")
    for tokens in (1, 16, 256, 4096):
        atom = _pick(moe, tokens=tokens, impl="atom-triton-best")
        if atom:
            ref, dense_us = _time(moe, tokens=tokens, impl="torch-reference"), _time(moe, tokens=tokens, impl="cublas-dense-bf16")
            out.append(f"| fused MoE | E=128 top-8 H=2048 I=768, T={tokens} | {_us(atom['us'])} | torch reference {_us(ref)}, "
                       f"dense cuBLAS same FLOPs {_us(dense_us)} | {_us(atom['floor_us'])} ({atom['floor_kind']}) | "
                       f"{atom['ratio_to_floor']:.2f} |")
    _, gdn = _latest_rows("gdn")
    for case in ("decode N=1", "decode N=64", "decode N=256", "prefill 1x8192", "prefill 8x4096"):
        atom = _pick(gdn, case=case, impl="atom best")
        if atom:
            fla = next((r["us"] for r in gdn
                        if r.get("case") == case and str(r.get("impl", "")).startswith("fla 0.6.0")), None)
            mode = "graph" if atom.get("graph") else "eager"
            out.append(f"| GDN {case.split()[0]} | H=16 HV=32 K=V=128, {case.split()[1]} ({mode}) | {_us(atom['us'])} | "
                       f"fla 0.6.0 {_us(fla)} | {_us(atom['floor_us'])} | {atom['ratio_to_floor']:.2f} |")
    _, mrope = _latest_rows("mrope")
    for case in ("qwen3-vl", "qwen3-vl+qknorm", "qwen3.5", "qwen3.5+qknorm"):
        for tokens in (1024, 16384):
            atom = _pick(mrope, case=case, T=tokens, impl="atom-triton-best")
            if atom:
                eager = _time(mrope, case=case, T=tokens, impl="hf-eager")
                comp = _time(mrope, case=case, T=tokens, impl="hf-compile")
                out.append(f"| MRoPE {case} | T={tokens}, {atom['heads']} heads of {atom['head_size']} | {_us(atom['us'])} | "
                           f"HF eager {_us(eager)}, torch.compile {_us(comp)} | {_us(atom['floor_us'])} | "
                           f"{atom['ratio_to_floor']:.2f} |")
    _, quant = _latest_rows("quant")
    gemms = (("fp8-rowwise", "FP8 per-token x per-channel"), ("fp8-block", "FP8 128x128 blocks"), ("mxfp4", "MXFP4 weight-only"))
    for op, label in gemms:
        for m in (1, 16, 4096):
            atom = _pick(quant, summary="best", op=op, shape="8192x8192", M=m)
            bf16 = _time(quant, summary="best", op="gemm", shape="8192x8192", M=m)
            lt = _time(quant, op=op, shape="8192x8192", M=m, impl="cublaslt-scaled_mm") if op == "fp8-rowwise" else None
            floor = next((r["floor_us"] for r in quant if r.get("op") == op and r.get("shape") == "8192x8192"
                          and r.get("M") == m and r.get("floor_us")), None)
            if atom and str(atom.get("impl", "")).startswith("atom"):
                peers = f"bf16 cuBLAS {_us(bf16)}" + (f", torch._scaled_mm {_us(lt)}" if lt else "")
                ratio = f"{atom['us'] / floor:.2f}" if floor else "—"
                out.append(f"| {label} GEMM | M={m}, N=K=8192 | {_us(atom['us'])} | {peers} | {_us(floor)} | {ratio} |")
    _, small = _latest_rows("mxfp4")
    for shape, label in (("8192x8192", "N=K=8192"), ("moe-gpt-oss-w13", "gpt-oss w13 5760x2880")):
        for m in (1, 16):
            atom = _pick(small, shape=shape, M=m, impl="atom-triton", config="default")  # the shipped default
            bf16 = _time(small, shape=shape, M=m, impl="bf16-cublas")
            if atom:
                out.append(f"| MXFP4 small-M GEMM | M={m}, {label} | {_us(atom['us'])} | bf16 cuBLAS {_us(bf16)} | "
                           f"{_us(atom['floor_us'])} | {atom['us'] / atom['floor_us']:.2f} |")
            for after, what in (("rms_norm", "after ATOM's RMSNorm"), ("plain copy", "after a plain kernel")):
                row = _pick(small, shape=shape, M=m, impl=f"atom-triton after {after}")  # pair minus predecessor
                peer = _time(small, shape=shape, M=m, impl=f"bf16-cublas after {after}")
                if row and peer:
                    out.append(f"| MXFP4 small-M GEMM {what} | M={m}, {label} | {_us(row['us'])} | bf16 cuBLAS "
                               f"{_us(peer)} (same predecessor) | {_us(row['floor_us'])} | "
                               f"{row['us'] / row['floor_us']:.2f} |")
    out += _attention_rows() + _mla_rows() + _gpt_oss_moe_rows()
    if out:
        dates = {suite: _latest_rows(suite)[0].get("date") for suite in SUITE_LABELS}
        out += ["", "Each suite's rows come from the newest run holding it: " + ", ".join(
            f"{label} {dates[suite]}" for suite, label in SUITE_LABELS.items() if dates[suite]) + "."]
    return "\n".join(out) if out else "_No H200 results committed yet._"


SUITE_LABELS = {"dense": "dense ops", "moe": "fused MoE", "gdn": "GDN", "mrope": "MRoPE", "quant": "quantized GEMMs",
                "mxfp4": "MXFP4 small-M", "attention": "paged attention", "mla": "MLA decode",
                "moe_gpt_oss": "gpt-oss MoE"}


def _attention_rows() -> list[str]:
    _, rows = _latest_rows("attention")
    out = []
    for row in rows:
        if not isinstance(row.get("atom_us"), float):
            continue
        peers = ", ".join(f"{label} {_us(row[f'{impl}_us'])}" for impl, label in
                          (("fa3", "FA3 (vLLM)"), ("vllm_triton", "vLLM Triton"), ("sdpa", "SDPA"))
                          if isinstance(row.get(f"{impl}_us"), float))
        shape = (f"B={row['batch']}, context {row['context']}" if row["phase"] == "decode" else
                 f"{row['batch']} x {row['new_tokens']} new, context {row['context']}")
        out.append(f"| paged attention {row['phase']} | {shape}, 32/8 heads of 128, bf16 | {_us(row['atom_us'])} | "
                   f"{peers} | {_us(row['floor_us'])} | {row['atom_us'] / row['floor_us']:.2f} |")
    return out


def _mla_rows() -> list[str]:
    """MLA decode over the paged latent cache; the floor is the larger of the bytes floor and the FLOPs floor
    (QK over 576 and PV over 512 latent columns per head and context token)."""
    ctx, rows = _latest_rows("mla")
    out = []
    for heads, batch, context in ((128, 1, 8192), (128, 64, 8192), (16, 64, 8192), (16, 16, 32768)):
        atom = _pick(rows, heads=heads, batch=batch, context=context, impl="atom-triton")
        if atom:
            ref = _time(rows, heads=heads, batch=batch, context=context, impl="torch-reference")
            flops_us = 2 * batch * heads * context * (576 + 512) / ctx["bf16_flops_per_s"] * 1e6
            floor = max(atom["floor_us"], flops_us)
            out.append(f"| MLA decode | {heads} heads, B={batch}, context {context}, latent 512 + rope 64 | "
                       f"{_us(atom['us'])} | torch reference {_us(ref)} | {_us(floor)} | {atom['us'] / floor:.2f} |")
    return out


def _gpt_oss_moe_rows() -> list[str]:
    _, rows = _latest_rows("moe_gpt_oss")
    out = []
    for tokens in (1, 16, 64, 256, 4096):
        mx = _pick(rows, op="fused_moe", case="gpt-oss-120b", tokens=tokens, impl="atom-triton mxfp4")
        bf16 = _time(rows, op="fused_moe", case="gpt-oss-120b", tokens=tokens, impl="atom-triton bf16")
        if mx:
            out.append(f"| fused MoE, MXFP4 experts | gpt-oss-120b E=128 top-4 H=I=2880, T={tokens} | {_us(mx['us'])} | "
                       f"same kernel, bf16 experts {_us(bf16)} | {_us(mx['floor_us'])} | {mx['x_floor']:.2f} |")
    return out


E2E_HOSTS = {"vllm": "vLLM", "sglang": "SGLang"}  # report key -> name


def _e2e_runs(host: str) -> list[tuple[str, dict]]:
    """(file name, report) of the ``python -m atom_tools.e2e.<host>`` reports: all of the newest run folder (H200 or
    H100) holding one, then from older folders the models (model, weight format) no newer folder measured, newest
    first."""
    runs, seen = [], set()
    folders = [*RESULTS.glob("*-h200"), *RESULTS.glob("*-h100")]
    for folder in sorted(folders, key=lambda f: f.name, reverse=True):
        found = set()
        for path in sorted(folder.glob("*.json")):
            for data in _documents(path):
                if "models" not in data or host not in data:
                    continue
                models = [e for e in data["models"] if (e["model"], e.get("format", "bf16")) not in seen]
                found |= {(e["model"], e.get("format", "bf16")) for e in models}
                if models:
                    runs.append((f"{folder.name}/{path.name}", {**data, "models": models}))
        seen |= found
    return runs


def _agreement(entry: dict) -> str:
    a = entry.get("agreement")
    if not a:
        return ""
    return (f"{a['identical_greedy']}/{a['prompts']} identical, first divergence at {a['mean_first_divergence']:.0f}"
            f"; prompt log-prob mean / max abs diff {a['prompt_logprob_mean_abs_diff']:.3f} / "
            f"{a['prompt_logprob_max_abs_diff']:.2f}")


def e2e_table(host: str) -> str:
    """ATOM's class against the host's own, end to end (``atom_tools.e2e.<host>`` reports under bench/results)."""
    name_of = E2E_HOSTS[host]
    out = [f"| model (layers, weights) | batch | {name_of}'s class tok/s (min-max) | ATOM's class tok/s (min-max) | "
           f"ATOM / {name_of} | TPOT ms {name_of} / ATOM | TTFT ms {name_of} / ATOM | start-up s {name_of} / ATOM "
           "| greedy agreement (fixed prompts) | run |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    starts, others = [], []
    runs = _e2e_runs(host)
    for name, report in runs:
        for entry in report["models"]:
            impls = entry["impls"]
            label = f"{entry['model']} ({entry['layers']}, {entry.get('format', 'bf16')})"
            if set(impls) != {host, "atom"}:  # other engines: all of them against the run's first, below
                timed = [impl for impl, r in impls.items() if r["batches"]]
                others += _engines_rows(label, name, report, entry) if timed else []
                starts += [f"{label}: {impl} started in {r['startup_s']} s ({name})"
                           for impl, r in impls.items() if impl not in timed]
                if not {host, "atom"} <= set(timed):
                    continue
            v, a = impls[host], impls["atom"]
            tree = report.get("atom_commit") or report.get("note", "")
            for i, batch in enumerate(sorted(a["batches"], key=int)):
                if batch not in v["batches"]:
                    continue
                bv, ba = v["batches"][batch], a["batches"][batch]
                tv, ta = bv["output_tok_per_s"], ba["output_tok_per_s"]
                out.append(f"| {label} | {batch} | {tv['median']:.0f} ({tv['min']:.0f}-"
                           f"{tv['max']:.0f}) | {ta['median']:.0f} ({ta['min']:.0f}-{ta['max']:.0f}) | "
                           f"**{ta['median'] / tv['median']:.2f}** | {bv['tpot_ms']['median']:.2f} / "
                           f"{ba['tpot_ms']['median']:.2f} | {bv['ttft_ms']['median']:.0f} / {ba['ttft_ms']['median']:.0f}"
                           f" | {v['startup_s']} / {a['startup_s']} | {_agreement(entry) if i == 0 else ''} "
                           f"| `{name}` ({tree}) |")
    if len(out) == 2 and not others and not starts:
        return f"_No end-to-end {name_of} GPU results committed yet._"
    first = runs[0][1]
    batched = first["settings"].get("max_num_batched_tokens")
    head = (f"Newest run: {first['gpu']}, {name_of} {first[host]}, torch {first['torch']}, {first['date'][:10]}; bf16 "
            f"activations, prompt {first['settings']['prompt_len']} / output {first['settings']['output_len']} tokens, "
            f"`ignore_eos`{f', max_num_batched_tokens {batched}' if batched else ''}; tokens/s: median of the repeated "
            "runs (min-max) in each file; each row's run folder names its card (h100, h200), and ratios are taken "
            "within one run.")
    engines_table = ["", "Other engine sets (`IMPL@BACKEND`: the host's attention backend; ratios against the first "
                     "engine of the run):", "", "| model (layers, weights) | batch | engine | tok/s (min-max) | vs first "
                     "| TPOT ms | TTFT ms | start-up s | run |", "|---|---|---|---|---|---|---|---|---|", *others]
    parts = [head, *(["", *out] if len(out) > 2 else []), *(engines_table if others else [])]
    if starts:
        parts += ["", "Servers or engines that started but were not timed (the run stopped before its timed runs):",
                  "", *(f"- {s}" for s in starts)]
    return "\n".join(parts)


def _engines_rows(label: str, name: str, report: dict, entry: dict) -> list[str]:
    """Rows of a run whose engines are not the vLLM / ATOM pair (attention backends, one implementation)."""
    impls = entry["impls"]
    first = next(iter(impls))
    tree = report.get("atom_commit") or report.get("note", "")
    rows = []
    for batch in sorted(impls[first]["batches"], key=int):
        base = impls[first]["batches"][batch]["output_tok_per_s"]["median"]
        for impl, r in impls.items():
            row = r["batches"].get(batch)
            if row is None:
                continue
            t = row["output_tok_per_s"]
            rows.append(f"| {label} | {batch} | {impl} | {t['median']:.0f} ({t['min']:.0f}-{t['max']:.0f}) | "
                        f"{t['median'] / base:.2f} | {row['tpot_ms']['median']:.2f} | {row['ttft_ms']['median']:.0f} | "
                        f"{r['startup_s']} | `{name}` ({tree}) |")
    return rows


def sglang_table(pins: dict) -> str:
    body = pins["sglang"]
    rows = [
        "| SGLang | Python | torch | transformers | checked in CI (CPU, light install of the release) |",
        "|---|---|---|---|---|",
    ]
    for version in sorted(body["versions"], key=release_key, reverse=True):
        v = body["versions"][version]
        ci = (f"`nox -s sglang-{version}`: {body['checks']}" if v.get("ci")
              else f"not in CI (inside the supported range){'; ' + v['checked'] if v.get('checked') else ''}")
        rows.append(f"| {version} | {v.get('python', '')} | {v.get('torch', '')} | {v.get('transformers', '')} | {ci} |")
    rows += ["", f"`atom-sglang` accepts SGLang `{body['supported']}`; its plugin refuses any other version with an error."]
    return "\n".join(rows)


def _distribution(package: str) -> tuple[str, dict[str, str]]:
    """A package's version (its ``__version__``, what hatch reads) and its requirements as ``{name: range}``."""
    project_dir = ROOT / "packages" / package
    pyproject = tomllib.loads((project_dir / "pyproject.toml").read_text())
    init = (project_dir / pyproject["tool"]["hatch"]["version"]["path"]).read_text()
    version = re.search(r'^__version__ = "([^"]+)"$', init, re.M).group(1)
    requires = {}
    for requirement in pyproject["project"]["dependencies"]:
        name, spec = re.match(r"([A-Za-z0-9_.-]+)\s*([^;]*)", requirement).groups()
        requires[name] = spec.strip() or "any"
    return version, requires


def releases_table(pins: dict) -> str:
    """Which version of each distribution works with which of the one below it and with which host."""
    sglang = pins["sglang"]
    tested_sglang = ", ".join(v for v in sorted(sglang["versions"], key=release_key) if sglang["versions"][v].get("ci"))
    by_distribution: dict[str, list[str]] = {}
    for e in sorted((e for e in pins["vllm"] if e.get("ci", True)), key=lambda e: release_key(e["version"])):
        by_distribution.setdefault(e["distribution"], []).append(e["version"])
    tested_vllm = "; ".join(f"{d} {', '.join(v)}" for d, v in sorted(by_distribution.items()))
    core = pins["core"]
    hosts = {
        "atom-vllm": f"vLLM `{vllm_supported(pins)}` (CI: {tested_vllm})",
        "atom-sglang": f"SGLang `{sglang['supported']}` (CI: {tested_sglang})",
        "atom-core": f"transformers `{{transformers}}` (CI: {core['transformers']})",
        "atom-kernels": f"torch `{{torch}}` (CI: {core['torch']}; Triton {core['triton']})",
    }
    lines = ["| distribution | version | requires (ATOM) | works with |", "|---|---|---|---|"]
    for package in ("atom-vllm", "atom-sglang", "atom-core", "atom-kernels"):
        version, requires = _distribution(package)
        atom = ", ".join(f"{name} `{spec}`" for name, spec in requires.items() if name.startswith("atom-")) or "—"
        lines.append(f"| `{package}` | {version} | {atom} | {hosts[package].format(**requires)} |")
    return "\n".join(lines)


def takeover_table(pins: dict) -> str:
    """atom_core.takeover.MEASURED: where ATOM's class takes over by default, and the results behind each row."""
    lines = ["| host | platform | architecture | by default | ATOM / host's own (output tokens/s) | measured |",
             "|---|---|---|---|---|---|"]
    for m in takeover.MEASURED:
        arch = "every architecture" if m.arch == takeover.EVERY else f"`{m.arch}`"
        serves = "ATOM's class" if m.atom_wins else "the host's own class"
        ratio = f"{m.ratio:.2f}"
        source = f"[{m.results}]({m.results})" if m.results.startswith("bench/") else m.results
        lines.append(f"| {takeover.HOSTS[m.host]} | {takeover.platform_name(m.platform)} | {arch} | {serves} | {ratio} | "
                     f"{m.detail}; {source} |")
    return "\n".join(lines)


TABLES: dict[str, Callable[[dict], str]] = {
    "takeover": takeover_table,
    "models": models_table, "core-pins": core_pins_table, "vllm": vllm_table, "h200": h200_table,
    "vllm-e2e": lambda pins: e2e_table("vllm"), "sglang-e2e": lambda pins: e2e_table("sglang"),
    "sglang": sglang_table, "releases": releases_table,
}


# ---- the adapters' _pins.py: what each ships of ci/pins.toml -------------------------------------------------
def _module(section: str, body: str) -> str:
    return f'"""Generated from ci/pins.toml [{section}] by ci/readme_tables.py; do not edit (CI checks it)."""\n\n{body}'


def vllm_pins(pins: dict) -> str:
    fields = ("distribution", "version", "torch", "transformers")
    rows = "".join(f"    {{{', '.join(f'{f!r}: {e[f]!r}' for f in fields)},\n     'checks': {tuple(e.get('checks', ()))!r}, "
                   f"'serve': {e['serve']!r}}},\n" for e in pins["vllm"])
    return _module("vllm", f"TESTED = (\n{rows})\n")


def sglang_pins(pins: dict) -> str:
    body = pins["sglang"]
    tested = tuple(v for v in sorted(body["versions"], key=release_key) if body["versions"][v].get("ci"))
    releases = tuple(sorted(body["versions"], key=release_key))
    return _module("sglang", f"SUPPORTED = {body['supported']!r}\nTESTED = {tested!r}\nRELEASES = {releases!r}\n")


MODULES: dict[str, Callable[[dict], str]] = {
    "packages/atom-vllm/src/atom_vllm/_pins.py": vllm_pins,
    "packages/atom-sglang/src/atom_sglang/_pins.py": sglang_pins,
}


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(ROOT.glob("packages/*/README.md"))]


def render(text: str, pins: dict, tables: dict[str, str]) -> tuple[str, set[str]]:
    """``text`` with every generated section it holds rewritten; and the names of those sections."""
    found = set()
    for name, table in tables.items():
        pattern = re.compile(rf"(<!-- BEGIN generated:{re.escape(name)} -->).*?(<!-- END generated:{re.escape(name)} -->)", re.S)
        if pattern.search(text):
            found.add(name)
            text = pattern.sub(lambda m, table=table: f"{m.group(1)}\n{table}\n{m.group(2)}", text)
    return text, found


def wanted_files(pins: dict) -> dict[Path, str]:
    tables = {name: make(pins) for name, make in TABLES.items()}
    out: dict[Path, str] = {ROOT / path: make(pins) for path, make in MODULES.items()}
    placed: set[str] = set()
    for doc in documents():
        text, found = render(doc.read_text(), pins, tables)
        placed |= found
        if found:
            out[doc] = text
    if missing := sorted(set(TABLES) - placed):
        raise SystemExit(f"no document has a generated section for: {', '.join(missing)}")
    return out


def main(argv: list[str]) -> int:
    pins = tomllib.loads((ROOT / "ci" / "pins.toml").read_text())
    stale = []
    for path, wanted in wanted_files(pins).items():
        current = path.read_text() if path.exists() else ""
        if current == wanted:
            continue
        name = str(path.relative_to(ROOT))
        stale.append(name)
        if "--check" in argv:
            sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), wanted.splitlines(True), name, "generated"))
        else:
            path.write_text(wanted)
            print(f"wrote {name}")
    if "--check" in argv:
        if stale:
            print(f"stale: {', '.join(stale)}: run `python ci/readme_tables.py`", file=sys.stderr)
            return 1
        print("generated tables and modules are current")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
