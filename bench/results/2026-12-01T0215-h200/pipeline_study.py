"""Timing-only study of the MXFP4 ring kernel (README.md here): GEXP=gexp.py python pipeline_study.py '[{}, {"natx": true}]'."""
import importlib.util as IU
import itertools
import json
import os
import sys

import torch

from atom_kernels import formats
from atom_kernels.bench.timing import measure
from atom_kernels.ops.mxfp4_mm import triton_small_m as T

sp = IU.spec_from_file_location("gexp", os.environ.get("GEXP", "gexp.py"))  # gluon_small_m.py + pipeline-study.patch
G = IU.module_from_spec(sp)
sp.loader.exec_module(G)
n = k = int(os.environ.get("NK", 8192))
dev = torch.device("cuda")
w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02
wp, ws = formats.quantize_mxfp4(w)
pairs = [(wp, ws)] + [(wp.clone(), ws.clone()) for _ in range(3)]
rows = []
variants = json.loads(sys.argv[1]) if len(sys.argv) > 1 else [{}, {"cheap": True}, {"natx": True}, {"cheap": True, "natx": True}]
for m in (1, 16):
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    ref = x.float() @ formats.dequantize_mxfp4(wp, ws).t()
    for v in variants:
        cfg = {key: val for key, val in v.items() if key not in ("cheap", "natx")}
        p = T.plan(m, n, k, dev, cfg)
        out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        wsp = torch.empty(p["split"], m, n, device=dev, dtype=torch.float32)
        locks = T._locks(dev, p["tiles"])
        cyc = itertools.cycle(pairs)
        def fn(x=x, out=out, wsp=wsp, locks=locks, p=p, v=v, cyc=cyc):
            b, s = next(cyc)
            G.launch_ring(x, b, s, out, wsp, locks, None, p, T._SHIFT, cheap=v.get("cheap", False),
                          natx=v.get("natx", False))

        fn()
        torch.cuda.synchronize()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        t = measure(fn)
        rows.append(dict(m=m, variant=v, split=p["split"], us=t["us"], rel_err=err))
        print(f"M={m:2d} {json.dumps(v):60s} split={p['split']} {t['us']:7.2f} us err={err:.2e}", flush=True)
out = os.environ.get("OUT", "/tmp")
json.dump(rows, open(os.path.join(out, "exp.json"), "w"), indent=1)
