"""The package's one platform object, as vLLM's ``current_platform``.

Every platform question in magi2studio (which accelerator, which collective backend for rank
pools, what doctor reports, what the vllm-omni engine records) asks :data:`current_platform`.
The kernel path and launch configuration come from :mod:`magi2_kernels.platform`, which stays
importable without this package.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from magi2_kernels.platform import Platform as KernelPlatform


class Platform:
    """This process's platform, detected once on first use."""

    @functools.cached_property
    def report(self) -> dict[str, Any]:
        """MUSA (torchada / torch_musa), CUDA or CPU, with each device's name and memory.

        Defensive, as doctor needs: a broken torchada, torch_musa or torch is a finding here
        (``platform: unknown`` with a ``problem``), never a crash.
        """

        # In the musa image a .pth line imports torchada at interpreter start (image/install.sh).
        info: dict[str, Any] = {"torchada": None, "torchada_first": "torchada" in sys.modules, "torch_musa": None}
        info["torchada"] = _try_import("torchada")
        try:
            import torch
        except Exception as err:  # noqa: BLE001
            return {**info, "platform": "unknown", "devices": [], "problem": f"torch does not import: {err}"}
        info["torch_musa"] = _try_import("torch_musa")
        musa = getattr(torch, "musa", None)
        if getattr(torch.version, "musa", None) and musa is not None and musa.is_available():
            devices = [_device(musa, i) for i in range(musa.device_count())]
            return {**info, "platform": "musa", "musa_version": str(torch.version.musa), "devices": devices}
        if torch.cuda.is_available():
            devices = [_device(torch.cuda, i) for i in range(torch.cuda.device_count())]
            return {**info, "platform": "cuda", "cuda_version": torch.version.cuda, "devices": devices}
        return {**info, "platform": "cpu", "devices": [{"name": "cpu", "cores": os.cpu_count(),
                                                         "memory_gib": _host_memory_gib()}]}

    @property
    def name(self) -> str:
        """``musa``, ``cuda`` or ``cpu`` (``unknown`` where torch does not import)."""

        return self.report["platform"]

    @property
    def dist_backend(self) -> str:
        """The torch.distributed backend of rank pools: NCCL on a GPU, gloo on the CPU.

        Under torchada a MUSA process sees CUDA, and its ``nccl`` runs on MCCL.
        """

        import torch

        return "nccl" if torch.cuda.is_available() else "gloo"

    @property
    def kernels(self) -> KernelPlatform:
        """The kernels' platform (:class:`magi2_kernels.platform.Platform`): kernel path and launch configs."""

        from magi2_kernels.platform import current_platform as kernel_platform

        return kernel_platform()


def _try_import(module: str) -> str | None:
    """``imported``, the import error as a finding, or None where the module is not installed."""

    if importlib.util.find_spec(module) is None:
        return None
    try:
        importlib.import_module(module)
    except Exception as err:  # noqa: BLE001 - a broken torchada is a finding, not a crash
        return f"import failed: {err.__class__.__name__}: {err}"
    return "imported"


def _device(backend: Any, index: int) -> dict[str, Any]:
    props = backend.get_device_properties(index)
    return {"index": index, "name": props.name, "memory_gib": round(props.total_memory / 2**30, 1)}


def _host_memory_gib() -> float | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            kib = int(next(line for line in handle if line.startswith("MemTotal")).split()[1])
        return round(kib / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        return None


current_platform = Platform()
