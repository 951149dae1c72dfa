"""The engine child's body: one ``Omni`` for one set of start options, serving requests.

Runs inside :mod:`.process` (spawned, own process group, log redirected). The worker plugin
(:mod:`magi2studio.plugin`) is loaded by vLLM-Omni in each diffusion worker this ``Omni``
starts; it appends per-rank step records to the metrics folder, which this process reads
back after each request (by byte offset, so each request gets only its own records).
"""

from __future__ import annotations

import json
import os
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

from ...errors import Cancelled, EngineError
from ..metrics_folder import (
    PROGRESS_FILE,
    ProgressFollower,
    kernels_file,
    records_since,
    step_offsets,
    test_checkpoint_file,
)
from ...vocabulary.request import build_request
from .capabilities import detect
from .output import map_output
from .params import StartOptions, check_request, omni_kwargs, prompt, sampling_params
from .process import serve


def run_omni(conn, config: dict[str, Any]) -> None:
    options: StartOptions = config["options"]
    metrics_dir = Path(config["metrics_dir"])
    cancel_file = Path(config["cancel_file"])
    started = time.perf_counter()
    from vllm_omni.entrypoints.omni import Omni  # needs the GPU stack (janus, torchvision)

    omni = Omni(**omni_kwargs(options, config["checkpoint_root"]))
    load_ms = (time.perf_counter() - started) * 1e3
    caps = detect()
    kernels_path = kernels_file(metrics_dir)
    kernels = json.loads(kernels_path.read_text(encoding="utf-8")) if kernels_path.exists() else None
    depth_path = test_checkpoint_file(metrics_dir)  # written by the plugin in the workers, for a test checkpoint
    depth = json.loads(depth_path.read_text(encoding="utf-8")) if depth_path.exists() else None

    def handle(payload: dict[str, Any], emit) -> dict[str, Any]:
        request = build_request(**payload)
        tier = check_request(request, caps)
        offsets = step_offsets(metrics_dir)
        follower = ProgressFollower(metrics_dir / PROGRESS_FILE, emit)
        follower.start()
        began = time.perf_counter()
        try:
            outputs = omni.generate([prompt(request)], [sampling_params(request, tier, caps)], use_tqdm=False)
        finally:
            follower.done.set()
            follower.join()
        if cancel_file.exists():
            raise Cancelled("cancelled at a step boundary")
        if len(outputs) != 1:
            raise EngineError(f"vLLM-Omni returned {len(outputs)} outputs for one request")
        mapped = map_output(outputs[0])
        return {"frames": mapped.frames, "audio": mapped.audio, "fps": mapped.fps, "sample_rate": mapped.sample_rate,
                "stage_ms": {**mapped.stage_ms, "generate": (time.perf_counter() - began) * 1e3},
                "step_records": records_since(metrics_dir, offsets)}

    serve(conn, {"pid": os.getpid(), "load_ms": load_ms, "kernels": kernels, "test_checkpoint": depth,
                 "options": options.as_dict(),
                 "vllm_omni": version("vllm-omni"), "metrics_dir": str(metrics_dir)}, handle)
