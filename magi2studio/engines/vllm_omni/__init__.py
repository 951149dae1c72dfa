"""The real engine: vLLM-Omni's MAGI-2 pipeline in a supervised child process."""

from .engine import VllmOmniEngine

__all__ = ["VllmOmniEngine"]
