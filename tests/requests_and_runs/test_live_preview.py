"""The live preview: written during a run (every N steps, the right shape), off when asked, recorded."""

import io
import itertools
import json
import sys
from pathlib import Path

import pytest
from PIL import Image

import numpy as np
from PIL import ImageSequence

from magi2studio.engines.live_preview import PREVIEW_MAPS, LinearPreviewMap, encode_gif
from magi2studio.vocabulary.request import build_request

ROOT = Path(__file__).resolve().parents[2]
HELD_OUT_PSNR_FLOOR_DB = 25.0  # measured 28.87 dB on 8 held-out scenes (seed 30); a constant picture: 8.02 dB


@pytest.fixture(scope="module")
def trained_engine():
    from magi2studio.engines import get_engine
    from magi2studio.vocabulary.layouts import parse_layout

    eng = get_engine("embedded", weights="trained")
    eng.start(parse_layout("sp1-cfg1"))
    yield eng
    eng.close()


def _run(engine, **fields):
    request = build_request(prompt="a red ball bounces left to right on a blue floor", seed=7, steps=4, **fields)
    plan = engine.plan(request, engine.layout)
    seen = []

    def on_progress(event):
        if event.preview:
            seen.append((event.step, event.preview, Image.open(event.preview)))

    generation = engine.generate(plan, on_progress=on_progress)
    return plan, generation, seen


def test_preview_written_every_n_steps_with_the_latent_grid_shape(trained_engine):
    plan, generation, seen = _run(trained_engine, preview_every=2)
    assert [step for step, _, _ in seen] == [1, 3]  # steps 2 and 4 (0-based 1 and 3), each named once
    image = seen[-1][2]
    assert image.format == "GIF" and image.n_frames == trained_engine.config.latent_frames
    stride = trained_engine.config.spatial_stride
    rows, columns = 256 // stride, 448 // stride  # 272p's latent grid (4 x 7), 8 x 8 pixels a cell: 32 x 56,
    assert image.size == (columns * 8 * 3, rows * 8 * 3)  # enlarged x3 to a shorter side >= MIN_SIDE (96)
    assert plan.resolved["preview_every"] == 2
    assert generation.resolved["live_preview"] == {"every": 2, "map": "tiny-trained"}
    assert not Path(seen[-1][1]).exists()  # the engine's folder goes with the run


def test_the_gif_shows_each_frame_in_its_place_enlarged_by_whole_pixels():
    rng = np.random.default_rng(3)
    colours = rng.integers(0, 256, size=(12, 3), dtype=np.uint8)
    frames = colours[rng.integers(0, 12, size=(5, 32, 56))]  # 5 frames of 12 colours, each frame its own
    image = Image.open(io.BytesIO(encode_gif(frames)))
    shown = np.stack([np.asarray(frame.convert("RGB")) for frame in ImageSequence.Iterator(image)])
    assert shown.shape == (5, 96, 168, 3) and image.info["loop"] == 0
    assert np.array_equal(shown, frames.repeat(3, axis=1).repeat(3, axis=2))


def test_preview_off_when_asked(trained_engine):
    _, generation, seen = _run(trained_engine, preview_every=0)
    assert seen == [] and generation.resolved["live_preview"] == "off"


def test_preview_every_out_of_range_is_named():
    from magi2studio.errors import InputError

    with pytest.raises(InputError, match=r"^preview_every: -1 is out of range\. Fix: use 0 \(off\)"):
        build_request(prompt="x", preview_every=-1)
    assert build_request(prompt="x", preview_every=0).preview_every == 0


def test_fitted_map_beats_its_floor_on_held_out_latents():
    sys.path.insert(0, str(ROOT / "scripts"))
    from fit_preview_map import latents_and_targets, psnr

    from magi2studio.engines.embedded.components import load_components
    from magi2studio.engines.embedded.tiny_weights import checkpoint_folder
    from magi2studio.semantic.scenes import sample_scenes

    fitted = LinearPreviewMap.read(PREVIEW_MAPS / "tiny-trained.json")
    held = list(itertools.islice(sample_scenes(fitted.fit["seed"] + 1, split="held_out"), 3))
    x, y, _, _ = latents_and_targets(load_components(checkpoint_folder("trained")), held, fitted.patch)
    assert psnr(x @ fitted.weight + fitted.bias, y) > HELD_OUT_PSNR_FLOOR_DB
    assert json.loads((PREVIEW_MAPS / "tiny-trained.json").read_text())["fit"]["script"] == "scripts/fit_preview_map.py"


def test_a_blank_preview_setting_dumps_as_requests_did_before_it_existed():
    """Earlier runs' manifests hold no preview_every: verify_run and reproduce's keys compare dumps."""

    from magi2studio.vocabulary.request import Request

    before = ["mode", "prompt", "prompt_file", "image", "negative_prompt", "seed", "tier", "steps", "refiner_steps",
              "video_cfg", "audio_cfg", "compile", "deterministic", "output_width", "output_height"]
    request = build_request(prompt="a kite", seed=3)
    assert list(request.model_dump(mode="json")) == before and "preview_every" not in request.to_yaml()
    assert Request.from_yaml(request.to_yaml()) == request
    assert build_request(prompt="a kite", preview_every=3).model_dump(mode="json")["preview_every"] == 3


def test_each_committed_map_is_found_for_its_decoder(tmp_path):
    """The trained folder's decoder and a freshly generated random tree's (what a new machine makes)."""

    from magi2studio.engines import get_engine
    from magi2studio.engines.embedded.tiny_weights import checkpoint_folder
    from magi2studio.engines.live_preview import decoder_digest, map_for_decoder

    trained = checkpoint_folder("trained") / "turbo_vae"
    assert map_for_decoder(decoder_digest(trained)) == PREVIEW_MAPS / "tiny-trained.json"
    fresh = get_engine("embedded", checkpoint_root=tmp_path).checkpoint()  # generated as the engine does
    assert map_for_decoder(decoder_digest(fresh / "turbo_vae")) == PREVIEW_MAPS / "tiny-random.json"
