"""The few things upstream's MAGI-2 code needs to run on a CPU, in one place.

vLLM-Omni 0.30.0 has no CPU platform: ``UnspecifiedOmniPlatform`` reports 0 devices, and
its distributed set-up divides by that count. The sampler needs the CFG-parallel group, so
even one process initializes upstream's distributed environment (gloo on 127.0.0.1).
``tests/embedded/test_upstream_patches.py`` fails loudly if these pinned internals change.
"""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist

PATCHED = ("vllm_omni.platforms.interface.UnspecifiedOmniPlatform.get_device_count",
           "vllm_omni.platforms.interface.UnspecifiedOmniPlatform.set_device")


def apply_cpu_patches() -> None:
    """One CPU "device" per process, and setting it is a no-op. Idempotent."""

    from vllm_omni.platforms.interface import UnspecifiedOmniPlatform

    for name in ("get_device_count", "set_device"):
        if not hasattr(UnspecifiedOmniPlatform, name):
            raise RuntimeError(f"vllm_omni UnspecifiedOmniPlatform has no {name}: the pinned vLLM-Omni changed")
    if getattr(UnspecifiedOmniPlatform, "_magi2studio_patched", False):
        return
    UnspecifiedOmniPlatform.get_device_count = classmethod(lambda cls: 1)
    UnspecifiedOmniPlatform.set_device = classmethod(lambda cls, device: None)
    UnspecifiedOmniPlatform._magi2studio_patched = True


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_parallel(*, world_size: int, rank: int, port: int, ulysses_degree: int, cfg_parallel_size: int,
                  backend: str = "gloo", timeout_s: float = 120.0) -> None:
    """Upstream's distributed environment and MAGI-2 groups for one layout."""

    import datetime

    from vllm_omni.diffusion.distributed import parallel_state

    apply_cpu_patches()
    method = f"tcp://127.0.0.1:{port}"
    dist.init_process_group(backend, init_method=method, world_size=world_size, rank=rank,
                            timeout=datetime.timedelta(seconds=timeout_s))
    parallel_state.init_distributed_environment(world_size=world_size, rank=rank, local_rank=rank,
                                                distributed_init_method=method, backend=backend)
    parallel_state.initialize_model_parallel(cfg_parallel_size=cfg_parallel_size, ulysses_degree=ulysses_degree,
                                             sequence_parallel_size=ulysses_degree, backend=backend)


def destroy_parallel() -> None:
    from vllm_omni.diffusion.distributed import parallel_state

    parallel_state.destroy_model_parallel()
    parallel_state.destroy_distributed_environment()
    if dist.is_initialized():
        dist.destroy_process_group()


def set_deterministic(enabled: bool) -> None:
    """What the MAGI-2 pipeline does at construction (warn-only, process-wide)."""

    torch.use_deterministic_algorithms(enabled, warn_only=True)
