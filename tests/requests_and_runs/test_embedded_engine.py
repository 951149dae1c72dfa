"""The embedded engine end to end: upstream loading, determinism, the CLI's mp4, replay."""

import json
import os
import subprocess
import sys
from pathlib import Path

import av
import pytest

from magi2studio.engines.embedded.tiny_weights import TRAINED_SHA256, WEIGHTS_ENV
from magi2studio.run_folder import runs
from magi2studio.errors import Cancelled, InputError
from magi2studio.vocabulary.layouts import parse_layout
from magi2studio.vocabulary.request import build_request

from .conftest import SAMPLES

LAYOUT = parse_layout("sp1-cfg1")


def test_tiny_checkpoint_is_in_the_released_layout_and_loads_through_upstream(engine):
    from vllm_omni.diffusion.models.magi2.pipeline_magi2 import _REQUIRED_CHECKPOINT_PATHS

    root = Path(engine.info()["checkpoint"])
    for relative in _REQUIRED_CHECKPOINT_PATHS:
        assert (root / relative).is_file(), relative
    index = json.loads((root / "preview" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 2
    # Magi2PreviewTransformer.load_weights is strict: every tensor of the model was loaded (on the rank).
    from magi2studio.engines.embedded import upstream_patches
    from magi2studio.engines.embedded.components import load_transformer, read_tiny_config

    upstream_patches.init_world_of_one()
    try:
        model, _ = load_transformer(read_tiny_config(root), root)
    finally:
        upstream_patches.destroy_parallel()
    assert engine.info()["loaded_weights"] == {"rank0": len(model.state_dict())}


def test_same_request_same_hashes_other_seed_other_hashes(engine, request_t2va, tmp_path):
    first = runs.execute(engine, request_t2va, LAYOUT, tmp_path)
    second = runs.execute(engine, request_t2va, LAYOUT, tmp_path)
    other = runs.execute(engine, request_t2va.model_copy(update={"seed": 8}), LAYOUT, tmp_path)
    h1, h2, h3 = (f.manifest["hashes"] for f in (first, second, other))
    assert (h1["frames_sha256"], h1["pcm_sha256"]) == (h2["frames_sha256"], h2["pcm_sha256"])
    assert h1["frames_sha256"] != h3["frames_sha256"] and h1["pcm_sha256"] != h3["pcm_sha256"]
    manifest = first.manifest
    assert manifest["engine"]["embedded"] is True and manifest["engine"]["name"] == "embedded"
    assert [r["step"] for r in map(json.loads, first.steps.read_text().splitlines())] == [0, 1, 2]
    assert manifest["timing"]["stages"]["preview"]["steps"] == 3
    for name, digest in manifest["files"].items():
        from magi2studio.media import file_sha256
        assert file_sha256(first.path / name) == digest


def test_i2va_uses_the_image(engine, tmp_path):
    base = dict(prompt="a clay figure waves", steps=2, seed=1)
    t2va = runs.execute(engine, build_request(**base), LAYOUT, tmp_path)
    i2va = runs.execute(engine, build_request(**base, mode="i2va", image=str(SAMPLES / "sample_001.jpeg")),
                        LAYOUT, tmp_path)
    assert t2va.manifest["hashes"]["frames_sha256"] != i2va.manifest["hashes"]["frames_sha256"]


def test_cancel_leaves_no_run_folder(engine, request_t2va, tmp_path):
    import threading

    cancel = threading.Event()

    def on_progress(event):
        if event.step == 0:
            cancel.set()

    with pytest.raises(Cancelled):
        runs.execute(engine, request_t2va, LAYOUT, tmp_path, on_progress=on_progress, cancel=cancel)
    assert list(tmp_path.iterdir()) == []


def test_engine_refuses_layouts_it_cannot_run_and_runs_every_tier(engine):
    from magi2studio.vocabulary.layouts import Layout
    from magi2studio.vocabulary.tiers import TIERS, get_tier
    assert all(reason is None for reason in engine.capabilities().tiers.values()) and "1080p" in TIERS
    engine.check_layout(LAYOUT, get_tier("1080p"))
    with pytest.raises(InputError, match="refiner KV groups"):
        engine.check_layout(Layout(4, 1), get_tier("1080p"))


def _cli(*args, cwd, weights: str | None = "random"):
    """The CLI in a subprocess; ``weights``: its $MAGI2_EMBEDDED_WEIGHTS, None for none (the default)."""
    env = {key: value for key, value in os.environ.items() if key != WEIGHTS_ENV}
    return subprocess.run([sys.executable, "-m", "magi2studio.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env=env if weights is None else {**env, WEIGHTS_ENV: weights})


@pytest.mark.slow
def test_cli_generate_writes_a_playable_mp4_seed_minus_one_draws_a_seed_and_replay_matches(tmp_path):
    """One CLI run and its replay (each a process that starts the engine: about a minute of CI's 2 cores)."""
    out = tmp_path / "outputs"
    result = _cli("generate", "--prompt-file", str(SAMPLES / "sample_000.txt"), "--seed", "-1", "--steps", "3",
                  "--out", str(out), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    (folder,) = [p for p in out.iterdir() if runs.is_complete(p)]
    manifest = json.loads((folder / "manifest.json").read_text())
    drawn = manifest["request"]["seed"]
    assert 0 <= drawn < 2**31 and manifest["resolved"]["seed_asked"] == -1
    assert f"seed: -1 drew {drawn}" in result.stderr and f"t2va-272p-s{drawn}-" in folder.name
    with av.open(str(folder / "video.mp4")) as container:
        (video,) = container.streams.video
        (audio,) = container.streams.audio
        assert (video.codec_context.name, video.width, video.height) == ("h264", 448, 256)
        assert (audio.codec_context.name, audio.sample_rate, audio.channels) == ("aac", 44100, 2)
        assert "magi2studio_request" in container.metadata["comment"]
        frames = sum(1 for _ in container.decode(video=0))
    with av.open(str(folder / "video.mp4")) as container:
        samples = sum(f.samples for f in container.decode(audio=0))
    assert frames == 125
    assert abs(samples / 44100 - 10.0) < 0.05
    replay = _cli("replay", str(folder), cwd=tmp_path)  # the drawn seed is the request's: it repeats
    assert replay.returncode == 0, replay.stderr[-2000:]
    assert "frames_sha256: match" in replay.stdout and "pcm_sha256: match" in replay.stdout


@pytest.mark.slow
def test_the_default_weights_are_the_trained_ones_and_replay_runs_what_the_run_recorded(tmp_path):
    """issue 28: trained is the default; a replay runs the manifest's weights, not the shell's default."""
    out = tmp_path / "outputs"
    result = _cli("generate", "--prompt", "a red circle on a white background", "--steps", "2", "--out", str(out),
                  cwd=tmp_path, weights=None)
    assert result.returncode == 0, result.stderr[-2000:]
    (folder,) = [p for p in out.iterdir() if runs.is_complete(p)]
    engine = json.loads((folder / "manifest.json").read_text())["engine"]
    assert engine["weights_sha256"] == TRAINED_SHA256
    replay = _cli("replay", str(folder), cwd=tmp_path, weights="random")  # $MAGI2_EMBEDDED_WEIGHTS asks for random
    assert replay.returncode == 0, replay.stdout + replay.stderr[-2000:]
    assert "frames_sha256: match" in replay.stdout and "pcm_sha256: match" in replay.stdout


BAD_CLI = [
    (["--prompt", "  "], "prompt"),
    (["--prompt-file", "missing.txt"], "prompt_file"),
    (["--prompt", "x", "--image", "missing.png"], "image"),
    (["--prompt", "x", "--tier", "8k"], "tier"),
    (["--prompt", "x", "--layout", "sp2-cfg3"], "layout"),
    (["--prompt", "x", "--steps", "0"], "steps"),
    (["--prompt", "x", "--seed", "-3"], "seed"),
    (["--prompt", "x", "--seed", "4.5"], "seed"),
    (["--prompt", "x", "--out", "/dev/null/outputs"], "out"),  # under a file (an unwritable folder: exit 1)
    (["--request", "req.yaml"], "colour"),
]


@pytest.mark.parametrize("args,field", BAD_CLI)
def test_cli_bad_input_exit_2_one_line_nothing_written(args, field, tmp_path):
    (tmp_path / "req.yaml").write_text("prompt: hi\ncolour: red\n")
    result = _cli("generate", *args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-1500:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:"), result.stderr[-1500:]
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["req.yaml"]
