"""Run 13 of the study (README.md here): correctness and timing of warp-specialized-parts.patch applied to the tree."""
import itertools
import json
import os

import torch

from atom_kernels import formats
from atom_kernels.bench.timing import measure
from atom_kernels.ops.mxfp4_mm import triton_small_m as T

dev = torch.device("cuda")
torch.manual_seed(0)
rows = []
# correctness
for n, k in ((8192, 8192), (1000, 4096), (320, 2048)):
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
    wp, ws = formats.quantize_mxfp4(w)
    ref_w = formats.dequantize_mxfp4(wp, ws).float()
    for m in (1, 3, 8, 9, 16):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        ref = x.float() @ ref_w.t()
        for cfg in ({"parts": 4, "split_k": 1}, {"parts": 2, "split_k": 2}, {"parts": 4, "split_k": 2}, {"parts": 2, "split_k": 1}):
            p = T.plan(m, n, k, dev, cfg)
            ok = T.ring_applies(p, k, x.stride(0), x.data_ptr(), (9, 0))
            out = torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16)
            y = T.mxfp4_mm_small_m(x, wp, ws, config=cfg, out=out)
            err = ((y.float() - ref).norm() / ref.norm()).item()
            rows.append(dict(n=n, k=k, m=m, cfg=cfg, ring=ok, split=p["split"], rel_err=err))
            print(f"n={n} k={k} m={m:2d} {json.dumps(cfg):35s} ring={ok} split={p['split']} err={err:.2e}", flush=True)
# timing
n = k = 8192
w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
wp, ws = formats.quantize_mxfp4(w)
pairs = [(wp, ws)] + [(wp.clone(), ws.clone()) for _ in range(3)]
for m in (1, 16):
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    for cfg in ({}, {"parts": 4, "split_k": 1}, {"parts": 2, "split_k": 2}, {"parts": 4, "split_k": 2},
                {"parts": 2, "split_k": 1}, {"parts": 4, "split_k": 1, "stages": 3}, {}):
        cyc = itertools.cycle(pairs)
        t = measure(lambda x=x, cyc=cyc, cfg=cfg: T.mxfp4_mm_small_m(x, *next(cyc), config=cfg))
        rows.append(dict(m=m, cfg=cfg, us=t["us"]))
        print(f"M={m:2d} {json.dumps(cfg):45s} {t['us']:7.2f} us", flush=True)
json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), "parts.json"), "w"), indent=1)
