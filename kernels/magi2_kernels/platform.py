"""Platform object: which kernel path and launch configuration each platform gets.

The choice is made once from the process's platform (torchada / ``torch.version.musa``,
CUDA availability, ``TRITON_INTERPRET``), never from a tensor's device type: under
torchada a MUSA tensor reports ``is_cuda == True`` on purpose (blog section 3.2).
"""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class GemmConfig:
    """Triton launch configuration of one grouped-GEMM kernel."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    n_per_program: int = 1  # W13 only: n-blocks one program walks (its x tile stays hot)
    pair_dot: bool = False  # W13 only, block_k == d_head: gate and up in one 2*block_n-wide dot

    def fitted(self, k_dim: int, n_dim: int) -> GemmConfig:
        """This config with ``block_k``/``block_n`` halved until they divide ``k_dim``/``n_dim``.

        The tuned blocks are the real model's (d_head 256 and up); a smaller head (the embedded
        engine's tiny MAGI-2 has 64) gets the largest power-of-two block that fits, down to
        Triton's 16-wide dot. Shapes that no block divides stay refused by the launcher.
        """

        def fit(block: int, dim: int) -> int:
            while block > 16 and dim % block:
                block //= 2
            return block

        return replace(self, block_k=fit(self.block_k, k_dim), block_n=fit(self.block_n, n_dim))

    def as_dict(self) -> dict[str, int]:
        return {
            "block_m": self.block_m,
            "block_n": self.block_n,
            "block_k": self.block_k,
            "num_warps": self.num_warps,
            "num_stages": self.num_stages,
            "n_per_program": self.n_per_program,
            "pair_dot": self.pair_dot,
        }


@dataclass(frozen=True)
class Platform:
    """What runs where.

    ``name`` is ``cuda``, ``musa`` or ``cpu``. ``triton`` says whether the Triton kernels
    run (a GPU, or the CPU under ``TRITON_INTERPRET=1``); when it is false the PyTorch
    references run instead. ``atomic_moe`` says whether the atomic MoE scatter may be asked
    for: false on MUSA (no bf16 atomics, blog section 3.1); the default everywhere is the
    deterministic fixed-order combine, which is also the faster one on the H200.
    ``dot_precision`` is the precision of fp32 ``tl.dot`` (routing logits, mHC projection):
    ``tf32x3`` on NVIDIA tensor cores keeps fp32-level error, the interpreter computes in numpy
    fp32 (``ieee``).

    Hopper-only features are flags here, so every other platform (MUSA's Triton 3.2 among them)
    compiles the portable path: ``tma`` streams the MoE weights through tensor descriptors
    (``triton.tools.tensor_descriptor``, Triton >= 3.4), ``fast_sigmoid`` takes SwiGLU7's
    sigmoid through one ``tanh.approx.f32`` and ``fast_reciprocal`` the Sinkhorn's reciprocals
    through one ``rcp.approx.ftz.f32`` (inline PTX, NVIDIA only).
    """

    name: str
    triton: bool
    interpreter: bool
    atomic_moe: bool
    w13: GemmConfig
    w2: GemmConfig
    dot_precision: str
    capability: tuple[int, int] | None = None
    tma: bool = False
    fast_sigmoid: bool = False
    fast_reciprocal: bool = False

    def describe(self) -> dict[str, object]:
        return {
            "name": self.name,
            "triton": self.triton,
            "interpreter": self.interpreter,
            "atomic_moe": self.atomic_moe,
            "w13": self.w13.as_dict(),
            "w2": self.w2.as_dict(),
            "dot_precision": self.dot_precision,
            "capability": self.capability,
            "tma": self.tma,
            "fast_sigmoid": self.fast_sigmoid,
            "fast_reciprocal": self.fast_reciprocal,
        }


# Hopper (H100/H200): chosen by the config sweep in scripts/bench_kernels.py on the lent
# H200, balanced routing (numbers in docs/performance.md, section "Kernels (issue 15)").
# W13 streams 32-wide weight n-blocks through TMA past a resident x tile; each program covers
# all 1280 columns of its row tile (n_per_program 40), so x is gathered once per tile.
HOPPER_W13 = GemmConfig(block_m=128, block_n=32, block_k=256, num_warps=8, num_stages=3, n_per_program=40)
HOPPER_W2 = GemmConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3)
# Other CUDA GPUs: the smaller tiles vLLM-Omni 0.30.0 uses on pre-Blackwell parts.
GENERIC_CUDA_W13 = GemmConfig(block_m=64, block_n=64, block_k=32, num_warps=4, num_stages=3)
GENERIC_CUDA_W2 = GemmConfig(block_m=64, block_n=128, block_k=32, num_warps=4, num_stages=3)
# MUSA: the MUSA report's settings (BLOCK_SIZE_K=64, num_warps=16, num_stages=1; 128x128 tiles), the
# portable path (no TMA, no inline PTX, no atomics) that Moore Threads' Triton 3.2 compiles.
MUSA_W13 = GemmConfig(block_m=128, block_n=128, block_k=64, num_warps=16, num_stages=1)
MUSA_W2 = GemmConfig(block_m=128, block_n=128, block_k=64, num_warps=16, num_stages=1)
# Interpreter: small tiles so CPU tests exercise several tiles and partial blocks.
INTERPRETER_W13 = GemmConfig(block_m=16, block_n=32, block_k=32, num_warps=4, num_stages=1, n_per_program=2)
INTERPRETER_W2 = GemmConfig(block_m=16, block_n=32, block_k=32, num_warps=4, num_stages=1)


def _musa_present() -> bool:
    if importlib.util.find_spec("torchada") is not None:
        import torchada  # noqa: F401  (maps CUDA-style calls onto MUSA when present)
    return getattr(torch.version, "musa", None) is not None


def _tensor_descriptors_present() -> bool:
    """Host-side TMA descriptors (``triton.tools.tensor_descriptor``): Triton >= 3.4."""

    return importlib.util.find_spec("triton.tools.tensor_descriptor") is not None


@functools.cache
def current_platform() -> Platform:
    """The process's platform, detected once."""

    interpreter = os.environ.get("TRITON_INTERPRET", "0") == "1"
    triton_installed = importlib.util.find_spec("triton") is not None
    if _musa_present():
        return Platform("musa", triton_installed, False, False, MUSA_W13, MUSA_W2, "ieee")
    if torch.cuda.is_available() and not interpreter:
        major, minor = torch.cuda.get_device_capability()
        hopper = major == 9
        tma = hopper and triton_installed and _tensor_descriptors_present()
        return Platform(
            "cuda",
            triton_installed,
            False,
            True,
            HOPPER_W13 if hopper else GENERIC_CUDA_W13,
            HOPPER_W2 if hopper else GENERIC_CUDA_W2,
            "tf32x3",
            capability=(major, minor),
            tma=tma,
            fast_sigmoid=True,
            fast_reciprocal=True,
        )
    return Platform("cpu", interpreter and triton_installed, interpreter, True, INTERPRETER_W13, INTERPRETER_W2, "ieee")

