"""ATOM's GDN layers under SGLang's breakable prefill CUDA graphs (its prefill capture on CUDA, 0.5.17+).

SGLang captures a prefill step of a padded token count once and replays it for every batch of that count or fewer
tokens, whatever its requests: the GDN state step (conv + delta rule, whose launches follow the batch's sequences
and slots) must therefore be an eager break between the captured segments, run again on the replayed batch.  No
CUDA graph is captured on the CPU: :class:`SegmentedCapture` stands for SGLang's capture object, and the replay is
SGLang's recorded break functions called on the capture's buffers, as its ``BreakableCUDAGraph.replay`` calls them
between the segments' graph replays."""

from __future__ import annotations

import contextlib
import importlib
from types import SimpleNamespace

import pytest
import torch
from _sglang_batch import SGLangCPUBatch
from _sglang_env import load_with_sglang
from conftest import checkpoint_or_skip

from atom_sglang import compat

pytestmark = pytest.mark.sglang

ARCH = "Qwen3NextForCausalLM"
CAPTURED = {0: list(range(5, 17)), 1: [7, 300, 41, 9, 12, 80, 23]}  # 19 tokens, two new requests
REPLAYED = {0: [33, 4, 51], 2: [61, 8, 19, 90, 2]}  # 8 tokens: a request continuing from its state, a new one


class SegmentedCapture:
    """What SGLang's eager breaks use of its ``BreakableCUDAGraphCapture``: segment ends and starts, the
    barrier hook, and the graph's list of break functions (replayed in order between segments)."""

    def __init__(self):
        self.segments = 1
        self._barrier_fn = None
        self.cuda_graph = SimpleNamespace(_break_fns=[])

    def _end_current_segment(self) -> None:
        pass

    def _begin_new_segment(self) -> None:
        self.segments += 1


@contextlib.contextmanager
def breakable_capture(monkeypatch):
    package = importlib.import_module(compat.BREAKABLE_GRAPHS)
    graphs = importlib.import_module(f"{compat.BREAKABLE_GRAPHS}.breakable_cuda_graph")
    # 0.5.17 turns every captured tensor argument into a weak reference through a CUDA-only kernel library; the CPU
    # tensors here stay as they are (0.5.23 leaves CPU tensors alone itself)
    monkeypatch.setattr(graphs, "_weak_ref_if_tensor", lambda x: x)
    capture = SegmentedCapture()
    token = graphs._current_capture_var.set(capture)
    try:
        with package.enable_breakable_cuda_graph():
            yield capture
    finally:
        graphs._current_capture_var.reset(token)


def recording_runs(monkeypatch, states) -> list[tuple]:
    """Each GDN layer's ``(state, inputs, output)`` of its ``run`` calls, in call order."""
    calls: list[tuple] = []

    def recording(state):
        def run(*inputs):
            out = type(state).run(state, *inputs)
            calls.append((state, inputs, out))
            return out
        return run

    for state in states:
        monkeypatch.setattr(state, "run", recording(state))
    return calls


def pools(batch: SGLangCPUBatch, states) -> list[torch.Tensor]:
    return [t for s in states for t in (batch.req_pool.mamba2_layer_cache(s.layer_id).conv[0],
                                        batch.req_pool.mamba2_layer_cache(s.layer_id).temporal)]


@torch.inference_mode()
def test_gdn_state_step_is_an_eager_break_replayed_on_the_new_batch(cpu_runtime, tiny_checkpoints, monkeypatch):
    model = load_with_sglang(checkpoint_or_skip(ARCH, tiny_checkpoints))
    states = model.atom_host.linear_attention_states
    batch = SGLangCPUBatch(model, 3)
    calls = recording_runs(monkeypatch, states)

    capture = None

    def capture_run(model, ids, positions, forward_batch):
        nonlocal capture
        with breakable_capture(monkeypatch) as capture:
            return model.forward(ids, positions, forward_batch)

    batch.step(CAPTURED, run=capture_run)
    # one eager break per GDN layer, each ending a captured segment
    assert len(capture.cuda_graph._break_fns) == len(states) and capture.segments == len(states) + 1
    captured = list(calls)
    calls.clear()

    def replay_run(model, ids, positions, forward_batch):
        """The replayed batch eagerly (the reference), then SGLang's replay of the breaks on the captured buffers
        holding this batch's inputs in their first rows and stale values after, from the same states."""
        before = [p.clone() for p in pools(batch, states)]
        out = model.forward(ids, positions, forward_batch)
        eager, after = list(calls), [p.clone() for p in pools(batch, states)]
        for pool, saved in zip(pools(batch, states), before):
            pool.copy_(saved)
        T = ids.shape[0]
        model.atom_host.forward_batch = forward_batch  # as the wrapper's forward around SGLang's graph replay
        try:
            for (state, inputs, _), (_, new_inputs, new_out), replay in zip(captured, eager, capture.cuda_graph._break_fns):
                for buffer, new in zip(inputs, new_inputs):
                    buffer[:T] = new
                    buffer[T:] = torch.randn_like(buffer[T:])
                replay()
                core = next(out for s, _, out in captured if s is state)
                torch.testing.assert_close(core[:T], new_out, rtol=0, atol=1e-6)
                assert not core[T:].any(), "rows past the replayed batch's tokens are padding: zero"
        finally:
            model.atom_host.forward_batch = None
        for pool, expected in zip(pools(batch, states), after):
            torch.testing.assert_close(pool, expected, rtol=0, atol=1e-6)
        return out

    assert sum(map(len, CAPTURED.values())) > sum(map(len, REPLAYED.values()))
    batch.step(REPLAYED, run=replay_run)

