"""The engine interface: what the CLI, the studio and reproduction drive, whatever runs below.

Two engines implement it: ``embedded`` (upstream's MAGI-2 code at a tiny configuration,
CPU, tiny trained or seeded weights) and ``vllm-omni`` (the real pipeline on MUSA/CUDA GPUs). Engines
return arrays; :mod:`magi2studio.run_folder.runs` turns them into a run folder the same way for both.
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import numpy as np

from ..vocabulary.layouts import Layout
from ..vocabulary.request import RANDOM_SEED, Request
from ..vocabulary.tiers import TIERS, Tier, get_tier

@dataclass(frozen=True)
class Plan:
    """One request checked once for one engine and layout: its tier, settings and warnings.

    :meth:`Engine.plan` makes it at the door (CLI, studio form, reproduce); what runs it
    (``runs.execute_plan``, the studio's slot, ``Engine.generate``) does not check or resolve
    again. ``resolved`` holds the engine's defaults filled in (steps, compile, ...), read-only,
    as the manifest's ``resolved`` records them.
    """

    request: Request
    tier: Tier
    layout: Layout
    resolved: Mapping[str, Any]
    warnings: tuple[str, ...] = ()

    def with_seed_drawn(self) -> Plan:
        """This plan, its manifest recording that seed -1 was asked and the request's seed was drawn."""
        return replace(self, resolved=MappingProxyType({**self.resolved, "seed_asked": RANDOM_SEED}))


@dataclass(frozen=True)
class Progress:
    """One event from the engine: a stage starting, or a denoising step finished.

    ``step`` is the 0-based index of the step just finished, out of ``total``.
    """

    stage: str
    step: int | None = None
    total: int | None = None
    elapsed_s: float = 0.0
    message: str = ""
    preview: str | None = None  # the newest live preview picture (a GIF file), when one was written


@dataclass
class Capabilities:
    """What an engine can run here, and why not where it cannot (shown greyed out)."""

    engine: str
    platform: str
    devices: list[str]
    tiers: dict[str, str | None]  # tier -> None when runnable, else the reason
    max_world_size: int
    default_steps: int
    default_refiner_steps: int
    default_compile: str
    compile_modes: tuple[str, ...]
    notes: list[str] = field(default_factory=list)
    # The studio form's first steps and layout where the engine's defaults (the real model's) suit a GPU run,
    # not a first look on a CPU; None: the form starts from the engine's defaults.
    demo_steps: int | None = None
    demo_layout: str | None = None


@dataclass
class Generation:
    """An engine's output for one request, before it becomes a run folder."""

    frames: np.ndarray  # uint8 [F, H, W, 3]
    audio: np.ndarray  # float32 [samples, channels] at 44.1 kHz
    fps: float
    sample_rate: int
    step_records: list[dict[str, Any]]  # {"rank", "stage", "step", "ms"}
    stage_ms: dict[str, float]
    resolved: dict[str, Any]  # the plan's resolved settings, with what only the run knows
    engine_info: dict[str, Any]  # name, embedded or not, components, configs, kernels
    latents_sha256: str | None = None  # media.latents_sha256, where the engine can read its latents


ProgressCallback = Callable[[Progress], None]

STEP_TIMEOUT_ENV = "MAGI2STUDIO_STEP_TIMEOUT_S"
DEFAULT_STEP_TIMEOUT_S = 600.0  # above a real-model step incl. its first Inductor compile; stages report too


def step_timeout_s() -> float:
    """The step watchdog: seconds a run may go without a step boundary or a stage event.

    Every engine fails the run after this long, kills its ranks (the next run starts fresh
    ones) and so lets the studio's queue move on. ``$MAGI2STUDIO_STEP_TIMEOUT_S`` sets it.
    """

    from ..errors import InputError

    text = os.environ.get(STEP_TIMEOUT_ENV)
    if not text:
        return DEFAULT_STEP_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < 1e7:
        raise InputError(STEP_TIMEOUT_ENV, f"{text!r} is not a number of seconds", "set it to e.g. 300, or unset it")
    return value


class Engine(ABC):
    name: str

    @abstractmethod
    def capabilities(self) -> Capabilities: ...

    @abstractmethod
    def check_layout(self, layout: Layout, tier: Tier) -> list[str]:
        """Raise InputError if this engine cannot run ``layout`` for ``tier``; return warnings."""

    @abstractmethod
    def resolve(self, request: Request, tier: Tier, layout: Layout) -> dict[str, Any]:
        """The request's engine defaults filled in for ``layout``; raise InputError for what cannot run."""

    def check_request(self, request: Request) -> Tier:
        """The request's tier; raise InputError for what this engine cannot honour in any layout."""
        return get_tier(request.tier)

    def plan(self, request: Request, layout: Layout) -> Plan:
        """The request's tier, layout and engine defaults resolved, once; raises InputError."""
        tier = self.check_request(request)
        warnings = tuple(self.check_layout(layout, tier))
        return Plan(request, tier, layout, MappingProxyType(self.resolve(request, tier, layout)), warnings)

    @abstractmethod
    def start(self, layout: Layout, *, cancel: threading.Event | None = None) -> bool:
        """Make the engine ready for ``layout``; return True if that (re)started it.

        Raises Cancelled (``where`` "while the engine started") if ``cancel`` is set during a start it
        can stop; an engine whose start does no long work may ignore it."""

    def not_ready(self) -> str | None:
        """Why this engine cannot take a job of any tier now, or None when it can take one.

        The default suits an engine whose weights are generated at first use (the embedded one).
        """
        return None

    def tiers_not_ready(self) -> dict[str, str | None]:
        """Per tier, why a job of that tier cannot run now, or None when it can (the studio's /health/ready).

        The default: every tier as the whole engine (``not_ready``); an engine whose tiers need other files
        (the vLLM-Omni engine: 1080p's refiner) answers per tier.
        """
        return dict.fromkeys(TIERS, self.not_ready())

    @property
    @abstractmethod
    def layout(self) -> Layout | None: ...

    @abstractmethod
    def generate(
        self,
        plan: Plan,
        *,
        on_progress: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
    ) -> Generation:
        """Run one plan on the started layout. Raises Cancelled at a step (or stage) boundary."""

    @abstractmethod
    def close(self) -> None: ...
