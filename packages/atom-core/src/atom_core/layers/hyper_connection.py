"""Manifold-constrained hyper-connections (DeepSeek-V4): the residual stream is ``n`` parallel streams
``h [T, n, H]``; around each block (attention or MLP) one small projection of the normalised streams gives

    pre  = sigmoid(a_pre  · s_pre  + b_pre) + eps           [T, n]      collapse: x = Σ_i pre_i h_i   (the block's input)
    post = 2 sigmoid(a_post · s_post + b_post)              [T, n]      expand:   the block's output y goes to stream i as post_i y
    comb = sinkhorn(softmax(a_comb · s_comb + b_comb) + eps) [T, n, n]  mix:      h'_k = post_k y + Σ_j comb_jk h_j

with ``a = rmsnorm(flatten(h)) Wᵀ`` (fp32, W ``[(2 + n) n, n H]``) and ``sinkhorn`` alternately normalising
columns and rows ``iters`` times (first columns, ending with columns), so ``comb`` is nearly doubly stochastic.
The head collapses the streams once more before the final norm: ``pre`` alone, from its own ``W [n, n H]``.
All in fp32 as transformers computes them; the collapsed input is returned in the streams' dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from atom_core.layers.params import make_param


def unweighted_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x / rms(x)`` over the last dim (no weight), rms in fp32, out in x's dtype."""
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)


class HyperConnection(nn.Module):
    """``forward(h [T, n, H]) -> (post [T, n], comb [T, n, n], x [T, H])`` (see the module docstring)."""

    def __init__(self, streams: int, hidden_size: int, *, sinkhorn_iters: int, eps: float, norm_eps: float):
        super().__init__()
        self.streams, self.sinkhorn_iters, self.eps, self.norm_eps = streams, sinkhorn_iters, eps, norm_eps
        self.fn = make_param(((2 + streams) * streams, streams * hidden_size), torch.float32)
        self.base = make_param(((2 + streams) * streams,), torch.float32)
        self.scale = make_param((3,), torch.float32)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        n = self.streams
        mixes = F.linear(unweighted_rms_norm(h.flatten(1).float(), self.norm_eps), self.fn)
        a_pre, a_post, a_comb = mixes.split([n, n, n * n], dim=-1)
        b_pre, b_post, b_comb = self.base.split([n, n, n * n])
        s_pre, s_post, s_comb = self.scale.unbind(0)
        pre = torch.sigmoid(a_pre * s_pre + b_pre) + self.eps
        post = 2 * torch.sigmoid(a_post * s_post + b_post)
        comb = torch.softmax((a_comb * s_comb + b_comb).view(-1, n, n), dim=-1) + self.eps
        comb = comb / (comb.sum(dim=-2, keepdim=True) + self.eps)
        for _ in range(self.sinkhorn_iters - 1):
            comb = comb / (comb.sum(dim=-1, keepdim=True) + self.eps)
            comb = comb / (comb.sum(dim=-2, keepdim=True) + self.eps)
        x = (pre.unsqueeze(-1) * h).sum(dim=1).to(h.dtype)
        return post, comb, x

    @staticmethod
    def merge(h: torch.Tensor, y: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
        """The streams after a block: ``h'_k = post_k y + Σ_j comb_jk h_j``."""
        dtype = h.dtype
        return post.to(dtype).unsqueeze(-1) * y.unsqueeze(1) + torch.matmul(comb.to(dtype).transpose(-1, -2), h)


class HyperHead(nn.Module):
    """``forward(h [T, n, H]) -> [T, H]``: the streams collapsed by ``pre`` of the head's own projection."""

    def __init__(self, streams: int, hidden_size: int, *, eps: float, norm_eps: float):
        super().__init__()
        self.eps, self.norm_eps = eps, norm_eps
        self.hc_fn = make_param((streams, streams * hidden_size), torch.float32)
        self.hc_base = make_param((streams,), torch.float32)
        self.hc_scale = make_param((1,), torch.float32)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        mixes = F.linear(unweighted_rms_norm(h.flatten(1).float(), self.norm_eps), self.hc_fn)
        pre = torch.sigmoid(mixes * self.hc_scale + self.hc_base) + self.eps
        return (pre.unsqueeze(-1) * h).sum(dim=1).to(h.dtype)
