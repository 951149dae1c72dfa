"""The 1080p tier end to end on the embedded engine: the mp4, the audio, the step records, the plot."""

import json

import av
import numpy as np
import pytest

from magi2studio.run_folder import runs
from magi2studio.vocabulary.layouts import parse_layout
from magi2studio.vocabulary.request import build_request
from magi2studio.studio.results import timing_frame
from magi2studio.engines.timing import read_jsonl

PROMPT = "a red kite over a windy beach, waves and gulls"


@pytest.fixture(scope="module")
def runs_1080_and_540(tmp_path_factory):
    """One 1080p run on two Ulysses ranks (the pool runs the refiner on every rank, block-window attention
    after the Ulysses exchange, and decodes with TurboVAE patch-parallel over both ranks; rank 0 returns the
    clip, resized to the listed 1920x1080), and the 540p run of the same seed on one rank. Layouts give one
    process's latents bit for bit (tests/vocabulary/test_layouts.py), so the preview stage's audio is the 540p
    run's. One 1080p run, not one per layout: each costs about two minutes of CI's 2-core machine."""
    from magi2studio.engines import get_engine

    out = tmp_path_factory.mktemp("refiner-runs")
    engine = get_engine("embedded")
    try:
        hd = runs.execute(engine, build_request(prompt=PROMPT, tier="1080p", steps=2, refiner_steps=2, seed=7,
                                                output_height=1080), parse_layout("sp2-cfg1"), out)
        preview = runs.execute(engine, build_request(prompt=PROMPT, tier="540p", steps=2, seed=7),
                               parse_layout("sp1-cfg1"), out)
    finally:
        engine.close()
    return hd, preview


@pytest.mark.slow
def test_1080p_mp4_is_1920x1080_249_frames_25fps_with_10s_of_audio(runs_1080_and_540):
    hd, _ = runs_1080_and_540
    assert hd.manifest["output"] == {"frames": 249, "width": 1920, "height": 1080, "fps": 25.0,
                                     "audio_samples": 441000, "audio_channels": 2, "sample_rate": 44100}
    with av.open(str(hd.video)) as container:
        video, audio = container.streams.video[0], container.streams.audio[0]
        assert (video.codec_context.width, video.codec_context.height) == (1920, 1080)
        assert video.average_rate == 25 and video.frames == 249
        assert float(audio.duration * audio.time_base) == pytest.approx(10.0, abs=0.05)
        first = next(container.decode(video=0)).to_ndarray(format="rgb24")
    assert first.shape == (1080, 1920, 3)


@pytest.mark.slow
def test_1080p_audio_is_the_preview_stages_audio_bit_for_bit(runs_1080_and_540):
    hd, preview = runs_1080_and_540
    # The 1080p preview stage is the 540p run (same seed, steps, prompt); its audio is reused unchanged.
    assert hd.manifest["hashes"]["pcm_sha256"] == preview.manifest["hashes"]["pcm_sha256"]
    assert hd.wav.read_bytes() == preview.wav.read_bytes()
    assert hd.manifest["hashes"]["frames_sha256"] != preview.manifest["hashes"]["frames_sha256"]


@pytest.mark.slow
def test_refiner_steps_are_their_own_stage_in_steps_jsonl_the_manifest_and_the_plot(runs_1080_and_540):
    hd, preview = runs_1080_and_540
    records = [r for r in read_jsonl(hd.steps) if r["rank"] == 0]
    assert ([(r["stage"], r["step"]) for r in records]
            == [("preview", 0), ("preview", 1), ("refiner", 0), ("refiner", 1)])
    assert list(hd.manifest["timing"]["stages"]) == ["preview", "refiner"]
    assert hd.manifest["timing"]["stages"]["refiner"]["steps"] == 2
    assert hd.manifest["resolved"]["refiner_steps"] == 2 and hd.manifest["resolved"]["output_size"] == "1920x1080"
    assert preview.manifest["resolved"]["refiner_steps"] is None
    stages = {"encode", "preview", "refiner", "decode_video", "decode_audio", "mux"}
    assert stages <= set(hd.manifest["timing"]["stage_ms"])
    frame = timing_frame(records)
    series = set(frame["series"])
    assert any(s.startswith("refiner") for s in series) and any(s.startswith("preview") for s in series)
    refiner_ms = set(frame[frame["series"].str.startswith("refiner")]["ms"])
    assert refiner_ms == {r["ms"] for r in records if r["stage"] == "refiner"}
    assert json.loads((hd.path / "manifest.json").read_text())["engine"]["embedded"] is True


@pytest.mark.slow
def test_1080p_on_two_ulysses_ranks(runs_1080_and_540):
    hd, _ = runs_1080_and_540
    records = read_jsonl(hd.steps)
    assert (sorted({(r["rank"], r["stage"]) for r in records})
            == [(0, "preview"), (0, "refiner"), (1, "preview"), (1, "refiner")])
    assert len(records) == 8 and np.isfinite([r["ms"] for r in records]).all()
    assert hd.manifest["layout"]["name"] == "sp2-cfg1"
