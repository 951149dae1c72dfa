"""Engines by name. Imports are lazy: validating a request never starts torch."""

from __future__ import annotations

from typing import Any

from ..errors import InputError
from .base import Engine

ENGINE_NAMES = ("embedded", "vllm-omni")


def get_engine(name: str = "embedded", **options: Any) -> Engine:
    if name == "embedded":
        from .embedded import EmbeddedEngine

        return EmbeddedEngine(**options)
    if name == "vllm-omni":
        from .vllm_omni import VllmOmniEngine

        return VllmOmniEngine(**options)
    raise InputError("engine", f"unknown engine {name!r}", f"use one of {', '.join(ENGINE_NAMES)}")
