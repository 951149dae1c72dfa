"""The embedded engine (upstream MAGI-2 code, tiny config, generated weights, CPU)."""

from .engine import EmbeddedEngine

__all__ = ["EmbeddedEngine"]
