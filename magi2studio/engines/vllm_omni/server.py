"""``engine: vllm-omni-server``: drive an already running ``vllm-omni serve MODEL --omni``.

The HTTP contract is vLLM-Omni 0.30.0's own ``/v1/videos`` family; docs/engines.md ("Server
mode", "The contract") lists every call and what is sent and read. The server's layout, compile
mode and deterministic flag are fixed at its launch and it does not report them, so they are
declared (``server_layout``) or assumed from the first start, and every change is refused with
the command line that would start a matching server.
"""

from __future__ import annotations

import io
import json
import os
import shlex
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse


from ...errors import Cancelled, EngineError, InputError
from ...media import decode_mp4
from ...layouts import Layout, parse_layout, rules_for_real_model
from ...metrics_folder import PROGRESS_FILE, ProgressFollower, records_since, step_offsets
from ...request import Request
from ...tiers import AUDIO_SAMPLE_RATE, TIERS, Tier, get_tier
from ...weights import resolve_root
from ..base import Capabilities, Engine, Generation, Plan, Progress, ProgressCallback
from .capabilities import detect, tier_refusal
from . import params

ENV_SERVER_URL = "MAGI2STUDIO_SERVER_URL"
ENV_SERVER_LAYOUT = "MAGI2STUDIO_SERVER_LAYOUT"
ENV_SERVER_METRICS_DIR = "MAGI2STUDIO_SERVER_METRICS_DIR"
DEFAULT_SERVER_URL = "http://127.0.0.1:8000"
TRANSPORTS = ("async", "sync")
MAX_SERVER_STEPS = 200  # VideoGenerationRequest.num_inference_steps: le=200 (protocol/videos.py)
# Upstream's VideoGenerationStatus values.
QUEUED, IN_PROGRESS, COMPLETED, FAILED = "queued", "in_progress", "completed", "failed"
NO_STEPS_NOTE = ("no per-step timings: the server's worker plugin writes steps-rank*.jsonl into its own "
                 "MAGI2STUDIO_METRICS_DIR; share that folder and pass it as --server-metrics-dir to get them")
LAYOUT_UNCHECKABLE = ("vLLM-Omni's server does not report its parallel layout over HTTP (GET /v1/models lists "
                      "model ids only; GET /health a status), so the layout cannot be checked against the server")


def serve_command(layout: Layout, tier: Tier, *, model: str, port: int, compile_mode: str = params.DEFAULT_COMPILE,
                  deterministic: bool = True, metrics_dir: str | None = None) -> str:
    """The ``vllm-omni serve`` command line that starts a server matching these start options."""

    enforce_eager, compile_dynamic = params.COMPILE_FLAGS[compile_mode]
    argv = ["vllm-omni", "serve", model, "--omni", "--port", str(port),
            "--usp", str(layout.sp), "--cfg-parallel-size", str(layout.cfg),
            "--vae-patch-parallel-size", str(layout.vae_patch_parallel(tier)),
            "--custom-pipeline-args", json.dumps({"magi2_deterministic": deterministic})]
    if layout.offload:
        argv.append("--enable-layerwise-offload")
    if enforce_eager:
        argv.append("--enforce-eager")
    elif not compile_dynamic:
        argv.append("--no-diffusion-compile-dynamic")
    env = f"MAGI2STUDIO_METRICS_DIR={shlex.quote(metrics_dir)} " if metrics_dir else ""
    return env + shlex.join(argv)


def form_fields(request: Request, tier: Tier) -> tuple[dict[str, str], dict[str, tuple[str, bytes, str]]]:
    """Request -> upstream's form fields and file parts, from the offline engine's own mapping.

    ``params.sampling_params`` gives the same seed, steps, size, frames, fps and extra_args the
    offline engine hands ``Omni``; ``params.prompt`` gives the same RGB first frame, sent as PNG
    (lossless) in ``input_reference`` (MAGI-2 keeps the reference size: upstream does not resize it).
    """

    sampling = params.sampling_params(request, tier, detect())
    fields = {
        "prompt": request.prompt,
        "seed": str(sampling.seed),
        "num_inference_steps": str(sampling.num_inference_steps),
        "width": str(sampling.width),
        "height": str(sampling.height),
        "num_frames": str(sampling.num_frames),
        "fps": repr(float(sampling.fps)),
        "extra_params": json.dumps(sampling.extra_args, sort_keys=True),
    }
    files: dict[str, tuple[str, bytes, str]] = {}
    if request.mode == "i2va":
        image = params.prompt(request)["multi_modal_data"]["image"]
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        files["input_reference"] = ("first_frame.png", buffer.getvalue(), "image/png")
    return fields, files


def parse_stage_durations(text: str | None) -> dict[str, float]:
    """``X-Stage-Durations`` (a JSON object of seconds) -> milliseconds; absent -> {}."""

    if not text:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise EngineError(f"X-Stage-Durations is not JSON: {text[:200]!r}") from None
    if not isinstance(data, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                             for v in data.values()):
        raise EngineError(f"X-Stage-Durations is not an object of seconds: {text[:200]!r}")
    return {str(name): float(seconds) * 1e3 for name, seconds in data.items()}


class VllmOmniServerEngine(Engine):
    """The common interface over HTTP; nothing runs in this process but decoding."""

    name = "vllm-omni-server"

    def __init__(self, server_url: str | None = None, server_layout: str | None = None,
                 metrics_dir: str | None = None, transport: str = "async", request_timeout_s: float = 7200.0,
                 http_timeout_s: float = 30.0, poll_interval_s: float = 1.0, server_compile: str | None = None,
                 checkpoint_root: str | None = None) -> None:
        self.server_url = (server_url or os.environ.get(ENV_SERVER_URL) or DEFAULT_SERVER_URL).rstrip("/")
        parsed = urlparse(self.server_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise InputError("server-url", f"{self.server_url!r} is not an http(s) URL",
                             f"give e.g. {DEFAULT_SERVER_URL} (or set {ENV_SERVER_URL})")
        self.port = parsed.port or (443 if parsed.scheme == "https" else 80)
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
        self.request_timeout_s = request_timeout_s
        self.http_timeout_s = http_timeout_s
        self.poll_interval_s = poll_interval_s
        self.server_compile = server_compile or params.DEFAULT_COMPILE
        self.model_path = str(resolve_root(checkpoint_root))
        self._layout: Layout | None = None
        self._server_models: list[str] = []
        self._client = None

    # HTTP -------------------------------------------------------------------------------------
    @property
    def client(self):
        if self._client is None:
            import httpx

            self._client = httpx.Client(base_url=self.server_url, timeout=self.http_timeout_s)
        return self._client

    def _http(self, method: str, path: str, *, what: str, timeout: float | None = None, **kwargs):
        """One HTTP call; a transport failure is one EngineError line naming the server and the fix."""

        import httpx

        try:
            return self.client.request(method, path, timeout=timeout or self.http_timeout_s, **kwargs)
        except httpx.TimeoutException:
            raise EngineError(f"vLLM-Omni server {self.server_url} gave no answer to {what} ({method} {path}) within "
                              f"{timeout or self.http_timeout_s:.0f} s. Fix: check the server is up and not "
                              "overloaded, or raise the timeout") from None
        except httpx.HTTPError as err:
            raise EngineError(f"vLLM-Omni server {self.server_url} is not reachable for {what} ({method} {path}: "
                              f"{type(err).__name__}: {err}). Fix: start it with `{self._command_hint()}`, or pass "
                              f"--server-url / {ENV_SERVER_URL}") from None

    def _command_hint(self, layout: Layout | None = None) -> str:
        layout = layout or self._layout or self.server_layout or Layout(4, 2)
        return serve_command(layout, get_tier("272p"), model=self.model_path, port=self.port,
                             compile_mode=self.server_compile,
                             metrics_dir=str(self.metrics_dir) if self.metrics_dir else None)

    @staticmethod
    def _detail(response) -> str:
        """The message in upstream's error bodies: HTTPException ``detail``, ErrorResponse or a failed job."""

        try:
            body = response.json()
        except ValueError:
            return response.text.strip()[:300] or response.reason_phrase
        if isinstance(body, dict):
            if isinstance(body.get("detail"), str):
                return body["detail"]
            error = body.get("error")
            if isinstance(error, dict) and error.get("message"):
                return str(error["message"])
            if isinstance(body.get("message"), str):
                return body["message"]
        return json.dumps(body)[:300]

    def _refuse(self, response, what: str) -> None:
        detail = " ".join(self._detail(response).split())
        if response.status_code in (400, 422):
            raise InputError("request", f"vLLM-Omni server {self.server_url} refused {what} (HTTP "
                             f"{response.status_code}): {detail}", "change what the server's message names")
        raise EngineError(f"vLLM-Omni server {self.server_url} failed {what} (HTTP {response.status_code}): {detail}. "
                          "Fix: see the server's log")

    # What can run ------------------------------------------------------------------------------
    def probe(self, timeout_s: float | None = None) -> list[str]:
        """GET /health and /v1/models: the server is up and serving; returns its model ids."""

        health = self._http("GET", "/health", what="the health check", timeout=timeout_s)
        if health.status_code != 200:
            raise EngineError(f"vLLM-Omni server {self.server_url} is unhealthy (GET /health: HTTP "
                              f"{health.status_code}: {self._detail(health)}). "
                              "Fix: see the server's log and restart it")
        models = self._http("GET", "/v1/models", what="the model list", timeout=timeout_s)
        if models.status_code != 200:
            self._refuse(models, "the model list")
        ids = [str(card.get("id")) for card in models.json().get("data", []) if isinstance(card, dict)]
        if not ids:
            raise EngineError(f"vLLM-Omni server {self.server_url} serves no model (GET /v1/models is empty). "
                              f"Fix: start it with `{self._command_hint()}`")
        return ids

    def capabilities(self) -> Capabilities:
        caps = detect()
        try:
            models = self.probe(timeout_s=min(self.http_timeout_s, 3.0))
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

    def check_layout(self, layout: Layout, tier: Tier) -> list[str]:
        warnings = rules_for_real_model(layout, tier)
        params.check_layout(layout, tier, detect())
        fixed = self.server_layout or self._layout
        if fixed is not None and layout != fixed:
            self._layout_refusal(layout, fixed, tier)
        return warnings

    def _layout_refusal(self, layout: Layout, fixed: Layout, tier: Tier) -> None:
        how = "was declared as" if self.server_layout is not None else "was started here as"
        raise InputError("layout", f"the vLLM-Omni server at {self.server_url} {how} {fixed.name} and its layout is "
                         f"fixed at launch, so {layout.name} cannot run there",
                         f"pick {fixed.name}, or restart the server with `{self._command_hint(layout)}` and pass "
                         f"--server-layout {layout.name}")

    # Lifecycle ---------------------------------------------------------------------------------
    @property
    def layout(self) -> Layout | None:
        return self._layout

    def start(self, layout: Layout) -> bool:
        """Check the server is up and that ``layout`` is the one it was launched with (or assumed)."""

        fixed = self.server_layout or self._layout
        if fixed is not None and layout != fixed:
            self._layout_refusal(layout, fixed, get_tier("272p"))
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
                "video_cfg": caps.fixed_video_guidance, "audio_cfg": caps.fixed_audio_guidance,
                "negative_prompt_env": "(the server's environment)",
                "vae_patch_parallel_size": layout.vae_patch_parallel(tier)}

    def generate(self, plan: Plan, *, on_progress: ProgressCallback | None = None,
                 cancel: threading.Event | None = None) -> Generation:
        caps = detect()
        if self._layout is None:
            raise InputError("layout", "no layout was selected for the vllm-omni-server engine",
                             "call start(layout) first (magi2studio.runs.execute does)")
        fields, files = form_fields(plan.request, plan.tier)
        offsets = step_offsets(self.metrics_dir) if self.metrics_dir else {}
        follower = None
        if self.metrics_dir is not None and on_progress is not None:
            follower = ProgressFollower(self.metrics_dir / PROGRESS_FILE, lambda event: on_progress(Progress(
                event["progress"]["stage"], step=event["progress"]["step"], total=event["progress"]["total"])))
            follower.start()
        began = time.perf_counter()
        try:
            if self.transport == "sync":
                data, job, stage_ms = self._generate_sync(fields, files, on_progress)
            else:
                data, job, stage_ms = self._generate_async(fields, files, on_progress, cancel)
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
            resolved=dict(plan.resolved),
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

    def _generate_sync(self, fields, files, on_progress) -> tuple[bytes, dict[str, Any], dict[str, float]]:
        if on_progress is not None:
            on_progress(Progress("preview", message=f"POST /v1/videos/sync on {self.server_url}"))
        response = self._http("POST", "/v1/videos/sync", what="the generation", timeout=self.request_timeout_s,
                              data=fields, files=files or None)
        if response.status_code != 200:
            self._refuse(response, "the generation")
        stage_ms = parse_stage_durations(response.headers.get("X-Stage-Durations"))
        inference = response.headers.get("X-Inference-Time-S")
        job = {"id": response.headers.get("X-Request-Id"), "model": response.headers.get("X-Model"),
               "inference_time_s": float(inference) if inference else None,
               "peak_memory_mb": (float(response.headers["X-Peak-Memory-MB"])
                                  if response.headers.get("X-Peak-Memory-MB") else None)}
        if job["inference_time_s"] is not None:
            stage_ms["server_inference"] = job["inference_time_s"] * 1e3
        return response.content, job, stage_ms

    def _generate_async(self, fields, files, on_progress, cancel) -> tuple[bytes, dict[str, Any], dict[str, float]]:
        response = self._http("POST", "/v1/videos", what="the job submission", data=fields, files=files or None)
        if response.status_code != 200:
            self._refuse(response, "the job submission")
        job = response.json()
        job_id = job.get("id")
        if not job_id:
            raise EngineError(f"vLLM-Omni server {self.server_url} answered POST /v1/videos without a job id: {job}")
        deadline = time.monotonic() + self.request_timeout_s
        last_status = None
        while True:
            status = job.get("status")
            if status != last_status and on_progress is not None:
                on_progress(Progress("preview", message=f"server job {job_id}: {status}"))
            last_status = status
            if status == COMPLETED:
                break
            if status == FAILED:
                error = job.get("error") or {}
                raise EngineError(f"vLLM-Omni server job {job_id} failed (code {error.get('code')}): "
                                  f"{' '.join(str(error.get('message', 'no message')).split())}. "
                                  "Fix: see the server's log")
            if status not in (QUEUED, IN_PROGRESS):
                raise EngineError(f"vLLM-Omni server job {job_id} has an unknown status {status!r}")
            if self._wait(cancel):
                self._delete(job_id)
                raise Cancelled(f"cancelled; server job {job_id} was deleted (DELETE /v1/videos/{job_id} aborts it)")
            if time.monotonic() >= deadline:
                self._delete(job_id)
                raise EngineError(f"vLLM-Omni server job {job_id} did not finish within {self.request_timeout_s:.0f} s "
                                  f"(last status {status}); it was deleted on the server. Fix: raise --server-timeout, "
                                  "or check the server's log")
            polled = self._http("GET", f"/v1/videos/{job_id}", what="the job status")
            try:
                job = polled.json()
            except ValueError:
                job = None
            if polled.status_code != 200 and not (isinstance(job, dict) and job.get("status") == FAILED):
                self._refuse(polled, f"the status of job {job_id}")
        content = self._http("GET", f"/v1/videos/{job_id}/content", what="the download", timeout=max(
            self.http_timeout_s, 120.0))
        if content.status_code != 200:
            self._refuse(content, f"the download of job {job_id}")
        stage_ms = {str(name): float(seconds) * 1e3 for name, seconds in (job.get("stage_durations") or {}).items()}
        if job.get("inference_time_s") is not None:
            stage_ms["server_inference"] = float(job["inference_time_s"]) * 1e3
        return content.content, job, stage_ms

    def _wait(self, cancel: threading.Event | None) -> bool:
        """Sleep one poll interval; True when the caller's cancel event is set."""

        if cancel is None:
            time.sleep(self.poll_interval_s)
            return False
        return cancel.wait(self.poll_interval_s)

    def _delete(self, job_id: str) -> None:
        """Best effort: the job is being abandoned anyway; a failure here must not hide why."""

        try:
            self._http("DELETE", f"/v1/videos/{job_id}", what="the cancel", timeout=min(self.http_timeout_s, 30.0))
        except EngineError:
            pass

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        # _layout stays: the server keeps the layout it was launched with after we let go.
