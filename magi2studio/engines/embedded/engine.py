"""The embedded engine: upstream's MAGI-2 Preview code at a tiny size, on the CPU.

It never passes for the real model: its name, every manifest and every capability say
"embedded", and its weights are generated (seeded random).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from ... import determinism
from ...errors import Cancelled, InputError
from ...layouts import Layout, check_shape
from ...request import Request
from ...tiers import AUDIO_SAMPLE_RATE, TIERS, Tier, get_tier
from ...timing import StepTimer, active, install_step_hooks
from ..base import Capabilities, Engine, Generation, Progress, ProgressCallback
from .components import STAND_INS
from .tiny import TinyConfig

ENGINE_NAME = "embedded"
_parallel_state: tuple[int, int] | None = None  # (ulysses, cfg) initialized in this process


class EmbeddedEngine(Engine):
    name = ENGINE_NAME

    def __init__(self, checkpoint_root: str | Path | None = None, config: TinyConfig | None = None) -> None:
        self.config = config or TinyConfig()
        self.checkpoint_root = Path(checkpoint_root) if checkpoint_root else None
        self._layout: Layout | None = None
        self._driver = None
        self._components = None
        self._lock = threading.Lock()

    # -- what it can do -----------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        tiers: dict[str, str | None] = {name: None for name in TIERS}
        tiers["1080p"] = "the embedded engine has no refiner stage yet (the 1080p tier's own issue)"
        return Capabilities(
            engine=ENGINE_NAME,
            platform="cpu",
            devices=["cpu"],
            tiers=tiers,
            max_world_size=1,
            default_steps=self.config.default_steps,
            default_refiner_steps=self.config.default_refiner_steps,
            default_compile="eager",
            compile_modes=("eager", "dynamic", "static"),
            notes=[
                "embedded: vLLM-Omni 0.30.0's MAGI-2 transformer, data proxy and sampler at a tiny "
                "config with generated (seeded random) weights; outputs are not the real model's",
                "static/dynamic compile costs about 100 s of Inductor codegen on the first run",
            ],
        )

    def check_layout(self, layout: Layout, tier: Tier) -> list[str]:
        check_shape(layout)
        reason = self.capabilities().tiers.get(tier.name)
        if reason:
            raise InputError("tier", f"{tier.name} cannot run here: {reason}", "pick 272p or 540p")
        if layout.world_size != 1 or layout.ep is not None or layout.offload:
            raise InputError(
                "layout", f"{layout.name} needs {layout.world_size} ranks; the embedded engine runs one process",
                "use sp1-cfg1",
            )
        return []

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def layout(self) -> Layout | None:
        return self._layout

    def start(self, layout: Layout) -> bool:
        global _parallel_state
        with self._lock:
            if self._driver is not None and self._layout == layout:
                return False
            from . import upstream_patches
            from .checkpoint import ensure_checkpoint
            from .components import load_components
            from .driver import EmbeddedDriver

            wanted = (layout.sp, layout.cfg)
            if _parallel_state != wanted:
                if _parallel_state is not None:
                    upstream_patches.destroy_parallel()
                upstream_patches.init_parallel(world_size=layout.world_size, rank=0, port=upstream_patches.free_port(),
                                               ulysses_degree=layout.sp, cfg_parallel_size=layout.cfg)
                _parallel_state = wanted
            install_step_hooks()
            root = ensure_checkpoint(self.config, self.checkpoint_root)
            self._components = load_components(root)
            self._driver = EmbeddedDriver(self._components)
            self._layout = layout
            return True

    def close(self) -> None:
        with self._lock:
            self._driver = None
            self._components = None
            self._layout = None

    # -- a run --------------------------------------------------------------------------------
    def generate(self, request: Request, *, on_progress: ProgressCallback | None = None,
                 cancel: threading.Event | None = None) -> Generation:
        if self._driver is None or self._layout is None:
            raise RuntimeError("start(layout) the engine before generate()")
        from . import upstream_patches

        tier = get_tier(request.tier)
        steps = request.steps or self.config.default_steps
        compile_mode = request.compile or "eager"
        started = time.perf_counter()

        def emit(event: Progress) -> None:
            if on_progress is not None:
                on_progress(event)

        def on_step(stage: str, index: int, total: int) -> None:
            emit(Progress(stage, index, total, time.perf_counter() - started))
            if cancel is not None and cancel.is_set():
                raise Cancelled(f"stopped at the step boundary after {stage} step {index + 1}/{total}")

        with self._lock:
            if cancel is not None and cancel.is_set():
                raise Cancelled("cancelled before the run started")
            self._prepare_compile(compile_mode)
            upstream_patches.set_deterministic(request.deterministic)
            timer = StepTimer(stage="preview", rank=0, on_step=on_step)
            with active(timer):
                out = self._driver.run(request, tier, steps,
                                       on_stage=lambda name: emit(Progress(name, elapsed_s=time.perf_counter() - started)))
        return Generation(
            frames=out.frames,
            audio=out.audio,
            fps=tier.fps,
            sample_rate=AUDIO_SAMPLE_RATE,
            step_records=[r.as_dict() for r in timer.records],
            stage_ms=out.stage_ms,
            resolved={"steps": steps, "compile": compile_mode, "negative_prompt": out.negative_prompt_source,
                      "deterministic": request.deterministic,
                      "deterministic_env": {k: v for k, v in determinism.recorded().items() if v is not None}},
            engine_info=self.info(),
        )

    def _prepare_compile(self, mode: str) -> None:
        transformer = self._components.transformer
        current = getattr(transformer, "_magi2studio_compile", "eager")
        if mode == current:
            return
        if current != "eager":
            raise InputError("compile", f"this engine is already compiled {current}",
                             "restart the engine (change layout or restart the studio) to switch compile mode")
        transformer.compile_regions(fullgraph=True, dynamic=mode == "dynamic",
                                    options={"emulate_precision_casts": True})
        transformer._magi2studio_compile = mode

    def info(self) -> dict:
        components = self._components
        return {
            "name": ENGINE_NAME,
            "embedded": True,
            "real_model": False,
            "upstream": "vllm-omni 0.30.0 MAGI-2 Preview code (Magi2PreviewTransformer, Magi2DataProxy, "
                        "Magi2PreviewSampler, Magi2Qwen35TextEncoder, Magi2TurboVAEDecoder, Magi2AudioDecoder)",
            "stand_ins": STAND_INS,
            "tiny_config": self.config.digest,
            "checkpoint": str(components.root) if components else None,
            "loaded_weights": components.loaded_weights if components else None,
        }
