"""The HTTP side of ``engine: vllm-omni-server``: the ``vllm-omni serve`` command and the client.

The HTTP contract is vLLM-Omni 0.30.0's own ``/v1/videos`` family; docs/engines.md ("Server
mode", "The contract") lists every call and what is sent and read. :func:`serve_command` is the
command line that starts a matching server, :func:`form_fields` maps a request onto the form,
and :class:`ServerClient` makes the calls, turning every failure into one error line.
"""

from __future__ import annotations

import io
import json
import shlex
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from ... import determinism
from ...errors import Cancelled, EngineError, InputError
from ...vocabulary.layouts import Layout
from ...vocabulary.request import Request
from ...vocabulary.tiers import Tier
from .. import test_checkpoint
from ..base import Progress, ProgressCallback
from ..metrics_folder import ENV_METRICS_DIR, ENV_PREVIEW_MAP
from . import params
from .capabilities import detect

ENV_SERVER_URL = "MAGI2STUDIO_SERVER_URL"
DEFAULT_SERVER_URL = "http://127.0.0.1:8000"
TRANSPORTS = ("async", "sync")
MAX_SERVER_STEPS = 200  # VideoGenerationRequest.num_inference_steps: le=200 (protocol/videos.py)
# Upstream's VideoGenerationStatus values.
QUEUED, IN_PROGRESS, COMPLETED, FAILED = "queued", "in_progress", "completed", "failed"


def serve_command(layout: Layout, tier: Tier, *, model: str, port: int, compile_mode: str = params.DEFAULT_COMPILE,
                  deterministic: bool = True, metrics_dir: str | None = None, preview_map: str | None = None) -> str:
    """The ``vllm-omni serve`` command line that starts a server matching these start options.

    Its env is the offline engine's child env: the deterministic variables when ``deterministic``,
    the test checkpoint's depth switch when ``model`` is a marked test tree (the server's workers
    otherwise build upstream's 40 layers and its strict loader refuses the tree), the metrics folder,
    and with it the live preview's map (``preview_map``, fitted to the model's decoder): rank 0 then
    writes each job's preview into that folder at the rate the client leaves there.
    """

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
    env = {**(determinism.DETERMINISTIC_ENV if deterministic else {}), **test_checkpoint.worker_env(model),
           **({ENV_METRICS_DIR: metrics_dir} if metrics_dir else {}),
           **({ENV_PREVIEW_MAP: preview_map} if metrics_dir and preview_map else {})}
    return " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items()) + " " * bool(env) + shlex.join(argv)


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


def checked_server_url(url: str) -> tuple[str, int]:
    """The server's base URL without a trailing slash, and its port; a bad URL is an InputError."""

    url = url.rstrip("/")
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise InputError("server-url", f"{url!r} is not an http(s) URL",
                         f"give e.g. {DEFAULT_SERVER_URL} (or set {ENV_SERVER_URL})")
    return url, parsed.port or (443 if parsed.scheme == "https" else 80)


class ServerClient:
    """Upstream's ``/v1/videos`` calls on one server; ``command_hint`` names the serve command in errors."""

    def __init__(self, server_url: str, *, command_hint: Callable[[], str], request_timeout_s: float,
                 http_timeout_s: float, poll_interval_s: float) -> None:
        self.server_url = server_url
        self.request_timeout_s = request_timeout_s
        self.http_timeout_s = http_timeout_s
        self.poll_interval_s = poll_interval_s
        self._command_hint = command_hint
        self._client = None

    @property
    def client(self):
        if self._client is None:
            import httpx

            self._client = httpx.Client(base_url=self.server_url, timeout=self.http_timeout_s)
        return self._client

    def http(self, method: str, path: str, *, what: str, timeout: float | None = None, **kwargs):
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

    @staticmethod
    def detail(response) -> str:
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

    def refuse(self, response, what: str) -> None:
        detail = " ".join(self.detail(response).split())
        if response.status_code in (400, 422):
            raise InputError("request", f"vLLM-Omni server {self.server_url} refused {what} (HTTP "
                             f"{response.status_code}): {detail}", "change what the server's message names")
        raise EngineError(f"vLLM-Omni server {self.server_url} failed {what} (HTTP {response.status_code}): {detail}. "
                          "Fix: see the server's log")

    def probe(self, timeout_s: float | None = None) -> list[str]:
        """GET /health and /v1/models: the server is up and serving; returns its model ids."""

        health = self.http("GET", "/health", what="the health check", timeout=timeout_s)
        if health.status_code != 200:
            raise EngineError(f"vLLM-Omni server {self.server_url} is unhealthy (GET /health: HTTP "
                              f"{health.status_code}: {self.detail(health)}). "
                              "Fix: see the server's log and restart it")
        models = self.http("GET", "/v1/models", what="the model list", timeout=timeout_s)
        if models.status_code != 200:
            self.refuse(models, "the model list")
        ids = [str(card.get("id")) for card in models.json().get("data", []) if isinstance(card, dict)]
        if not ids:
            raise EngineError(f"vLLM-Omni server {self.server_url} serves no model (GET /v1/models is empty). "
                              f"Fix: start it with `{self._command_hint()}`")
        return ids

    def generate_sync(self, fields, files, on_progress: ProgressCallback | None
                      ) -> tuple[bytes, dict[str, Any], dict[str, float]]:
        """POST /v1/videos/sync: the mp4, the job's facts from the headers, the stage times in ms."""

        if on_progress is not None:
            on_progress(Progress("preview", message=f"POST /v1/videos/sync on {self.server_url}"))
        response = self.http("POST", "/v1/videos/sync", what="the generation", timeout=self.request_timeout_s,
                             data=fields, files=files or None)
        if response.status_code != 200:
            self.refuse(response, "the generation")
        stage_ms = parse_stage_durations(response.headers.get("X-Stage-Durations"))
        inference = response.headers.get("X-Inference-Time-S")
        job = {"id": response.headers.get("X-Request-Id"), "model": response.headers.get("X-Model"),
               "inference_time_s": float(inference) if inference else None,
               "peak_memory_mb": (float(response.headers["X-Peak-Memory-MB"])
                                  if response.headers.get("X-Peak-Memory-MB") else None)}
        if job["inference_time_s"] is not None:
            stage_ms["server_inference"] = job["inference_time_s"] * 1e3
        return response.content, job, stage_ms

    def generate_async(self, fields, files, on_progress: ProgressCallback | None, cancel: threading.Event | None
                       ) -> tuple[bytes, dict[str, Any], dict[str, float]]:
        """POST /v1/videos, poll the job (DELETE on cancel or timeout), then download its mp4."""

        response = self.http("POST", "/v1/videos", what="the job submission", data=fields, files=files or None)
        if response.status_code != 200:
            self.refuse(response, "the job submission")
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
            polled = self.http("GET", f"/v1/videos/{job_id}", what="the job status")
            try:
                job = polled.json()
            except ValueError:
                job = None
            if polled.status_code != 200 and not (isinstance(job, dict) and job.get("status") == FAILED):
                self.refuse(polled, f"the status of job {job_id}")
        content = self.http("GET", f"/v1/videos/{job_id}/content", what="the download", timeout=max(
            self.http_timeout_s, 120.0))
        if content.status_code != 200:
            self.refuse(content, f"the download of job {job_id}")
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
            self.http("DELETE", f"/v1/videos/{job_id}", what="the cancel", timeout=min(self.http_timeout_s, 30.0))
        except EngineError:
            pass

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
