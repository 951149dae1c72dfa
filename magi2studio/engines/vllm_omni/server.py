"""``engine: vllm-omni-server``: drive an already running ``vllm-omni serve MODEL --omni``.

The engine part: the server's layout, compile mode and deterministic flag are fixed at its
launch and it does not report them, so they are declared (``server_layout``) or assumed from
the first start, and every change is refused with the command line that would start a matching
server. The HTTP calls, the form and the serve command are in :mod:`.server_client`.

With a shared metrics folder (``--server-metrics-dir``) the per-step progress, timings and live
preview come from the server's workers through it: before each job the request's preview rate is
written there (``write_preview_request``), and the serve command gives the workers the map fitted
to the model's TurboVAE decoder.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from ...errors import EngineError, InputError
from ...vocabulary.layouts import Layout, parse_layout, rules_for_real_model
from ...media import decode_mp4
from ..live_preview import NewestPreview, decoder_digest, default_every, map_for_decoder, preview_note, read_latest
from ..metrics_folder import (
    PROGRESS_FILE,
    ProgressFollower,
    preview_folder,
    records_since,
    step_offsets,
    write_preview_request,
)
from ...vocabulary.request import Request
from ...vocabulary.tiers import AUDIO_SAMPLE_RATE, TIERS, Tier
from ...weights import resolve_root
from ..base import Capabilities, Engine, Generation, Plan, Progress, ProgressCallback
from . import params
from .capabilities import detect, tier_refusal
from .server_client import (
    DEFAULT_SERVER_URL,
    ENV_SERVER_URL,
    MAX_SERVER_STEPS,
    TRANSPORTS,
    ServerClient,
    checked_server_url,
    form_fields,
    serve_command,
)

ENV_SERVER_LAYOUT = "MAGI2STUDIO_SERVER_LAYOUT"
ENV_SERVER_METRICS_DIR = "MAGI2STUDIO_SERVER_METRICS_DIR"
NO_STEPS_NOTE = ("no per-step timings: the server's worker plugin writes steps-rank*.jsonl into its own "
                 "MAGI2STUDIO_METRICS_DIR; share that folder and pass it as --server-metrics-dir to get them")
NO_PREVIEW_FOLDER = "off: no shared metrics folder (--server-metrics-dir), so no preview reaches this client"
NO_PREVIEW_WRITTEN = ("off: the server's workers wrote no preview; start the server with the serve command's "
                      "MAGI2STUDIO_PREVIEW_MAP")
LAYOUT_UNCHECKABLE = ("vLLM-Omni's server does not report its parallel layout over HTTP (GET /v1/models lists "
                      "model ids only; GET /health a status), so the layout cannot be checked against the server")


class VllmOmniServerEngine(Engine):
    """The common interface over HTTP; nothing runs in this process but decoding."""

    name = "vllm-omni-server"

    def __init__(self, server_url: str | None = None, server_layout: str | None = None,
                 metrics_dir: str | None = None, transport: str = "async", request_timeout_s: float = 7200.0,
                 http_timeout_s: float = 30.0, poll_interval_s: float = 1.0, server_compile: str | None = None,
                 checkpoint_root: str | None = None) -> None:
        self.server_url, self.port = checked_server_url(server_url or os.environ.get(ENV_SERVER_URL)
                                                        or DEFAULT_SERVER_URL)
        declared = server_layout or os.environ.get(ENV_SERVER_LAYOUT)
        self.server_layout = parse_layout(declared) if declared else None
        folder = metrics_dir or os.environ.get(ENV_SERVER_METRICS_DIR)
        self.metrics_dir = Path(folder) if folder else None
        if self.metrics_dir is not None and not self.metrics_dir.is_dir():
            raise InputError("server-metrics-dir", f"{self.metrics_dir} is not a folder",
                             "give the folder the server's workers write (their MAGI2STUDIO_METRICS_DIR), shared here")
        if transport not in TRANSPORTS:
            raise InputError("server-transport", f"unknown transport {transport!r}", f"use {' or '.join(TRANSPORTS)}")
        if server_compile is not None and server_compile not in params.COMPILE_MODES:
            raise InputError("server-compile", f"unknown compile mode {server_compile!r}",
                             f"use one of {', '.join(params.COMPILE_MODES)}")
        self.transport = transport
        self.server_compile = server_compile or params.DEFAULT_COMPILE
        self.model_path = str(resolve_root(checkpoint_root))
        self._layout: Layout | None = None
        self._server_models: list[str] = []
        self._preview_map: tuple[Path | None] | None = None
        self.http = ServerClient(self.server_url, command_hint=self._command_hint, request_timeout_s=request_timeout_s,
                                 http_timeout_s=http_timeout_s, poll_interval_s=poll_interval_s)

    def _command_hint(self, layout: Layout | None = None) -> str:
        layout = layout or self._layout or self.server_layout or Layout(4, 2)
        preview_map = self.preview_map() if self.metrics_dir else None
        return serve_command(layout, TIERS["272p"], model=self.model_path, port=self.port,
                             compile_mode=self.server_compile,
                             metrics_dir=str(self.metrics_dir) if self.metrics_dir else None,
                             preview_map=str(preview_map) if preview_map else None)

    def preview_map(self) -> Path | None:
        """The committed preview map fitted to the model tree's TurboVAE decoder (read here), or None."""

        if self._preview_map is None:
            self._preview_map = (map_for_decoder(decoder_digest(Path(self.model_path) / "turbo_vae")),)
        return self._preview_map[0]

    # What can run ------------------------------------------------------------------------------
    def probe(self, timeout_s: float | None = None) -> list[str]:
        """GET /health and /v1/models: the server is up and serving; returns its model ids."""

        return self.http.probe(timeout_s)

    def capabilities(self) -> Capabilities:
        caps = detect()
        try:
            models = self.probe(timeout_s=min(self.http.http_timeout_s, 3.0))
            down = None
        except EngineError as err:
            models, down = [], str(err)
        notes = [f"server {self.server_url}" + (f": {', '.join(models)}" if models else ""),
                 LAYOUT_UNCHECKABLE + (f"; declared {self.server_layout.name}" if self.server_layout else
                                       "; the first layout started is assumed"),
                 f"per-step timings from {self.metrics_dir}" if self.metrics_dir else NO_STEPS_NOTE]
        tiers = {name: tier_refusal(caps, tier) or down for name, tier in TIERS.items()}
        return Capabilities(engine=self.name, platform="remote", devices=[f"vllm-omni serve at {self.server_url}"],
                            tiers=tiers, max_world_size=max(caps.qualified_world_sizes, default=1),
                            default_steps=caps.default_steps, default_refiner_steps=0,
                            default_compile=self.server_compile, compile_modes=(self.server_compile,), notes=notes)

    def not_ready(self) -> str | None:
        """The server answers /health and serves a model (this engine runs nothing itself)."""
        try:
            self.probe(timeout_s=min(self.http.http_timeout_s, 3.0))
        except EngineError as err:
            return str(err)
        return None

    def check_layout(self, layout: Layout, tier: Tier) -> list[str]:
        warnings = rules_for_real_model(layout, tier)
        params.check_layout(layout, tier, detect())
        fixed = self.server_layout or self._layout
        if fixed is not None and layout != fixed:
            self._layout_refusal(layout, fixed)
        return warnings

    def _layout_refusal(self, layout: Layout, fixed: Layout) -> None:
        how = "was declared as" if self.server_layout is not None else "was started here as"
        raise InputError("layout", f"the vLLM-Omni server at {self.server_url} {how} {fixed.name} and its layout is "
                         f"fixed at launch, so {layout.name} cannot run there",
                         f"pick {fixed.name}, or restart the server with `{self._command_hint(layout)}` and pass "
                         f"--server-layout {layout.name}")

    # Lifecycle ---------------------------------------------------------------------------------
    @property
    def layout(self) -> Layout | None:
        return self._layout

    def start(self, layout: Layout, *, cancel: threading.Event | None = None) -> bool:
        """Check the server is up and that ``layout`` is the one it was launched with (or assumed).

        One probe, no long work: ``cancel`` is ``generate``'s to watch."""

        fixed = self.server_layout or self._layout
        if fixed is not None and layout != fixed:
            self._layout_refusal(layout, fixed)
        self._server_models = self.probe()
        changed = self._layout is None
        self._layout = layout
        return changed

    def check_request(self, request: Request) -> Tier:
        return params.check_request(request, detect())

    def resolve(self, request: Request, tier: Tier, layout: Layout) -> dict[str, Any]:
        if request.compile is not None and request.compile != self.server_compile:
            raise InputError("compile", f"the server's compile mode is fixed at its launch ({self.server_compile})",
                             f"drop compile, or restart the server with `{self._command_hint()}` for another mode "
                             "and pass --server-compile")
        caps = detect()
        steps = params.sampling_params(request, tier, caps).num_inference_steps  # what form_fields sends
        if steps > MAX_SERVER_STEPS:
            raise InputError("steps", f"vLLM-Omni's /v1/videos accepts at most {MAX_SERVER_STEPS} steps",
                             f"use {MAX_SERVER_STEPS} steps or fewer, or the vllm-omni engine")
        return {"steps": int(steps), "compile": self.server_compile,
                "preview_every": default_every(int(steps)) if request.preview_every is None else request.preview_every,
                "video_cfg": caps.fixed_video_guidance, "audio_cfg": caps.fixed_audio_guidance,
                "negative_prompt_env": "(the server's environment)",
                "vae_patch_parallel_size": layout.vae_patch_parallel(tier)}

    def generate(self, plan: Plan, *, on_progress: ProgressCallback | None = None,
                 cancel: threading.Event | None = None) -> Generation:
        caps = detect()
        if self._layout is None:
            raise InputError("layout", "no layout was selected for the vllm-omni-server engine",
                             "call start(layout) first (magi2studio.run_folder.runs.execute does)")
        fields, files = form_fields(plan.request, plan.tier)
        offsets = step_offsets(self.metrics_dir) if self.metrics_dir else {}
        every = plan.resolved["preview_every"] if self.metrics_dir and self.preview_map() is not None else 0
        if self.metrics_dir is not None:
            write_preview_request(self.metrics_dir, every)
        follower = None
        if self.metrics_dir is not None and on_progress is not None:
            newest = NewestPreview(preview_folder(self.metrics_dir))
            follower = ProgressFollower(self.metrics_dir / PROGRESS_FILE, lambda event: on_progress(Progress(
                event["progress"]["stage"], step=event["progress"]["step"], total=event["progress"]["total"],
                preview=newest.take())))
            follower.start()
        began = time.perf_counter()
        try:
            if self.transport == "sync":
                data, job, stage_ms = self.http.generate_sync(fields, files, on_progress)
            else:
                data, job, stage_ms = self.http.generate_async(fields, files, on_progress, cancel)
        finally:
            if follower is not None:
                follower.done.set()
                follower.join()
        stage_ms["generate"] = (time.perf_counter() - began) * 1e3
        decode_began = time.perf_counter()
        frames, audio, fps, sample_rate = decode_mp4(data)
        stage_ms["download_decode"] = (time.perf_counter() - decode_began) * 1e3
        if sample_rate != AUDIO_SAMPLE_RATE:
            raise EngineError(f"the server's audio is {sample_rate} Hz; MAGI-2 returns {AUDIO_SAMPLE_RATE} Hz")
        step_records = records_since(self.metrics_dir, offsets) if self.metrics_dir else []
        return Generation(
            frames=frames, audio=audio, fps=fps, sample_rate=sample_rate, step_records=step_records, stage_ms=stage_ms,
            resolved={**plan.resolved, "live_preview": self._preview_note(every)},
            engine_info={
                "name": self.name, "embedded": False, "server_url": self.server_url,
                "server_models": self._server_models, "model": job.get("model"), "job_id": job.get("id"),
                "transport": self.transport, "vllm_omni_client": caps.vllm_omni_version,
                "form": {k: v for k, v in fields.items() if k != "prompt"},
                "inference_time_s": job.get("inference_time_s"), "peak_memory_mb": job.get("peak_memory_mb"),
                "layout_verified": False,
                "layout_source": "declared (--server-layout)" if self.server_layout else "assumed from start()",
                "layout_note": LAYOUT_UNCHECKABLE, "server_command": self._command_hint(),
                "metrics_dir": str(self.metrics_dir) if self.metrics_dir else None,
                "step_timing": (f"read from the shared metrics folder {self.metrics_dir} (records appended during "
                                "this job; other clients' concurrent jobs would mix in)") if self.metrics_dir
                               else NO_STEPS_NOTE,
                "decoded_from": "the server's mp4 (H.264 + AAC: lossy, so hashes are of the decoded clip)",
            },
        )

    def _preview_note(self, every: int) -> dict[str, Any] | str:
        """What the job's preview was; the server's env cannot be read, so a rate asked for and no
        picture written says the workers lack the map."""

        if self.metrics_dir is None:
            return NO_PREVIEW_FOLDER
        if every and read_latest(preview_folder(self.metrics_dir)) is None:
            return NO_PREVIEW_WRITTEN
        return preview_note(every, self.preview_map())

    def close(self) -> None:
        self.http.close()
        # _layout stays: the server keeps the layout it was launched with after we let go.
