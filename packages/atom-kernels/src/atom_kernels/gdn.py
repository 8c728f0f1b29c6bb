"""Gated DeltaNet (Qwen3-Next / Qwen3.5 linear attention): what the GDN ops share.

Per token t and value head h, in fp32 (value head h reads q/k head ``h // (HV // H)``)::

    g    = -exp(A_log[h]) * softplus(a_t + dt_bias[h])      # softplus with threshold 20
    beta = sigmoid(b_t)
    q̂ = q / sqrt(sum(q²) + 1e-6) * scale;  k̂ = k / sqrt(sum(k²) + 1e-6)   # scale defaults to K**-0.5
    S  = exp(g) * S                                          # S is K x V per value head
    v' = beta * (v - Sᵀ k̂)
    S  = S + k̂ v'ᵀ
    o  = Sᵀ q̂                                                # with the updated state

**State pools.** A host keeps one SSM state per sequence *slot* in a pool tensor of fp32 or bf16, in one
of two layouts, a declared property each host chooses (vLLM keeps V-major):

* ``K_MAJOR`` (``"k_major"``): ``[num_slots, HV, K, V]`` — ``S[slot, h, k, v]``;
* ``V_MAJOR`` (``"v_major"``): ``[num_slots, HV, V, K]`` — the transpose of each head's state.

The conv state of the causal conv1d that precedes the core is a pool ``[num_slots, conv_dim, width - 1]``
(any strides), holding the last ``width - 1`` inputs of each sequence, oldest first.

A negative slot is padding: nothing is read or written for it and its outputs are zero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

K_MAJOR = "k_major"
V_MAJOR = "v_major"
STATE_LAYOUTS = (K_MAJOR, V_MAJOR)
L2NORM_EPS = 1e-6
CHUNK_SIZE = 64


def check_layout(layout: str) -> str:
    if layout not in STATE_LAYOUTS:
        raise ValueError(f"unknown GDN state layout {layout!r}; known: {', '.join(STATE_LAYOUTS)}")
    return layout


def ssm_state_shape(layout: str, num_v_heads: int, head_k_dim: int, head_v_dim: int) -> tuple[int, int, int]:
    """Per-slot SSM state shape in ``layout``."""
    if check_layout(layout) == K_MAJOR:
        return (num_v_heads, head_k_dim, head_v_dim)
    return (num_v_heads, head_v_dim, head_k_dim)


def state_strides(state: torch.Tensor, layout: str) -> tuple[int, int, int, int]:
    """(slot, head, k, v) element strides of a pool in ``layout``."""
    if check_layout(layout) == K_MAJOR:
        return state.stride(0), state.stride(1), state.stride(2), state.stride(3)
    return state.stride(0), state.stride(1), state.stride(3), state.stride(2)


# ------------------------------------------------------------------------------------------- math
def gating(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor):
    """``(g, beta)`` in fp32 from the raw projections ``a``, ``b`` ``[..., HV]``."""
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float())
    return g, torch.sigmoid(b.float())


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def prepare_qk(q: torch.Tensor, k: torch.Tensor, num_v_heads: int, scale: float, use_qk_l2norm: bool):
    """fp32 q̂ (scaled) and k̂ ``[T, HV, K]``, q/k heads repeated for their value heads."""
    groups = num_v_heads // q.shape[1]
    qf, kf = q.float(), k.float()
    if use_qk_l2norm:
        qf, kf = l2norm(qf), l2norm(kf)
    qf = qf * scale
    return qf.repeat_interleave(groups, dim=1), kf.repeat_interleave(groups, dim=1)


def recurrent_step(S: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                   beta: torch.Tensor):
    """One token for every value head: ``S [HV, K, V]``, ``q k [HV, K]``, ``v [HV, V]``, ``g beta [HV]``."""
    S = S * torch.exp(g)[:, None, None]
    v_new = beta[:, None] * (v - torch.einsum("hkv,hk->hv", S, k))
    S = S + k[:, :, None] * v_new[:, None, :]
    return S, torch.einsum("hkv,hk->hv", S, q)


def read_state(pool: torch.Tensor, slot: int, layout: str) -> torch.Tensor:
    """One slot's state as fp32 ``[HV, K, V]``."""
    s = pool[slot].float()
    return s if check_layout(layout) == K_MAJOR else s.transpose(-1, -2)


def write_state(pool: torch.Tensor, slot: int, state: torch.Tensor, layout: str) -> None:
    s = state if check_layout(layout) == K_MAJOR else state.transpose(-1, -2)
    pool[slot] = s.to(pool.dtype)


def default_scale(head_k_dim: int, scale: float | None) -> float:
    return head_k_dim**-0.5 if scale is None else float(scale)


def check_gdn_shapes(op: str, q, k, v, a, b, A_log, dt_bias, ssm_state, layout: str) -> None:
    """Shape checks shared by the GDN ops; errors name the op and tensor."""
    if q.dim() != 3 or k.shape != q.shape:
        raise ValueError(f"{op}: q and k must be [T, H, K] and equal, got {tuple(q.shape)} and {tuple(k.shape)}")
    T, H, K = q.shape
    if v.dim() != 3 or v.shape[0] != T:
        raise ValueError(f"{op}: v must be [T, HV, V] with T={T}, got {tuple(v.shape)}")
    HV, V = v.shape[1], v.shape[2]
    if HV % H:
        raise ValueError(f"{op}: value heads HV={HV} must be a multiple of q/k heads H={H}")
    for name, t in (("a", a), ("b", b)):
        if tuple(t.shape) != (T, HV):
            raise ValueError(f"{op}: {name} must be [T, HV] = {(T, HV)}, got {tuple(t.shape)}")
    for name, t in (("A_log", A_log), ("dt_bias", dt_bias)):
        if tuple(t.shape) != (HV,):
            raise ValueError(f"{op}: {name} must be [HV] = {(HV,)}, got {tuple(t.shape)}")
    expected = ssm_state_shape(layout, HV, K, V)
    if ssm_state.dim() != 4 or tuple(ssm_state.shape[1:]) != expected:
        raise ValueError(f"{op}: ssm_state must be [slots, {', '.join(map(str, expected))}] ({layout}), "
                         f"got {tuple(ssm_state.shape)}")


def warm_up_sequence_counts(num_v_heads: int, limit: int = 4096) -> tuple[int, ...]:
    """The fewest sequences of each combination of the GDN Triton kernels' launch classes (the chunked prefill's
    and the fused recurrent decode's, which pick configs by ``(sequences, value heads)``): a host that runs one
    step of ``n`` decode and ``n`` prefill sequences for each ``n`` here has compiled every variant serving can
    reach (sizes and slot offsets are not specialized), so no request pays for a compile."""
    from atom_kernels.ops.chunk_gated_delta_rule.triton import shape_class as prefill_class
    from atom_kernels.ops.fused_recurrent_gated_delta_rule.triton import shape_class as decode_class

    first: dict[tuple[str, str], int] = {}
    for n in range(1, limit + 1):
        first.setdefault((prefill_class(n, num_v_heads), decode_class(n, num_v_heads)), n)
    return tuple(sorted(first.values()))
