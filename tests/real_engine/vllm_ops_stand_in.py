"""Device-only stand-in for ``vllm._C_stable_libtorch``, vLLM's compiled custom ops (not carried).

vLLM's CUDA platform imports that extension (78 MB, built for torch 2.13; the lent GPU has torch
2.11), and a few of vLLM's modules ask it at import time what the card supports. This module
answers those questions "not supported", so vLLM falls back to its other paths; every other
``torch.ops._C`` op stays undefined and fails by name if anything calls it. MAGI-2's modules use
torch and Triton, none of these ops. scripts/device-omni-setup installs this file as
``vllm/_C_stable_libtorch.py`` on the device only; gpu_omni_e2e.py records the substitution.
"""

import torch

_lib = torch.library.Library("_C", "FRAGMENT")  # noqa: SLF001 - vLLM's op namespace
UNSUPPORTED = ("cutlass_scaled_mm_supports_block_fp8", "cutlass_scaled_mm_supports_fp8",
               "cutlass_scaled_mm_supports_fp4", "cutlass_group_gemm_supported", "cutlass_sparse_scaled_mm_supported")


def _define(name: str) -> None:
    _lib.define(f"{name}(int cuda_device_capability) -> bool")
    _lib.impl(name, lambda capability: False, "CompositeExplicitAutograd")


for _name in UNSUPPORTED:
    _define(_name)
