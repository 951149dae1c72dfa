"""The live preview on the vllm-omni engine: the map fitted to the checkpoint's decoder reaches the
workers by env, each request's rate through the metrics folder (no child restart), and the
progress events carry the newest picture rank 0 wrote there.

The engine child is replaced by an in-process stand-in that runs what a worker runs on rank 0:
the plugin's ``WorkerStepTimer`` (with the real ``LivePreview`` writer) under the child's env, and
the child's ``ProgressFollower`` forwarding ``progress.jsonl``. No GPU, no vLLM engine start.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path
from types import MappingProxyType
from unittest import mock

import numpy as np
import pytest
import torch

from magi2studio.engines import get_engine, live_preview
from magi2studio.engines.base import Plan
from magi2studio.engines.live_preview import PREVIEW_MAPS, decoder_digest
from magi2studio.engines.metrics_folder import PROGRESS_FILE, ProgressFollower
from magi2studio.engines.vllm_omni import engine as engine_module
from magi2studio.plugin import WorkerStepTimer
from magi2studio.vocabulary.layouts import parse_layout
from magi2studio.vocabulary.request import build_request
from magi2studio.vocabulary.tiers import get_tier

from .test_engine import structurally_complete_tree


class Scheduler:
    """Upstream's video scheduler as the step hook sees it: an x0 estimate of the 48-channel latent."""

    predict_x0 = True

    def __init__(self, step: int) -> None:
        self.model_outputs = [torch.randn(1, 48, 2, 2, 4, generator=torch.Generator().manual_seed(step))]


class RankZeroProcess:
    """The engine child, in process: each request runs rank 0's plugin timer over its steps."""

    started: list[RankZeroProcess] = []

    def __init__(self, target, config, log_path, env=None) -> None:
        self.config, self.env = config, dict(env or {})
        self.info = {"load_ms": 1.0, "metrics_dir": config["metrics_dir"], "kernels": None, "test_checkpoint": None}
        self.alive = False

    def start(self, timeout_s: float) -> dict:
        RankZeroProcess.started.append(self)
        self.alive = True
        return self.info

    def call(self, payload, timeout_s, on_event=None, idle_timeout_s=None) -> dict:
        metrics_dir = Path(self.config["metrics_dir"])
        steps = payload["steps"]
        with mock.patch.dict(os.environ, self.env):
            timer = WorkerStepTimer(metrics_dir, "preview", self.config["cancel_file"])
            follower = ProgressFollower(metrics_dir / PROGRESS_FILE, on_event)
            timer.begin_sample(torch.zeros(1), steps)
            for step in range(steps):
                timer.step_start()
                timer.step_end(Scheduler(step))
                follower.forward()  # the child forwards each progress line as one event
            timer.end_sample()
        return {"frames": np.zeros((1, 8, 8, 3), np.uint8), "audio": np.zeros((1, 2), np.float32), "fps": 24.0,
                "sample_rate": 44100, "stage_ms": {}, "step_records": []}

    def stop(self, timeout_s: float = 30.0) -> None:
        self.alive = False


@pytest.fixture
def engine(tmp_path, monkeypatch):
    monkeypatch.delenv("MAGI2STUDIO_PREVIEW_MAP", raising=False)
    monkeypatch.delenv("MAGI2STUDIO_PREVIEW_EVERY", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(engine_module, "EngineProcess", RankZeroProcess)
    RankZeroProcess.started = []
    engine = get_engine("vllm-omni", checkpoint_root=str(structurally_complete_tree(tmp_path / "ckpt")),
                        work_dir=str(tmp_path / "work"))
    engine.start(parse_layout("sp2-cfg1"))
    yield engine
    engine.close()


@pytest.fixture
def fitted_map(tmp_path, monkeypatch, engine):
    """A committed map's weights, filed under the digest of the test tree's own TurboVAE decoder."""

    maps = tmp_path / "maps"
    maps.mkdir()
    data = json.loads((PREVIEW_MAPS / "tiny-trained.json").read_text())
    data["decoder_sha256"] = decoder_digest(Path(engine.checkpoint_root) / "turbo_vae")
    (maps / "fitted.json").write_text(json.dumps(data))
    monkeypatch.setattr(engine_module, "map_for_decoder", lambda digest: live_preview.map_for_decoder(digest, maps))
    return maps / "fitted.json"


def run(engine, **fields):
    request = build_request(prompt="a cat", **fields)
    tier, layout = get_tier("272p"), engine.layout
    plan = Plan(request, tier, layout, MappingProxyType(engine.resolve(request, tier, layout)))
    events = []
    generation = engine.generate(plan, on_progress=events.append)
    return generation, [event for event in events if event.step is not None]


def test_progress_carries_rank0_previews_at_each_requests_rate_without_a_restart(engine, fitted_map):
    generation, steps = run(engine, steps=6, preview_every=2)
    assert [(e.step, e.total) for e in steps] == [(s, 6) for s in range(6)]
    shown = [(e.step, Path(e.preview).name) for e in steps if e.preview]
    assert shown == [(1, "preview-preview-0001.gif"), (3, "preview-preview-0003.gif"), (5, "preview-preview-0005.gif")]
    assert all(Path(e.preview).parent.name == "preview" for e in steps if e.preview)
    assert generation.resolved["preview_every"] == 2
    assert generation.resolved["live_preview"] == {"every": 2, "map": "fitted"}
    assert RankZeroProcess.started[0].env["MAGI2STUDIO_PREVIEW_MAP"] == str(fitted_map)

    _, steps = run(engine, steps=6, preview_every=3)  # a new rate, same start options: the same child
    assert len(RankZeroProcess.started) == 1
    assert [e.step for e in steps if e.preview] == [2, 5]  # none of the first request's pictures

    generation, steps = run(engine, steps=6, preview_every=0)
    assert [e.preview for e in steps] == [None] * 6 and len(RankZeroProcess.started) == 1
    assert generation.resolved["live_preview"] == "off"

    generation, steps = run(engine, steps=20)  # blank: about ten a run
    assert generation.resolved["preview_every"] == 2 and len([e for e in steps if e.preview]) == 10


def test_no_map_fitted_to_the_decoder_no_preview_and_the_run_says_why(engine):
    generation, steps = run(engine, steps=4, preview_every=1)
    assert "MAGI2STUDIO_PREVIEW_MAP" not in RankZeroProcess.started[0].env
    assert [e.preview for e in steps] == [None] * 4
    assert generation.resolved["live_preview"] == "off: no preview map fitted to this decoder"


# --- The server engine: the same protocol through a shared metrics folder ----------------------------
def rank0_of_a_server(metrics_dir: Path, env: dict[str, str], steps: int, mp4: bytes):
    """``ServerClient.generate_async`` as a server started with ``env`` answers it: rank 0's plugin timer
    writes into the shared folder while the job runs (the client's follower polls every 0.25 s)."""

    def generate_async(fields, files, on_progress, cancel):
        with mock.patch.dict(os.environ, env):
            timer = WorkerStepTimer(metrics_dir, "preview", None)
            timer.begin_sample(torch.zeros(1), steps)
            for step in range(steps):
                timer.step_start()
                timer.step_end(Scheduler(step))
                time.sleep(0.3)
            timer.end_sample()
        return mp4, {"id": "video-1", "model": "m"}, {}

    return generate_async


@pytest.fixture
def server_engine(tmp_path, monkeypatch, fitted_map):
    from magi2studio.engines.vllm_omni import server as server_module
    from magi2studio.media import write_mp4

    monkeypatch.setattr(server_module, "map_for_decoder", lambda digest: live_preview.map_for_decoder(
        digest, fitted_map.parent))
    (tmp_path / "shared").mkdir()
    engine = get_engine("vllm-omni-server", server_url="http://127.0.0.1:8000", server_layout="sp2-cfg1",
                        metrics_dir=str(tmp_path / "shared"), checkpoint_root=str(tmp_path / "ckpt"))
    monkeypatch.setattr(engine.http, "probe", lambda timeout_s=None: ["m"])
    engine.start(parse_layout("sp2-cfg1"))
    write_mp4(tmp_path / "clip.mp4", np.zeros((2, 16, 16, 3), np.uint8), np.zeros((4410, 2), np.float32), 24.0,
              44100, {})
    engine.mp4 = (tmp_path / "clip.mp4").read_bytes()
    yield engine
    engine.close()


def served_env(command: str) -> dict[str, str]:
    """The ``KEY=VALUE`` words the printed serve command starts with."""

    words = shlex.split(command)
    return dict(word.split("=", 1) for word in words[:words.index("vllm-omni")])


def test_server_engine_forwards_the_shared_folders_previews_at_the_requests_rate(server_engine, fitted_map):
    env = served_env(server_engine._command_hint())
    assert env["MAGI2STUDIO_PREVIEW_MAP"] == str(fitted_map)
    server_engine.http.generate_async = rank0_of_a_server(server_engine.metrics_dir, env, 6, server_engine.mp4)
    generation, steps = run(server_engine, steps=6, preview_every=2)
    assert [Path(e.preview).name for e in steps if e.preview] == [
        "preview-preview-0001.gif", "preview-preview-0003.gif", "preview-preview-0005.gif"]
    assert generation.resolved["live_preview"] == {"every": 2, "map": "fitted"}

    generation, steps = run(server_engine, steps=6, preview_every=0)
    assert [e.preview for e in steps] == [None] * 6 and generation.resolved["live_preview"] == "off"

    without_map = {k: v for k, v in env.items() if k != "MAGI2STUDIO_PREVIEW_MAP"}  # a hand-started server
    server_engine.http.generate_async = rank0_of_a_server(server_engine.metrics_dir, without_map, 6,
                                                          server_engine.mp4)
    generation, steps = run(server_engine, steps=6, preview_every=2)
    assert [e.preview for e in steps] == [None] * 6
    assert generation.resolved["live_preview"].startswith("off: the server's workers wrote no preview")
