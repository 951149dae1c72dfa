"""Liveness and readiness apart: a studio on the vLLM-Omni engine answers live throughout, and ready
only while its weights are whole and its slot is open (the image's HEALTHCHECK probes readiness)."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request

import pytest

from studio_support import free_port
from tests.distribution.test_weights import synthetic_tree


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


ALL_READY = {"ready": True, "reason": None,
             "tiers": {name: {"ready": True, "reason": None} for name in ("272p", "540p", "1080p")}}


def ready_on_the_installed_vllm_omni() -> dict:
    """A whole tree's readiness on the installed vLLM-Omni: its pipeline may not produce every tier (0.30.0 has no
    refiner, so no 1080p), which readiness says as ``capabilities`` does."""
    from magi2studio.engines.vllm_omni.capabilities import detect, tier_refusal
    from magi2studio.vocabulary.tiers import TIERS

    tiers = {name: {"ready": (why := tier_refusal(detect(), tier)) is None, "reason": why} for name, tier in
             TIERS.items()}
    return {**ALL_READY, "tiers": tiers}


@pytest.fixture
def weights_studio(tmp_path, monkeypatch):
    from magi2studio.engines.vllm_omni import engine as vllm_engine
    from magi2studio.studio.app import create_app, launch_options

    # This machine has no GPU; readiness would say so before it looked at the weights.
    monkeypatch.setattr(vllm_engine, "device_names", lambda: ["test GPU 0"])
    tree = synthetic_tree(tmp_path / "MAGI-2-preview")
    engine = vllm_engine.VllmOmniEngine(checkpoint_root=str(tree), work_dir=str(tmp_path / "work"))
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    demo, ctx = create_app(engine, outputs, max_waiting=2)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                **launch_options(ctx, auth=("user", "secret")))
    try:
        yield f"http://127.0.0.1:{port}", tree, ctx
    finally:
        ctx.slot.close()
        demo.close()
        engine.close()
        ctx.close()


def test_readiness_turns_false_while_the_weights_are_missing_and_liveness_stays(weights_studio):
    url, tree, ctx = weights_studio
    # No login for the probes, though the studio asks for one.
    assert _get(url + "/health/live") == (200, {"live": True})
    assert _get(url + "/health/ready") == (200, ready_on_the_installed_vllm_omni())

    vae = tree / "vae" / "Wan2.2_VAE.pth"
    shutil.move(vae, tree / "moved-away.pth")
    status, body = _get(url + "/health/ready")
    assert status == 503 and body["ready"] is False
    assert "vae/Wan2.2_VAE.pth missing" in body["reason"], body
    assert _get(url + "/health/live") == (200, {"live": True})

    assert all(not body["tiers"][name]["ready"] and "vae/Wan2.2_VAE.pth missing" in body["tiers"][name]["reason"]
               for name in ("272p", "540p"))

    shutil.move(tree / "moved-away.pth", vae)
    assert _get(url + "/health/ready") == (200, ready_on_the_installed_vllm_omni())

    ctx.slot.close()
    status, body = _get(url + "/health/ready")
    assert status == 503 and body["reason"] == "the studio is shutting down"
    assert _get(url + "/health/live")[0] == 200


def test_the_embedded_engine_is_ready_without_a_checkpoint_folder():
    from magi2studio.engines import get_engine

    assert get_engine("embedded").not_ready() is None


def test_the_server_engine_is_ready_only_while_its_vllm_omni_server_answers():
    """``engine: vllm-omni-server`` runs nothing itself: with its server down, no job can run, so
    /health/ready must not say ready (it inherited the embedded engine's 'always ready')."""
    import http.server
    import threading

    from magi2studio.engines import get_engine

    down = get_engine("vllm-omni-server", server_url=f"http://127.0.0.1:{free_port()}")
    reason = down.not_ready()
    assert reason is not None and "not reachable" in reason and "\n" not in reason

    class Serving(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = {"/health": b"{}", "/v1/models": b'{"data": [{"id": "/models/MAGI-2-preview"}]}'}[self.path]
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Serving)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        up = get_engine("vllm-omni-server", server_url=f"http://127.0.0.1:{server.server_address[1]}")
        assert up.not_ready() is None
    finally:
        server.shutdown()
        server.server_close()


def test_readiness_turns_false_when_the_slots_worker_has_stopped(tmp_path):
    """The slot's one worker thread runs every job; an error it does not expect (here claiming a job from the
    queue file) ends it, and nothing runs again. /health/ready said ready all the same."""
    import time
    from types import SimpleNamespace

    from magi2studio.jobs.jobqueue import JobQueue
    from magi2studio.studio import health
    from magi2studio.studio.slot import EngineSlot
    from magi2studio.vocabulary.request import build_request

    class Idle:
        name, layout = "stand-in", None

        def tiers_not_ready(self):
            return {"272p": None}

    def claim_fails():
        raise RuntimeError("an error the worker does not expect")

    engine = Idle()
    slot = EngineSlot(engine, tmp_path)
    ctx = SimpleNamespace(slot=slot, engine=engine)
    try:
        assert health.not_ready(ctx) is None
        slot.queue.claim_next = claim_fails
        JobQueue(tmp_path).add(build_request(prompt="a kite", seed=1, steps=2).model_dump(mode="json"), "sp1-cfg1",
                               owner="cli", source="cli")
        deadline = time.monotonic() + 30
        while slot.serving and time.monotonic() < deadline:
            time.sleep(0.05)
        reason = health.not_ready(ctx)
        assert reason is not None and "worker stopped" in reason, reason
    finally:
        slot.close()


def test_readiness_that_cannot_be_checked_is_a_503_with_one_line_not_a_500(tmp_path):
    """The weights check reads every shard's header: a file it may not read raised PermissionError, and the
    probe got Starlette's 500 with a traceback in the log instead of a reason."""
    from types import SimpleNamespace

    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from magi2studio.studio import health

    class Unreadable:
        def tiers_not_ready(self):
            raise PermissionError(13, "Permission denied", "/models/MAGI-2-preview/dit/model-00001.safetensors")

    ctx = SimpleNamespace(slot=SimpleNamespace(closed=False, serving=True), engine=Unreadable())
    with TestClient(Starlette(routes=health.routes(ctx)), raise_server_exceptions=False) as client:
        response = client.get(health.READY)
    assert response.status_code == 503, response.text
    body = response.json()
    assert body["ready"] is False and "\n" not in body["reason"]
    assert body["reason"].startswith("readiness could not be checked (PermissionError: ") and "model-00001" in \
        body["reason"]


def test_readiness_names_each_tier_and_a_tree_without_the_refiner_is_ready_for_272p_not_1080p(tmp_path, monkeypatch):
    """1080p runs Sand AI's refiner from refiner/; readiness checked the 272p files only, so a tree without the
    refiner said ready and a 1080p job failed at its start. Ready for the tiers that can run, each tier's reason."""
    from types import SimpleNamespace

    from starlette.applications import Starlette
    from starlette.testclient import TestClient

    from magi2studio.engines.vllm_omni import engine as vllm_engine
    from magi2studio.studio import health

    monkeypatch.setattr(vllm_engine, "device_names", lambda: ["test GPU 0"])
    tree = synthetic_tree(tmp_path / "MAGI-2-preview")
    engine = vllm_engine.VllmOmniEngine(checkpoint_root=str(tree), work_dir=str(tmp_path / "work"))
    ctx = SimpleNamespace(slot=SimpleNamespace(closed=False, serving=True), engine=engine)
    with TestClient(Starlette(routes=health.routes(ctx))) as client:
        assert client.get(health.READY).json() == ready_on_the_installed_vllm_omni()
        # As on a vLLM-Omni whose pipeline has the refiner (0.30.0's has none): the weights decide 1080p.
        monkeypatch.setattr(vllm_engine, "tier_refusal", lambda caps, tier: None)
        assert (lambda r: (r.status_code, r.json()))(client.get(health.READY)) == (200, ALL_READY)
        shutil.rmtree(tree / "refiner")
        response = client.get(health.READY)
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["ready"] is True and body["reason"] is None
        assert body["tiers"]["272p"] == body["tiers"]["540p"] == {"ready": True, "reason": None}
        assert body["tiers"]["1080p"] == {"ready": False, "reason": f"weights {tree} incomplete for 1080p: refiner/ "
                                          "missing: the 1080p tier runs Sand AI's refiner checkpoint from here"}
        monkeypatch.setattr(vllm_engine, "device_names", lambda: [])
        body = client.get(health.READY).json()
        assert body["ready"] is False and body["reason"].startswith("no CUDA/MUSA GPU is visible here")
