"""``engine: vllm-omni-server`` against vLLM-Omni 0.30.0's own /v1/videos code, on CPU.

Upstream's app cannot be built here: ``vllm_omni.entrypoints.openai``'s package ``__init__``
imports ``api_server``, whose first failing import is ``watchfiles``
(``vllm.entrypoints.launchers.launcher`` -> ``launchers/utils/ssl.py``); behind it come
``model_hosting_container_standards``, ``janus`` (``async_omni``) and a CUDA torchvision, and
the form parser's module (``video/generation/helpers.py``) needs the same ``launcher`` plus
``app_state`` (every serving class, the Mistral tokenizer). So:

- the routes, their methods, ``_parse_video_form``'s form/file fields and the sync route's
  headers are read from the installed sources (``ast``) and our client is checked against them;
- a server subprocess (:func:`serve`) runs upstream's real ``OmniOpenAIServingVideo`` (request ->
  ``OmniDiffusionSamplingParams`` + prompt, and its own mp4 encoder), upstream's
  ``VideoGenerationRequest`` / ``VideoResponse`` / ``VIDEO_STORE`` and ``decode_input_reference``,
  and, below the engine client, upstream's ``Magi2Pipeline.forward`` checks and output formatter.
  The test double is the engine client (``AsyncOmni``, whose module needs ``janus``): it stands
  in for the GPU-only ``_evaluate_preview`` with a seeded clip. The routes of that subprocess
  mirror ``api_server.py``'s (which cannot be imported) and are the test's own.
"""


import ast
import asyncio
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = "/models/MAGI-2-preview"
FAIL_MARK, SLOW_MARK = "[double:fail]", "[double:slow]"
SAMPLE_IMAGE = ROOT / "magi2studio/data/sandai/assets/sample_000.jpeg"


# --- The server subprocess -----------------------------------------------------------------------
def _openai_package_without_init():
    """Import ``vllm_omni.entrypoints.openai.*`` modules without the package ``__init__`` (it
    imports api_server, see the module docstring); only for the modules that import on CPU."""

    import types

    import vllm_omni.entrypoints as entrypoints

    package = types.ModuleType("vllm_omni.entrypoints.openai")
    package.__path__ = [str(Path(entrypoints.__file__).parent / "openai")]
    sys.modules["vllm_omni.entrypoints.openai"] = package


def upstream_source(relative: str) -> ast.Module:
    import vllm_omni

    return ast.parse((Path(vllm_omni.__file__).parent / relative).read_text(encoding="utf-8"))


def parse_video_form_fields() -> tuple[set[str], set[str]]:
    """(Form fields, File fields) of the installed ``_parse_video_form``."""

    tree = upstream_source("entrypoints/openai/video/generation/helpers.py")
    function = next(node for node in ast.walk(tree)
                    if isinstance(node, ast.AsyncFunctionDef) and node.name == "_parse_video_form")
    forms, files = set(), set()
    for arg, default in zip(function.args.args[-len(function.args.defaults):], function.args.defaults):
        if isinstance(default, ast.Call) and isinstance(default.func, ast.Name):
            {"Form": forms, "File": files}.get(default.func.id, set()).add(arg.arg)
    return forms, files


def serve(port: int, record_dir: Path) -> None:
    """The server double: see the module docstring. Records what reached the pipeline in record_dir."""

    _openai_package_without_init()
    import types

    from fastapi import FastAPI, HTTPException, Request
    from fastapi.responses import JSONResponse, Response

    from magi2studio.plugin import ENV_METRICS_DIR, steps_file
    from magi2studio.engines.timing import StepRecord, write_jsonl
    from vllm_omni.diffusion.data import (DIFFUSION_REQUEST_LIFECYCLE_KEY, DIFFUSION_REQUEST_STARTED,
                                          OmniDiffusionConfig)
    from vllm_omni.diffusion.models.magi2 import pipeline_magi2
    from vllm_omni.diffusion.output_formatter import format_diffusion_outputs, normalize_diffusion_postprocess_output
    from vllm_omni.diffusion.request import OmniDiffusionRequest
    from vllm_omni.diffusion.worker.request_batch import DiffusionRequestBatch
    from vllm_omni.errors import OmniClientError

    class DoubleAsyncOmni:
        """The engine client: upstream's MAGI-2 forward checks, a seeded clip instead of the GPU evaluation."""

        stage_configs = [{"stage_type": "diffusion", "final_output": True, "final_output_type": "video"}]
        default_sampling_params_list: list = []
        od_config = types.SimpleNamespace(model_class_name="Magi2Pipeline", model=MODEL)

        async def generate(self, prompt, request_id, sampling_params_list):
            (sampling,) = sampling_params_list
            yield types.SimpleNamespace(custom_output={DIFFUSION_REQUEST_LIFECYCLE_KEY: DIFFUSION_REQUEST_STARTED})
            if SLOW_MARK in prompt["prompt"]:
                await asyncio.sleep(60)
            if FAIL_MARK in prompt["prompt"]:
                raise RuntimeError("double: the pipeline failed on purpose")
            seen = {}

            def evaluate_preview(**kwargs):
                image = kwargs.get("image")
                seen.update(prompt=kwargs["prompt"], width=kwargs["width"], height=kwargs["height"],
                            steps=kwargs["num_inference_steps"], seed=sampling.seed, extra_args=sampling.extra_args,
                            num_frames=sampling.num_frames, fps=sampling.fps,
                            image=None if image is None else {"size": list(image.size), "sha256": hashlib.sha256(
                                np.asarray(image.convert("RGB")).tobytes()).hexdigest()})
                return seeded_clip(sampling.seed, kwargs["height"], kwargs["width"])

            pipeline = types.SimpleNamespace(deterministic=True, _evaluate_preview=evaluate_preview)
            batch = DiffusionRequestBatch(requests=[OmniDiffusionRequest(prompt=prompt, sampling_params=sampling,
                                                                         request_id=request_id)])
            output = pipeline_magi2.Magi2Pipeline.forward(pipeline, batch)
            metrics_dir = os.environ.get(ENV_METRICS_DIR)
            if metrics_dir:  # what the worker plugin appends on each rank after sampling
                for rank in (0, 1):
                    write_jsonl([StepRecord(rank, "preview", step, 10.0 + step + rank)
                                 for step in range(seen["steps"])],
                                steps_file(metrics_dir, rank))
            raw = pipeline_magi2._magi2_post_process(output.output)
            config = OmniDiffusionConfig.from_kwargs(model=MODEL, model_class_name="Magi2Pipeline")
            (result,) = format_diffusion_outputs(request=batch.requests[0], od_config=config, diffusion_output=output,
                                                 output_data=raw,
                                                 postprocess_output=normalize_diffusion_postprocess_output(raw))
            (record_dir / f"{request_id}.request.json").write_text(json.dumps(seen, default=str), encoding="utf-8")
            yield result

        async def abort(self, request_id, timeout=None):
            (record_dir / f"{request_id}.aborted").write_text("aborted", encoding="utf-8")

    module = types.ModuleType("vllm_omni.entrypoints.async_omni")
    module.AsyncOmni, module.ABORT_TIMEOUT_S = DoubleAsyncOmni, 5.0
    sys.modules["vllm_omni.entrypoints.async_omni"] = module

    from vllm_omni.entrypoints.openai.protocol.videos import (VideoDeleteResponse, VideoError, VideoGenerationRequest,
                                                              VideoGenerationStatus, VideoResponse)
    from vllm_omni.entrypoints.openai.serving_video import OmniOpenAIServingVideo, ReferenceImage
    from vllm_omni.entrypoints.openai.stores import VIDEO_STORE
    from vllm_omni.entrypoints.openai.video_api_utils import decode_input_reference

    handler = OmniOpenAIServingVideo.for_diffusion(DoubleAsyncOmni(), model_name=MODEL)
    forms, files = parse_video_form_fields()
    contents: dict[str, bytes] = {}
    tasks: dict[str, asyncio.Task] = {}
    app = FastAPI()

    async def parse(raw: Request):
        form = await raw.form()
        unknown = set(form) - forms - files
        if unknown:
            raise HTTPException(400, f"_parse_video_form has no field(s) {sorted(unknown)}")
        data = {key: value for key, value in form.items() if key in forms}
        if "extra_params" in data:
            data["extra_params"] = json.loads(data["extra_params"])
        request = VideoGenerationRequest(**data)
        reference = None
        if "input_reference" in form:
            image = await decode_input_reference(None, None, await form["input_reference"].read())
            reference = ReferenceImage(data=image)
        return request, reference

    def failure(err: Exception) -> VideoError:
        if isinstance(err, (HTTPException, OmniClientError)):
            return VideoError(code=err.status_code, message=str(getattr(err, "detail", None) or err.message))
        return VideoError(code=500, message=str(err))

    @app.get("/health")
    async def health():
        return {"status": "healthy"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": MODEL, "object": "model", "root": MODEL}]}

    @app.post("/v1/videos")
    async def create(raw: Request):
        request, reference = await parse(raw)
        job = VideoResponse(model=MODEL, prompt=request.prompt, status=VideoGenerationStatus.QUEUED)
        await VIDEO_STORE.upsert(job.id, job)

        async def run():
            started = time.perf_counter()

            async def mark_started():
                await VIDEO_STORE.update_fields(job.id, {"status": VideoGenerationStatus.IN_PROGRESS})

            try:
                data, stages, peak, _action, metadata = await handler.generate_video_bytes(
                    request, job.id, reference_image=reference, on_started=mark_started)
            except Exception as err:  # noqa: BLE001 - the job records it, as upstream's runner does
                await VIDEO_STORE.update_fields(job.id, {"status": VideoGenerationStatus.FAILED, "error": failure(err)})
                return
            contents[job.id] = data
            (record_dir / f"{job.id}.mp4").write_bytes(data)
            (record_dir / f"{job.id}.stages.json").write_text(json.dumps(stages), encoding="utf-8")
            await VIDEO_STORE.update_fields(job.id, {
                "status": VideoGenerationStatus.COMPLETED, "progress": 100, "file_name": f"{job.id}.mp4",
                "inference_time_s": time.perf_counter() - started, "stage_durations": stages,
                "peak_memory_mb": peak, **{k: v for k, v in metadata.items() if k in ("fps", "num_frames")}})

        tasks[job.id] = asyncio.create_task(run())
        return job

    @app.post("/v1/videos/sync")
    async def create_sync(raw: Request):
        request, reference = await parse(raw)
        started = time.perf_counter()
        data, stages, peak, _action, _metadata = await handler.generate_video_bytes(
            request, "video_sync-double", reference_image=reference)
        (record_dir / "video_sync-double.mp4").write_bytes(data)
        (record_dir / "video_sync-double.stages.json").write_text(json.dumps(stages), encoding="utf-8")
        return Response(content=data, media_type="video/mp4", headers={
            "X-Request-Id": "video_sync-double", "X-Model": MODEL,
            "X-Inference-Time-S": f"{time.perf_counter() - started:.3f}",
            "X-Stage-Durations": json.dumps(stages, separators=(",", ":")), "X-Peak-Memory-MB": f"{peak:.3f}"})

    @app.get("/v1/videos/{video_id}")
    async def retrieve(video_id: str):
        job = await VIDEO_STORE.get(video_id)
        if job is None:
            raise HTTPException(404, "Video not found")
        if job.status == VideoGenerationStatus.FAILED:
            return JSONResponse(job.model_dump(mode="json"), status_code=int(job.error.code))
        return job

    @app.delete("/v1/videos/{video_id}")
    async def delete(video_id: str):
        job = await VIDEO_STORE.get(video_id)
        if job is None:
            raise HTTPException(404, "Video not found")
        if job.status in (VideoGenerationStatus.QUEUED, VideoGenerationStatus.IN_PROGRESS):
            await handler.abort_request(video_id)
            tasks[video_id].cancel()
        await VIDEO_STORE.pop(video_id)
        return VideoDeleteResponse(id=video_id, deleted=True)

    @app.get("/v1/videos/{video_id}/content")
    async def content(video_id: str):
        job = await VIDEO_STORE.get(video_id)
        if job is None:
            raise HTTPException(404, "Video not found")
        if job.status == VideoGenerationStatus.FAILED:
            raise HTTPException(422, "Video generation failed. Check job status for error details.")
        if not job.file_name:
            raise HTTPException(404, "Generation is still in-progress")
        return Response(contents[video_id], media_type="video/mp4")

    import uvicorn

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def seeded_clip(seed: int, height: int, width: int):
    """125 smooth frames (they survive H.264 well) and 10 s of stereo tones, from the seed."""

    rng = np.random.default_rng(seed)
    base = rng.uniform(40, 200, 3)
    y, x = np.mgrid[0:height, 0:width]
    t = np.arange(125)[:, None, None, None]
    frames = base + 40 * np.sin(x[None, ..., None] / 37 + t / 9) * np.cos(y[None, ..., None] / 23 + np.arange(3))
    seconds = np.arange(441_000) / 44_100
    audio = np.stack([0.4 * np.sin(2 * np.pi * 330 * seconds), 0.3 * np.sin(2 * np.pi * 550 * seconds)], axis=1)
    return np.clip(frames, 0, 255).astype(np.uint8), audio + 0.01 * rng.standard_normal(audio.shape)


# --- Fixtures ------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    pytest.importorskip("vllm_omni.diffusion.models.magi2.pipeline_magi2")
    record_dir = tmp_path_factory.mktemp("server-records")
    metrics_dir = tmp_path_factory.mktemp("server-metrics")
    (metrics_dir / "steps-rank0.jsonl").write_text('{"rank": 0, "stage": "preview", "step": 0, "ms": 999.0}\n')
    port = free_port()
    log = open(record_dir / "server.log", "wb")
    env = {**os.environ, "MAGI2STUDIO_METRICS_DIR": str(metrics_dir), "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, __file__, str(port), str(record_dir)], stdout=log,
                               stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    import httpx

    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    if process.poll() is not None or time.monotonic() >= deadline:
        process.kill()
        pytest.fail("server double did not start:\n" + (record_dir / "server.log").read_text(errors="replace")[-3000:])
    yield {"url": f"http://127.0.0.1:{port}", "records": record_dir, "metrics": metrics_dir}
    process.terminate()
    process.wait(10)
    log.close()


def engine(url, **options):
    from magi2studio.engines import get_engine

    return get_engine("vllm-omni-server", server_url=url, poll_interval_s=0.1, **options)


def decode_independently(path: Path):
    """Decode an mp4 the plain PyAV way (not the engine's code), for the hash comparison."""

    import av

    with av.open(str(path)) as container:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(container.streams.video[0])])
    with av.open(str(path)) as container:
        audio = np.concatenate([f.to_ndarray() for f in container.decode(container.streams.audio[0])], axis=1).T
    return frames, np.ascontiguousarray(audio, dtype=np.float32)


def only_record(record_dir: Path, suffix: str, before: set[Path]) -> Path:
    (path,) = set(record_dir.glob(f"*{suffix}")) - before
    return path


# --- Contract read from the installed sources ----------------------------------------------------
def test_client_uses_the_installed_routes_fields_headers_and_flags():
    from magi2studio.engines.vllm_omni import server_client as srv
    from magi2studio.vocabulary.layouts import Layout
    from magi2studio.vocabulary.request import build_request
    from magi2studio.vocabulary.tiers import get_tier

    tree = upstream_source("entrypoints/openai/api_server.py")
    routes = {(d.func.attr, d.args[0].value) for node in ast.walk(tree)
              if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) for d in node.decorator_list
              if isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.args
              and isinstance(d.args[0], ast.Constant)}
    assert {("post", "/v1/videos"), ("post", "/v1/videos/sync"), ("get", "/v1/videos/{video_id}"),
            ("delete", "/v1/videos/{video_id}"), ("get", "/v1/videos/{video_id}/content"), ("get", "/health"),
            ("get", "/v1/models")} <= routes
    sync = next(node for node in ast.walk(tree)
                if isinstance(node, ast.AsyncFunctionDef) and node.name == "create_video_sync")
    headers = {key.value for node in ast.walk(sync) if isinstance(node, ast.Dict) for key in node.keys
               if isinstance(key, ast.Constant)}
    assert {"X-Stage-Durations", "X-Inference-Time-S", "X-Request-Id", "X-Model", "X-Peak-Memory-MB"} <= headers

    forms, files = parse_video_form_fields()
    t2va, no_files = srv.form_fields(build_request(prompt="p", steps=3), get_tier("272p"))
    i2va, image = srv.form_fields(build_request(prompt="p", image=str(SAMPLE_IMAGE), mode="i2va"), get_tier("272p"))
    assert set(t2va) <= forms and set(i2va) <= forms and not no_files and set(image) == {"input_reference"} <= files

    from vllm_omni.model_extras.magi2 import MAGI2_EXTRA_BODY_PARAMS

    assert set(json.loads(t2va["extra_params"])) <= MAGI2_EXTRA_BODY_PARAMS

    serve_flags = set()
    for node in ast.walk(upstream_source("entrypoints/cli/serve.py")):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            names = {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
            negatable = any(k.arg == "action" and getattr(k.value, "attr", "") == "BooleanOptionalAction"
                            for k in node.keywords)
            serve_flags |= names | ({"--no-" + n[2:] for n in names} if negatable else set())
    import vllm.engine.arg_utils as vllm_args
    import vllm.entrypoints.launchers.cli_args as frontend_args

    assert '"--enforce-eager"' in Path(vllm_args.__file__).read_text()
    assert "port" in frontend_args.FrontendArgs.__dataclass_fields__
    for layout, compile_mode in ((Layout(4, 2), "eager"), (Layout(1, 1, offload=True), "static")):
        command = srv.serve_command(layout, get_tier("272p"), model=MODEL, port=8000, compile_mode=compile_mode)
        flags = {word for word in command.split() if word.startswith("--")}
        assert flags - {"--enforce-eager", "--port"} <= serve_flags, flags - serve_flags


def test_status_values_and_step_limit_are_upstreams():
    from magi2studio.engines.vllm_omni import server_client as srv

    saved = {name: module for name, module in sys.modules.items() if name.startswith("vllm_omni.entrypoints.openai")}
    try:
        _openai_package_without_init()
        from vllm_omni.entrypoints.openai.protocol.videos import VideoGenerationRequest, VideoGenerationStatus

        assert {s.value for s in VideoGenerationStatus} == {srv.QUEUED, srv.IN_PROGRESS, srv.COMPLETED, srv.FAILED}
        limits = VideoGenerationRequest.model_fields["num_inference_steps"].metadata
        assert srv.MAX_SERVER_STEPS == next(m.le for m in limits if hasattr(m, "le"))
    finally:
        for name in [n for n in sys.modules if n.startswith("vllm_omni.entrypoints.openai")]:
            del sys.modules[name]
        sys.modules.update(saved)


def test_stage_durations_header_parsing():
    from magi2studio.engines.vllm_omni.server_client import parse_stage_durations
    from magi2studio.errors import EngineError

    assert parse_stage_durations('{"magi2_preview_e2e":12.5,"vae":0.25}') == {"magi2_preview_e2e": 12500.0,
                                                                            "vae": 250.0}
    assert parse_stage_durations(None) == {} and parse_stage_durations("") == {}
    for bad in ("not json", '["a"]', '{"a": "1"}'):
        with pytest.raises(EngineError, match="X-Stage-Durations"):
            parse_stage_durations(bad)


# --- Against the server double ------------------------------------------------------------------
def test_t2va_round_trip_through_upstreams_serving_video(server, tmp_path):
    from magi2studio.run_folder import runs
    from magi2studio.vocabulary.layouts import Layout
    from magi2studio.vocabulary.request import build_request
    from magi2studio.engines.timing import read_jsonl

    records = server["records"]
    before = set(records.glob("*"))
    eng = engine(server["url"], metrics_dir=str(server["metrics"]))
    request = build_request(prompt="a cat sings on a roof", seed=11, steps=3)
    folder = runs.execute(eng, request, Layout(4, 2), tmp_path)

    seen = json.loads(only_record(records, ".request.json", before).read_text())
    assert (seen["prompt"], seen["seed"], seen["steps"]) == ("a cat sings on a roof", 11, 3)
    assert (seen["width"], seen["height"], seen["num_frames"], seen["fps"]) == (448, 256, 125, 12.5)
    assert seen["extra_args"] == {"resolution": "272p", "seconds": 10.0, "deterministic": True}
    assert seen["image"] is None

    frames, audio = decode_independently(only_record(records, ".mp4", before))
    manifest = folder.manifest
    from magi2studio.media import frames_sha256, pcm_sha256

    assert manifest["hashes"]["frames_sha256"] == frames_sha256(frames)
    assert manifest["hashes"]["pcm_sha256"] == pcm_sha256(audio)
    raw_frames, raw_audio = seeded_clip(11, 256, 448)
    assert frames.shape == raw_frames.shape
    psnr = 10 * np.log10(255**2 / np.mean((frames.astype(float) - raw_frames) ** 2))
    assert psnr > 30, psnr  # the same clip, through H.264
    lag = int(np.argmax([audio[k:k + 8192, 0] @ raw_audio[:8192, 0] for k in range(2048)]))  # AAC priming, if kept
    n = min(len(audio) - lag, len(raw_audio))
    for channel in (0, 1):  # the same tones, channels in order: [samples, channels] survived both ways
        assert np.corrcoef(audio[lag:lag + n, channel], raw_audio[:n, channel])[0, 1] > 0.95
    assert manifest["output"]["sample_rate"] == 44_100 and manifest["output"]["audio_channels"] == 2

    info = manifest["engine"]
    assert info["name"] == "vllm-omni-server" and info["server_url"] == server["url"] and info["model"] == MODEL
    assert info["layout_verified"] is False and "vllm-omni serve" in info["server_command"]
    stages = json.loads(only_record(records, ".stages.json", before).read_text())
    assert stages and all(manifest["timing"]["stage_ms"][k] == pytest.approx(v * 1e3) for k, v in stages.items())
    steps = read_jsonl(folder.steps)  # this job's records only, not the stale line written before
    assert sorted((r["rank"], r["step"]) for r in steps) == [(rank, s) for rank in (0, 1) for s in range(3)]


def test_i2va_sends_the_first_frame_over_sync(server, tmp_path):
    from PIL import Image

    from magi2studio.run_folder import runs
    from magi2studio.vocabulary.layouts import Layout
    from magi2studio.vocabulary.request import build_request

    records = server["records"]
    before = set(records.glob("*"))
    eng = engine(server["url"], transport="sync")
    request = build_request(prompt="she turns to the camera", image=str(SAMPLE_IMAGE), mode="i2va", steps=2)
    folder = runs.execute(eng, request, Layout(4, 2), tmp_path)

    seen = json.loads(only_record(records, ".request.json", before).read_text())
    with Image.open(SAMPLE_IMAGE) as image:
        rgb = image.convert("RGB")
    assert seen["image"] == {"size": list(rgb.size), "sha256": hashlib.sha256(np.asarray(rgb).tobytes()).hexdigest()}
    stages = json.loads((records / "video_sync-double.stages.json").read_text())
    stage_ms = folder.manifest["timing"]["stage_ms"]
    assert stages and all(stage_ms[k] == pytest.approx(v * 1e3) for k, v in stages.items())  # X-Stage-Durations
    assert "server_inference" in stage_ms  # X-Inference-Time-S
    assert folder.manifest["engine"]["step_timing"].startswith("no per-step timings")
    assert folder.steps.read_text() == ""


def test_failed_job_is_one_clear_line(server, tmp_path):
    from magi2studio.run_folder import runs
    from magi2studio.errors import EngineError
    from magi2studio.vocabulary.layouts import Layout
    from magi2studio.vocabulary.request import build_request

    with pytest.raises(EngineError) as err:
        runs.execute(engine(server["url"]), build_request(prompt=f"x {FAIL_MARK}", steps=2), Layout(4, 2), tmp_path)
    text = str(err.value)
    assert "\n" not in text and "failed (code 500)" in text and "the pipeline failed on purpose" in text
    assert not [p for p in tmp_path.iterdir() if not p.name.startswith(".")]


def test_timeout_and_cancel_delete_the_server_job(server, tmp_path):
    from magi2studio.run_folder import runs
    from magi2studio.errors import Cancelled, EngineError
    from magi2studio.vocabulary.layouts import Layout
    from magi2studio.vocabulary.request import build_request

    records = server["records"]
    before = set(records.glob("*.aborted"))
    with pytest.raises(EngineError) as err:
        runs.execute(engine(server["url"], request_timeout_s=1.0), build_request(prompt=f"x {SLOW_MARK}", steps=2),
                     Layout(4, 2), tmp_path)
    assert "\n" not in str(err.value) and "did not finish within 1 s" in str(err.value)
    only_record(records, ".aborted", before)  # DELETE reached upstream's handler.abort_request

    before = set(records.glob("*.aborted"))
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    with pytest.raises(Cancelled, match="deleted"):
        runs.execute(engine(server["url"]), build_request(prompt=f"y {SLOW_MARK}", steps=2), Layout(4, 2), tmp_path,
                     cancel=cancel)
    only_record(records, ".aborted", before)


def test_server_down_is_one_clear_line():
    from magi2studio.errors import EngineError
    from magi2studio.vocabulary.layouts import Layout

    down = engine(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(EngineError) as err:
        down.start(Layout(4, 2))
    text = str(err.value)
    assert "\n" not in text and "not reachable" in text and "vllm-omni serve" in text and "--server-url" in text
    caps = down.capabilities()  # the studio and doctor grey every tier out, with the reason
    assert all(reason and ("not reachable" in reason or "1080p" in name) for name, reason in caps.tiers.items())
    assert any("no per-step timings" in note for note in caps.notes)


def test_layout_change_is_refused_with_the_serve_command(server):
    from magi2studio.errors import InputError
    from magi2studio.vocabulary.layouts import Layout
    from magi2studio.vocabulary.tiers import get_tier

    declared = engine(server["url"], server_layout="sp4-cfg2")
    with pytest.raises(InputError) as err:
        declared.start(Layout(8, 1))
    assert err.value.field == "layout" and "sp4-cfg2" in err.value.problem
    assert "vllm-omni serve" in err.value.fix and "--usp 8 --cfg-parallel-size 1" in err.value.fix
    with pytest.raises(InputError):
        declared.check_layout(Layout(8, 1), get_tier("272p"))
    assert declared.start(Layout(4, 2)) is True

    assumed = engine(server["url"])
    assert assumed.start(Layout(8, 1)) is True and assumed.start(Layout(8, 1)) is False
    with pytest.raises(InputError, match="--usp 4 --cfg-parallel-size 2"):
        assumed.start(Layout(4, 2))


def test_generate_cli_drives_the_server(server, tmp_path, capsys):
    from magi2studio.cli import main

    code = main(["generate", "--engine", "vllm-omni-server", "--server-url", server["url"], "--server-layout",
                 "sp8-cfg1", "--layout", "sp8-cfg1", "--prompt", "a drum solo", "--steps", "2", "--out", str(tmp_path)])
    assert code == 0
    out = capsys.readouterr().out
    assert "engine: vllm-omni-server  layout: sp8-cfg1" in out
    (folder,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert json.loads((folder / "manifest.json").read_text())["engine"]["layout_source"].startswith("declared")
    code = main(["generate", "--engine", "vllm-omni-server", "--server-url", server["url"], "--server-layout",
                 "sp8-cfg1", "--layout", "sp4-cfg2", "--prompt", "a drum solo", "--out", str(tmp_path)])
    assert code == 2 and "vllm-omni serve" in capsys.readouterr().err


if __name__ == "__main__":
    serve(int(sys.argv[1]), Path(sys.argv[2]))
