"""Test-only, put on PYTHONPATH by test_lora.py for SGLang's engine processes: with no CUDA device, pinning host
memory is a no-op (SGLang's torch-native LoRA backend pins its per-batch tensors, which SGLang's CUDA build of
torch refuses without an NVIDIA driver; pinning only speeds up host-to-device copies)."""

import torch

if not torch.cuda.is_available():
    torch.Tensor.pin_memory = lambda self, *args, **kwargs: self

    def _unpinned(factory):
        def make(*args, **kwargs):
            kwargs.pop("pin_memory", None)
            return factory(*args, **kwargs)

        return make

    for _name in ("tensor", "zeros", "empty", "ones", "full"):
        setattr(torch, _name, _unpinned(getattr(torch, _name)))
