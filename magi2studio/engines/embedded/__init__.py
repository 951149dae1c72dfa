"""The embedded engine (upstream MAGI-2 code, tiny config, tiny trained or seeded weights, CPU)."""

from .engine import EmbeddedEngine

__all__ = ["EmbeddedEngine"]
