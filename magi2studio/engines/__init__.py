"""Engines by name. Imports are lazy: validating a request never starts torch."""

from __future__ import annotations

from typing import Any

from ..errors import InputError
from .base import Engine

ENGINE_NAMES = ("embedded", "vllm-omni", "vllm-omni-server")


def import_torchada_first() -> bool:
    """Import torchada before torch where it is installed (it maps CUDA-style calls to MUSA).

    A no-op off MUSA; returns whether torchada was imported.
    """

    try:
        import torchada  # noqa: F401
    except ImportError:
        return False
    return True


def get_engine(name: str = "embedded", **options: Any) -> Engine:
    import_torchada_first()
    if name == "embedded":
        from .embedded import EmbeddedEngine

        return EmbeddedEngine(**options)
    if name == "vllm-omni":
        from .vllm_omni import VllmOmniEngine

        return VllmOmniEngine(**options)
    if name == "vllm-omni-server":
        from .vllm_omni.server import VllmOmniServerEngine

        return VllmOmniServerEngine(**options)
    raise InputError("engine", f"unknown engine {name!r}", f"use one of {', '.join(ENGINE_NAMES)}")
