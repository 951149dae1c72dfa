"""magi2studio's optimized MAGI-2 kernels (Triton, with PyTorch references), installed into vLLM-Omni
through :func:`magi2_kernels.overrides.install_overrides`."""

from .platform import Platform, current_platform

__all__ = ["Platform", "current_platform"]
