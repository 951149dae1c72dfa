"""The embedded engine: upstream's MAGI-2 Preview code at a tiny size, on the CPU.

It never passes for the real model: its name, every manifest and every capability say
"embedded", and which tiny weights ran (seeded random, or a checkpoint folder such as one
``scripts/train_tiny.py`` wrote: see :mod:`.tiny_weights`).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

from ... import determinism
from ...errors import Cancelled, EngineError, InputError
from ...vocabulary.layouts import Layout, check_shape
from ...vocabulary.request import Request, output_size
from ...vocabulary.tiers import AUDIO_SAMPLE_RATE, TIERS, Tier
from ..base import Capabilities, Engine, Generation, Plan, Progress, ProgressCallback, step_timeout_s
from ..live_preview import NewestPreview, decoder_digest, default_every, map_for_decoder, preview_note
from .components import STAND_INS
from .rank import Job, StageStarted, StepFinished
from .pool import RankPool
from .tiny import TinyConfig
from .tiny_weights import RANDOM, TRAINED, TRAINED_SHA256, checkpoint_folder, requested_weights, tree_sha256

log = logging.getLogger(__name__)
ENGINE_NAME = "embedded"
MAX_RANKS = 4  # CPU ranks the embedded engine will start (oversubscribing small machines)
# The studio's first steps and layout here: a first result in about 20 s on a quiet 2-core machine,
# engine start included (docs/studio.md); the engine's own default stays the real model's 100 steps.
DEMO_STEPS = 20
DEMO_LAYOUT = "sp1-cfg1"


class EmbeddedEngine(Engine):
    name = ENGINE_NAME

    def __init__(self, checkpoint_root: str | Path | None = None, config: TinyConfig | None = None, *,
                 rank_timeout_s: float | None = None, weights: str | None = None) -> None:
        self.weights = requested_weights(weights)
        self._weights_folder = checkpoint_folder(self.weights)
        if self._weights_folder is not None:
            from .components import read_tiny_config

            config = read_tiny_config(self._weights_folder)
        self._weights_sha256: str | None = None
        self.config = config or TinyConfig()
        self.checkpoint_root = Path(checkpoint_root) if checkpoint_root else None
        self.rank_timeout_s = rank_timeout_s if rank_timeout_s is not None else step_timeout_s()
        self._layout: Layout | None = None
        self._pool: RankPool | None = None
        self._lock = threading.Lock()
        self._preview_map: tuple[Path | None] | None = None

    # -- what it can do -----------------------------------------------------------------------
    def capabilities(self) -> Capabilities:
        tiers: dict[str, str | None] = {name: None for name in TIERS}
        return Capabilities(
            engine=ENGINE_NAME,
            platform="cpu",
            devices=["cpu"],
            tiers=tiers,
            max_world_size=MAX_RANKS,
            default_steps=self.config.default_steps,
            default_refiner_steps=self.config.default_refiner_steps,
            default_compile="eager",
            compile_modes=("eager", "dynamic", "static"),
            notes=[
                "embedded: vLLM-Omni 0.30.0's MAGI-2 transformer, data proxy and sampler at a tiny "
                f"config with {self.weights_note}; outputs are not the real model's",
                "static/dynamic compile costs about 100 s of Inductor codegen on the first run",
                f"layouts up to {MAX_RANKS} ranks, world 1 included, run as a pool of processes on upstream's "
                "parallel groups (gloo on CPU, NCCL with CUDA; world 1 on the CPU)",
                "1080p: the 540p preview, then a tiny dense refiner DiT with block-window attention "
                f"({self.config.default_refiner_steps} steps by default), decoded to 1920x1088 x 249 frames at 25 fps",
            ],
            demo_steps=DEMO_STEPS,
            demo_layout=DEMO_LAYOUT,
        )

    def check_layout(self, layout: Layout, tier: Tier) -> list[str]:
        check_shape(layout)
        if layout.offload:
            raise InputError("layout", "layerwise offload is a GPU path; the embedded engine keeps weights in memory",
                             "drop -offload")
        if layout.world_size > MAX_RANKS:
            raise InputError("layout", f"{layout.name} needs {layout.world_size} ranks; the embedded engine starts at "
                             f"most {MAX_RANKS} CPU processes", "use sp1-cfg1, sp2-cfg1, sp1-cfg2 or sp2-cfg2")
        if layout.ep is not None and layout.ep != layout.sp:
            raise InputError("layout", f"ep{layout.ep} differs from the Ulysses degree {layout.sp}: vLLM-Omni 0.30.0 "
                             "shards MoE heads over the Ulysses group; an explicit EP degree needs vLLM-Omni #8511",
                             f"drop -ep{layout.ep} (the heads split {layout.sp} ways with sp{layout.sp})")
        heads = {"query heads": self.config.num_attention_heads, "KV groups": self.config.num_query_groups,
                 "MoE heads": self.config.moe_heads}
        if tier.refined:
            heads["refiner KV groups"] = self.config.refiner_num_query_groups
        for what, count in heads.items():
            if count % layout.sp:
                divisors = ", ".join(f"sp{d}" for d in range(1, MAX_RANKS + 1)
                                     if all(c % d == 0 for c in heads.values()))
                raise InputError("layout", f"the tiny config's {count} {what} do not divide by sp{layout.sp}",
                                 f"use {divisors}")
        if tier.refined and layout.vae_patch_parallel(tier) != layout.world_size:
            raise InputError("layout", f"1080p decode needs VAE patch-parallel = world size ({layout.world_size}), "
                             "as on the real model", f"set the VAE patch-parallel size to {layout.world_size}")
        warnings = []
        cores = os.cpu_count() or 1
        if layout.world_size > cores:
            warnings.append(f"{layout.name} starts {layout.world_size} processes on {cores} CPU cores: it "
                            "oversubscribes them, so its step times are communication- and scheduling-bound")
        return warnings

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def layout(self) -> Layout | None:
        return self._layout

    def start(self, layout: Layout, *, cancel: threading.Event | None = None) -> bool:
        """Start the layout's pool (the running one stopped first) unless it runs and is healthy.

        A cancel during the start (Cancelled within the pool's 0.2 s poll) kills the half-started
        ranks rather than letting them finish in the background: the user walked away from this
        layout, the next job may want another, and a start finishing beside it would hold this lock
        and the CPU that job needs. The engine is then left with no layout (the earlier one was
        stopped before this start), so the next job starts its own pool from scratch.
        """

        with self._lock:
            if self._pool is not None and self._pool.alive and self._layout == layout:
                problem = self._pool.health()
                if problem is None:
                    return False
                log.warning("restarting the %s ranks before the run: %s", layout.name, problem)
            if cancel is not None and cancel.is_set():  # before stopping the running pool for nothing
                raise Cancelled("cancelled before the engine started", where="while the engine started")
            self._stop()
            self._pool = RankPool(layout, self.checkpoint(), rank_timeout_s=self.rank_timeout_s, cancel=cancel)
            self._layout = layout
            return True

    def checkpoint(self) -> Path:
        """The checkpoint folder the ranks load: the weights' folder, or the generated one (made once)."""

        if self._weights_folder is not None:
            return self._weights_folder
        from .checkpoint import ensure_checkpoint

        return ensure_checkpoint(self.config, self.checkpoint_root)

    @property
    def weights_note(self) -> str:
        if self.weights == RANDOM:
            return "generated (seeded random) weights"
        if self.weights == TRAINED:
            return "the shipped trained tiny weights"
        return f"the tiny checkpoint folder {self._weights_folder}"

    def weights_record(self) -> tuple[str, str | None]:
        """The weights as a queued job records them (``jobs.runner.engine_weights``): the choice as ``--weights``
        takes it (``trained``, ``random`` or the folder's absolute path) and its tree sha256 (None for random)."""

        info = self._weights_info()
        name = self.weights if self.weights in (RANDOM, TRAINED) else info["weights"]
        return name, info.get("weights_sha256")

    def _weights_info(self) -> dict:
        """What the manifest records about the weights: a folder's tree sha256 (computed once)."""

        if self._weights_folder is None:
            return {"weights": RANDOM}
        if self._weights_sha256 is None:  # the shipped one was checked against its pin at the door
            self._weights_sha256 = TRAINED_SHA256 if self.weights == TRAINED else tree_sha256(self._weights_folder)
        return {"weights": str(self._weights_folder), "weights_sha256": self._weights_sha256}

    def _stop(self) -> None:
        if self._pool is not None:
            self._pool.close()
        self._pool = None
        self._layout = None

    def close(self) -> None:
        with self._lock:
            self._stop()

    # -- a run --------------------------------------------------------------------------------
    def resolve(self, request: Request, tier: Tier, layout: Layout) -> dict:
        """Steps, refiner steps (refined tiers only), output size, compile mode, deterministic."""

        width, height = output_size(request, tier)
        refiner_steps = (request.refiner_steps or self.config.default_refiner_steps) if tier.refined else None
        steps = request.steps or self.config.default_steps
        every = default_every(steps) if request.preview_every is None else request.preview_every
        return {"steps": steps, "refiner_steps": refiner_steps,
                "output_size": f"{width}x{height}", "compile": request.compile or "eager",
                "deterministic": request.deterministic, "preview_every": every}

    def generate(self, plan: Plan, *, on_progress: ProgressCallback | None = None,
                 cancel: threading.Event | None = None) -> Generation:
        """Run the plan on the layout's pool: rank 0's frames and audio, every rank's step times."""

        if self._layout is None:
            raise RuntimeError("start(layout) the engine before generate()")
        started = time.perf_counter()
        if self._preview_map is None:  # the decoder's files do not change while the engine lives
            self._preview_map = (map_for_decoder(decoder_digest(self.checkpoint() / "turbo_vae")),)
        preview_map = self._preview_map[0]

        def on_event(event: StageStarted | StepFinished) -> None:
            if on_progress is None:
                return
            elapsed = time.perf_counter() - started
            if isinstance(event, StageStarted):
                on_progress(Progress(event.name, elapsed_s=elapsed))
            else:
                fresh = newest.take() if event.rank == 0 else None
                on_progress(Progress(event.stage, event.index, event.total, elapsed, preview=fresh))

        with self._lock:
            if cancel is not None and cancel.is_set():
                raise Cancelled("cancelled before the run started", where="before the run started")
            pool = self._pool
            if pool is None or not pool.alive:
                raise EngineError(f"the {self._layout.name} ranks were stopped by an earlier failure; "
                                  "start the engine again")
            preview_dir = tempfile.mkdtemp(prefix="magi2studio-preview-")  # after the refusals: none leaves it
            newest = NewestPreview(preview_dir)
            try:
                job = Job.from_plan(plan, str(preview_map) if preview_map else None, preview_dir)
                result = pool.run(job, on_event, cancel)
            finally:
                shutil.rmtree(preview_dir, ignore_errors=True)
        resolved = _as_run(plan, result.negative_prompt_source)
        resolved["live_preview"] = preview_note(job.preview_every, preview_map)
        return Generation(
            frames=result.frames,
            audio=result.audio,
            fps=plan.tier.fps,
            sample_rate=AUDIO_SAMPLE_RATE,
            step_records=result.step_records,
            stage_ms=result.stage_ms,
            resolved=resolved,
            engine_info={**self.info(), **pool.run_info()},
            latents_sha256=result.latents_sha256,
        )

    def info(self) -> dict:
        pool = self._pool.info() if self._pool is not None else {"checkpoint": None, "loaded_weights": None}
        return {
            "name": ENGINE_NAME,
            "embedded": True,
            "real_model": False,
            "upstream": "vllm-omni 0.30.0 MAGI-2 Preview code (Magi2PreviewTransformer, Magi2DataProxy, "
                        "Magi2PreviewSampler, Magi2Qwen35TextEncoder, Magi2TurboVAEDecoder, Magi2AudioDecoder)",
            "refiner": "ours (vLLM-Omni 0.30.0 has none): upstream's Magi2PreviewTransformer at a dense config "
                       "with magi2studio block-window attention, under upstream's sampler and data proxy",
            "stand_ins": STAND_INS,
            "tiny_config": self.config.digest,
            **self._weights_info(),
            **pool,
        }


def _as_run(plan: Plan, negative_prompt_source: str) -> dict:
    """The plan's resolved settings with what only the run knows, in the manifest's key order."""

    settings = dict(plan.resolved)
    deterministic = settings.pop("deterministic")
    return {**settings, "negative_prompt": negative_prompt_source, "deterministic": deterministic,
            "deterministic_env": {k: v for k, v in determinism.recorded().items() if v is not None},
            **({"layout_invariant_products": determinism.LAYOUT_INVARIANT_PRODUCTS} if deterministic else {})}
