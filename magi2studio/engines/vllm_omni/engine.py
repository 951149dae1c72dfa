"""``engine: vllm-omni`` behind the common interface.

One child process (:mod:`.process`) owns one ``Omni`` for one set of start options (layout,
VAE patch parallelism, compile flags, deterministic mode); a new layout stops it, and a
request needing other options restarts it. The weights check runs before any start. The per-rank step records come from
the worker plugin through a metrics folder the child passes to its workers by env.

Live preview: the map fitted to the checkpoint's TurboVAE decoder (found by its digest, as the
embedded engine finds it) goes to the workers by env when the child starts; the request's rate
goes into the metrics folder before each request (``write_preview_request``), which rank 0 reads
at the sample's start, so a new rate or "off" never restarts the child. Each progress event
carries the newest picture of ``<metrics>/preview/`` that no earlier event named.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from ... import determinism
from .. import test_checkpoint
from ...errors import InputError
from ...vocabulary.layouts import Layout, rules_for_real_model
from ..live_preview import NewestPreview, decoder_digest, default_every, map_for_decoder, preview_note
from ..metrics_folder import ENV_CANCEL_FILE, ENV_METRICS_DIR, ENV_PREVIEW_MAP, preview_folder, write_preview_request
from ...platform import current_platform
from ...vocabulary.request import Request
from ...vocabulary.tiers import TIERS, Tier
from ...weights import WeightsReport, check_weights, resolve_root
from ..base import Capabilities, Engine, Generation, Plan, Progress, ProgressCallback, step_timeout_s
from .capabilities import detect, tier_refusal
from . import params
from .process import EngineProcess

WORKER_TARGET = "magi2studio.engines.vllm_omni.worker:run_omni"


def device_names() -> list[str]:
    from vllm_omni.platforms import current_omni_platform

    try:
        count = current_omni_platform.get_device_count()
        return [current_omni_platform.get_device_name(i) for i in range(count)]
    except (RuntimeError, AssertionError, NotImplementedError):
        return []


def fresh_engine_dir(work_dir: Path) -> Path:
    """The next unused ``engine-N`` folder: each engine start gets its own steps and logs.

    A second engine (a restarted studio, the next ``generate``) often shares the work folder;
    the first GPU run stopped with FileExistsError on the previous engine's ``engine-1``.
    """

    work_dir.mkdir(parents=True, exist_ok=True)
    number = 1
    while True:
        folder = work_dir / f"engine-{number}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            number += 1


class VllmOmniEngine(Engine):
    name = "vllm-omni"

    def __init__(self, checkpoint_root: str | None = None, work_dir: str | None = None,
                 start_timeout_s: float = 3600.0, request_timeout_s: float = 7200.0,
                 gpu_gib: float | None = None) -> None:
        self.checkpoint_root = str(resolve_root(checkpoint_root))
        self.work_dir = Path(work_dir or tempfile.mkdtemp(prefix="magi2studio-vllm-omni-"))
        self.start_timeout_s = start_timeout_s
        self.request_timeout_s = request_timeout_s
        self.gpu_gib = gpu_gib
        self._process: EngineProcess | None = None
        self._layout: Layout | None = None
        self._options: params.StartOptions | None = None
        self._cancel_file: Path | None = None
        self._metrics_dir: Path | None = None
        self._preview_map: tuple[Path | None] | None = None  # the decoder's files do not change while the engine lives
        self._fresh_load = False

    # What the installed stack can do ---------------------------------------------------
    def capabilities(self) -> Capabilities:
        caps = detect()
        devices = device_names()
        notes = [
            f"vLLM-Omni {caps.vllm_omni_version}: workers {', '.join(map(str, caps.qualified_world_sizes))}"
            + (" or 1 with layerwise offload" if caps.offload_world_size else ""),
            "expert parallel: " + ("accepted" if caps.expert_parallel else f"refused ({caps.expert_parallel_refusal})"),
        ]
        if not caps.guidance_per_request:
            notes.append(f"guidance fixed at video {caps.fixed_video_guidance:g} / audio {caps.fixed_audio_guidance:g}")
        if not caps.negative_prompt_per_request:
            notes.append(f"negative prompt from env {caps.negative_prompt_env}, not per request")
        no_gpu = "no CUDA/MUSA GPU is visible here (vLLM-Omni's MAGI-2 pipeline requires GPUs)"
        return Capabilities(
            engine=self.name, platform=current_platform.name, devices=devices,
            tiers={name: tier_refusal(caps, tier) or (None if devices else no_gpu) for name, tier in TIERS.items()},
            max_world_size=len(devices), default_steps=caps.default_steps, default_refiner_steps=0,
            default_compile=params.DEFAULT_COMPILE, compile_modes=params.COMPILE_MODES, notes=notes,
        )

    def check_layout(self, layout: Layout, tier: Tier) -> list[str]:
        warnings = rules_for_real_model(layout, tier, self.gpu_gib)
        params.check_layout(layout, tier, detect())
        devices = len(device_names())
        if layout.world_size > devices:
            raise InputError("layout", f"{layout.name} needs {layout.world_size} GPUs; this machine has {devices}",
                             f"pick a layout of at most {devices} workers")
        return warnings

    # The engine child -----------------------------------------------------------------------
    @property
    def layout(self) -> Layout | None:
        return self._layout

    def start(self, layout: Layout, *, cancel: threading.Event | None = None) -> bool:
        """Select ``layout``: stop a child of another layout and check the weights.

        The child itself starts at the first request, because the compile mode and the
        deterministic flag (fixed when ``Omni`` is built) come with the request; starting
        here with defaults would cost a second 114B-model load whenever they differ. So this
        does no long work and ignores ``cancel``: ``generate`` watches it while the child starts.
        """

        if layout == self._layout:
            return False
        self.close()
        self._check_weights("272p")
        self._layout = layout
        return True

    def not_ready(self) -> str | None:
        """Why no tier can run: the least demanding tier's reason (every tier needs its weights), or None."""
        reasons = self.tiers_not_ready()
        return None if None in reasons.values() else next(iter(reasons.values()))

    def tiers_not_ready(self) -> dict[str, str | None]:
        """Per tier: the installed pipeline produces it (as ``capabilities`` says), its weights checked as a job of
        it checks them (files present, headers whole; 1080p also the refiner), and a GPU visible. A tree without
        ``refiner/`` runs 272p and 540p, not 1080p."""
        caps = detect()  # cached: the studio's page asked for the capabilities before any probe
        checked: dict[bool, WeightsReport | str] = {}  # the one-stage tiers need the same files: checked once
        gpu = None if device_names() else "no CUDA/MUSA GPU is visible here (vLLM-Omni's MAGI-2 pipeline requires GPUs)"
        reasons: dict[str, str | None] = {}
        for name, tier in TIERS.items():
            refusal = tier_refusal(caps, tier)
            if refusal is not None:
                reasons[name] = refusal
                continue
            if tier.refined not in checked:
                try:
                    checked[tier.refined] = check_weights(self.checkpoint_root, name)
                except InputError as err:
                    checked[tier.refined] = str(err)
            report = checked[tier.refined]
            if isinstance(report, str):
                reasons[name] = report
            elif not report.ok:
                reasons[name] = f"weights {self.checkpoint_root} incomplete for {name}: " + "; ".join(
                    f"{path} {problem}" for path, problem in report.problems)
            else:
                reasons[name] = gpu
        return reasons

    def _check_weights(self, tier_name: str) -> None:
        report = check_weights(self.checkpoint_root, tier_name)
        if not report.ok:
            raise InputError("MAGI2_CKPT_ROOT", f"{self.checkpoint_root} is incomplete: " + "; ".join(
                f"{path} {problem}" for path, problem in report.problems),
                "download the missing files (magi2studio weights check lists them), or point MAGI2_CKPT_ROOT elsewhere")

    def preview_map(self) -> Path | None:
        """The committed preview map fitted to this checkpoint's TurboVAE decoder, or None."""

        if self._preview_map is None:
            self._preview_map = (map_for_decoder(decoder_digest(Path(self.checkpoint_root) / "turbo_vae")),)
        return self._preview_map[0]

    def _ensure(self, options: params.StartOptions, tier_name: str) -> bool:
        """Have a live child for exactly these start options; (re)start it if needed."""

        if self._process is not None and self._process.alive and self._options == options:
            return False
        self._stop_child()
        self._check_weights(tier_name)
        metrics_dir = fresh_engine_dir(self.work_dir) / "metrics"
        metrics_dir.mkdir()
        cancel_file = metrics_dir.parent / "cancel"
        env = {**determinism.deterministic_env(str(metrics_dir.parent / "inductor-cache")),
               ENV_METRICS_DIR: str(metrics_dir), ENV_CANCEL_FILE: str(cancel_file),
               **test_checkpoint.worker_env(self.checkpoint_root)}
        if self.preview_map() is not None:
            env[ENV_PREVIEW_MAP] = str(self.preview_map())
        process = EngineProcess(WORKER_TARGET, {"options": options, "checkpoint_root": self.checkpoint_root,
                                                "metrics_dir": str(metrics_dir), "cancel_file": str(cancel_file)},
                                metrics_dir.parent / "engine.log", env)
        process.start(self.start_timeout_s)
        self._process, self._options, self._cancel_file = process, options, cancel_file
        self._metrics_dir = metrics_dir
        self._fresh_load = True
        return True

    def check_request(self, request: Request) -> Tier:
        return params.check_request(request, detect())

    def resolve(self, request: Request, tier: Tier, layout: Layout) -> dict[str, Any]:
        caps = detect()
        options = params.start_options(request, layout, tier, current_platform.name)
        steps = request.steps or caps.default_steps
        return {"steps": steps, "compile": options.compile,
                "preview_every": default_every(steps) if request.preview_every is None else request.preview_every,
                "video_cfg": caps.fixed_video_guidance, "audio_cfg": caps.fixed_audio_guidance,
                "negative_prompt_env": os.environ.get(caps.negative_prompt_env),
                "vae_patch_parallel_size": options.vae_patch_parallel_size}

    def generate(self, plan: Plan, *, on_progress: ProgressCallback | None = None,
                 cancel: threading.Event | None = None) -> Generation:
        caps = detect()
        request, tier, layout = plan.request, plan.tier, self._layout
        if layout is None:
            raise InputError("layout", "no layout was selected for the vllm-omni engine",
                             "call start(layout) first (magi2studio.run_folder.runs.execute does)")
        options = params.start_options(request, layout, tier, current_platform.name)
        if on_progress is not None:
            on_progress(Progress("load", message=f"vLLM-Omni for {layout.name}"))
        self._ensure(options, tier.name)
        self._cancel_file.unlink(missing_ok=True)
        every = plan.resolved["preview_every"] if self.preview_map() is not None else 0
        write_preview_request(self._metrics_dir, every)
        newest = NewestPreview(preview_folder(self._metrics_dir))
        stop_watch = threading.Event()
        watcher = threading.Thread(target=self._watch_cancel, args=(cancel, stop_watch), daemon=True)
        watcher.start()
        try:
            result = self._process.call(request.model_dump(mode="json"), self.request_timeout_s,
                                        lambda event: self._progress(event, on_progress, newest),
                                        idle_timeout_s=step_timeout_s())
        finally:
            stop_watch.set()
            watcher.join()
        stage_ms = dict(result["stage_ms"])
        if self._fresh_load:
            stage_ms["load"] = self._process.info["load_ms"]
            self._fresh_load = False
        return Generation(
            frames=result["frames"], audio=result["audio"], fps=result["fps"], sample_rate=result["sample_rate"],
            step_records=result["step_records"], stage_ms=stage_ms,
            resolved={**plan.resolved, "live_preview": preview_note(every, self.preview_map())},
            engine_info={"name": self.name, "embedded": False, "vllm_omni": caps.vllm_omni_version,
                         "start_options": options.as_dict(), "kernels": self._process.info.get("kernels"),
                         "checkpoint_root": self.checkpoint_root, "metrics_dir": self._process.info["metrics_dir"],
                         "checkpoint_sha256sums": test_checkpoint.sums_digest(self.checkpoint_root),
                         "test_checkpoint": self._process.info.get("test_checkpoint")},
        )

    def _watch_cancel(self, cancel: threading.Event | None, stop: threading.Event) -> None:
        """Turn the studio's cancel event into the file the workers check at each step end."""

        while cancel is not None and not stop.wait(0.2):
            if cancel.is_set():
                self._cancel_file.touch()
                return

    @staticmethod
    def _progress(event: dict[str, Any], on_progress: ProgressCallback | None, newest: NewestPreview) -> None:
        if on_progress is not None and "progress" in event:
            step = event["progress"]
            on_progress(Progress(step["stage"], step=step["step"], total=step["total"], preview=newest.take()))

    def _stop_child(self) -> None:
        if self._process is not None:
            self._process.stop()
        self._process, self._options, self._metrics_dir = None, None, None

    def close(self) -> None:
        self._stop_child()
        self._layout = None
