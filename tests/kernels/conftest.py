"""Kernel tests run the Triton kernels under the CPU interpreter.

TRITON_INTERPRET must be set before any Triton kernel is defined; magi2_kernels imports its
Triton modules lazily, so setting it here (conftest import time) is early enough. CUDA is hidden
so vLLM-Omni's own Triton kernel takes the interpreter too (see docs/kernels.md).
"""

from __future__ import annotations

import os
import zlib

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def gen(request) -> torch.Generator:
    """A generator seeded from the test id: fresh inputs per test and parameter set, reproducible."""

    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def poison(monkeypatch):
    """Make torch.empty/empty_like return NaN (floats) or -7 (ints), so unwritten output shows."""

    real_empty, real_empty_like = torch.empty, torch.empty_like

    def fill(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.fill_(float("nan") if tensor.is_floating_point() else -7)

    monkeypatch.setattr(torch, "empty", lambda *a, **k: fill(real_empty(*a, **k)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **k: fill(real_empty_like(*a, **k)))
