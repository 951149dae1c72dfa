"""The few things upstream's MAGI-2 code needs to run on a CPU, in one place.

vLLM-Omni 0.30.0 has no CPU platform: ``UnspecifiedOmniPlatform`` reports 0 devices, and
its distributed set-up divides by that count. The sampler needs the CFG-parallel group, so
even one process initializes upstream's distributed environment (gloo on 127.0.0.1).
``tests/requests_and_runs/test_upstream_patches.py`` fails loudly if these pinned internals change.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import sys

import torch
import torch.distributed as dist

from .exact_products import LayoutInvariantProducts

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


@contextlib.contextmanager
def stdout_with_a_descriptor():
    """A ``sys.stdout`` that has a file descriptor, for the duration of the block.

    vLLM's ``GroupCoordinator`` silences C-level output around group creation through
    ``sys.stdout.fileno()``; a captured stdout (pytest's capsys, Jupyter, a redirected studio)
    has none and raises ``io.UnsupportedOperation: fileno``. The process's own stdout, or
    os.devnull, stands in while upstream builds its groups.
    """

    def has_descriptor(stream) -> bool:
        try:
            stream.fileno()
            return True
        except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both of the latter
            return False

    if has_descriptor(sys.stdout):
        yield
        return
    saved = sys.stdout
    stand_in = sys.__stdout__ if sys.__stdout__ is not None and has_descriptor(sys.__stdout__) else None
    opened = None
    if stand_in is None:
        stand_in = opened = open(os.devnull, "w")  # noqa: SIM115 - closed below
    sys.stdout = stand_in
    try:
        yield
    finally:
        sys.stdout = saved
        if opened is not None:
            opened.close()


def init_parallel(*, world_size: int, rank: int, port: int, ulysses_degree: int, cfg_parallel_size: int,
                  backend: str = "gloo", timeout_s: float = 120.0) -> None:
    """Upstream's distributed environment and MAGI-2 groups for one layout; all or nothing.

    A failure part-way releases what was made, so the next start finds no half-built world.
    """

    import datetime

    from vllm_omni.diffusion.distributed import parallel_state

    apply_cpu_patches()
    method = f"tcp://127.0.0.1:{port}"
    dist.init_process_group(backend, init_method=method, world_size=world_size, rank=rank,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        with stdout_with_a_descriptor():
            parallel_state.init_distributed_environment(world_size=world_size, rank=rank, local_rank=rank,
                                                        distributed_init_method=method, backend=backend)
            parallel_state.initialize_model_parallel(cfg_parallel_size=cfg_parallel_size,
                                                     ulysses_degree=ulysses_degree,
                                                     sequence_parallel_size=ulysses_degree, backend=backend)
    except BaseException:
        destroy_parallel()
        raise


def init_world_of_one() -> None:
    """Upstream's world-1 groups for model code run in this process (the trainer, tests of the
    components); :func:`destroy_parallel` releases them. Engines never hold them here: every
    layout's ranks, world 1 included, are processes of their own (``pool.RankPool``)."""

    init_parallel(world_size=1, rank=0, port=free_port(), ulysses_degree=1, cfg_parallel_size=1)


def destroy_parallel() -> None:
    from vllm_omni.diffusion.distributed import parallel_state

    with stdout_with_a_descriptor():
        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()
    if dist.is_initialized():
        dist.destroy_process_group()


_layout_invariant = False


def set_deterministic(enabled: bool) -> None:
    """What the MAGI-2 pipeline does at construction (warn-only, process-wide), and, because a
    deterministic run must not depend on the layout, layout-invariant products while sampling
    (:class:`.exact_products.LayoutInvariantProducts`)."""

    global _layout_invariant
    torch.use_deterministic_algorithms(enabled, warn_only=True)
    _layout_invariant = enabled
    _wrap_sample_once()


def _wrap_sample_once() -> None:
    from vllm_omni.diffusion.models.magi2.sampler_magi2 import Magi2PreviewSampler

    if getattr(Magi2PreviewSampler.sample, "_magi2studio_layout_invariant", False):
        return
    original = Magi2PreviewSampler.sample

    @functools.wraps(original)
    def sample(self, *args, **kwargs):
        with LayoutInvariantProducts() if _layout_invariant else contextlib.nullcontext():
            return original(self, *args, **kwargs)

    sample._magi2studio_layout_invariant = True
    Magi2PreviewSampler.sample = sample


def patch_gloo_uneven_gather() -> None:
    """Let ``parallel.gather_sequence`` gather uneven shards on gloo.

    Upstream splits an odd packed length with ``balanced_split_sizes`` (one extra token on
    early ranks) and gathers with ``dist.all_gather`` into uneven chunks, which NCCL accepts
    and gloo refuses ("ProcessGroupGloo::allgather: invalid tensor size"). On gloo only, each
    shard is zero-padded to the largest, gathered, and trimmed back: the same bytes, moved.
    """

    from vllm_omni.diffusion.models.magi2 import parallel

    if getattr(parallel.gather_sequence, "_magi2studio_gloo", False):
        return
    upstream_gather = parallel.gather_sequence

    def gather_sequence(tensor, split_sizes, group=None):
        group = group or parallel.get_magi2_ulysses_group()
        if group.world_size == 1 or len(set(split_sizes)) == 1:
            return upstream_gather(tensor, split_sizes, group)
        if tensor.shape[0] != split_sizes[group.rank]:
            raise ValueError(f"rank {group.rank} owns {tensor.shape[0]} tokens, expected {split_sizes[group.rank]}")
        longest = max(split_sizes)
        padded = torch.zeros((longest, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        padded[: tensor.shape[0]] = tensor
        chunks = [torch.empty_like(padded) for _ in split_sizes]
        dist.all_gather(chunks, padded, group=group.group)
        return torch.cat([chunk[:size] for chunk, size in zip(chunks, split_sizes)], dim=0)

    gather_sequence._magi2studio_gloo = True
    parallel.gather_sequence = gather_sequence
