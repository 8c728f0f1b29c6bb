"""Test-only, put on PYTHONPATH by test_lora.py for SGLang's engine processes, what SGLang 0.5.23's engine needs on
this GPU-less machine whatever the model class:

- no host-memory pinning: SGLang's torch-native LoRA backend pins its per-batch tensors, which SGLang's CUDA build of
  torch refuses without an NVIDIA driver (pinning only speeds up host-to-device copies; there is no device);
- SGLang's rotary embedding on its torch path: it takes a CUDA kernel on any platform it does not know as a CPU one,
  and knows the CPU only under SGLANG_USE_CPU_ENGINE=1 (Intel's CPU engine, whose other kernels are not installed),
  so its ``_is_cpu`` is set once the module is imported.  Only SGLang's own classes use it (ATOM's have their own).
"""

import importlib.machinery
import sys

import torch

ROTARY = "sglang.srt.layers.rotary_embedding.base"

if not torch.cuda.is_available():
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self

    def _unpinned(factory):
        def make(*args, **kwargs):
            kwargs.pop("pin_memory", None)
            return factory(*args, **kwargs)

        return make

    for _name in ("tensor", "zeros", "empty", "ones", "full"):
        setattr(torch, _name, _unpinned(getattr(torch, _name)))

    class _RotaryOnCpu:
        """A finder that imports the rotary module as usual, then sets its ``_is_cpu``."""

        @staticmethod
        def find_spec(fullname, path, target=None):
            if fullname != ROTARY:
                return None
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                module._is_cpu = True

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _RotaryOnCpu)
