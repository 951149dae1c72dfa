"""The detectors score generated scenes as matching their own captions, read back through a
run folder written by the project's writer, and as not matching when one fact is changed."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from magi2studio.semantic import scenes
from magi2studio.semantic.scenes import Facts, make_scene
from magi2studio.semantic.score import (FIRST_FRAME_MIN_PSNR_DB, analyse_audio, analyse_video, judge, observe,
                                        score_clip, score_run)
from magi2studio.vocabulary.tiers import TIERS

from .conftest import save_first_frame, write_scene_run

SAMPLE_IMAGE = Path(__file__).resolve().parents[2] / "magi2studio" / "data" / "sandai" / "assets" / "sample_001.jpeg"
JUDGED = ("background", "colour", "shape", "motion", "pitch", "beeps")
# One held-out scene per path; together they cover every shape, background and pitch, and six colours.
BY_MOTION = [scenes.HELD_OUT[i] for i in (8, 0, 19, 9, 3, 20)]


@pytest.fixture(scope="module")
def scene_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("scene-runs")
    return [(facts, write_scene_run(make_scene(facts, TIERS["272p"], 7), root)) for facts in BY_MOTION]


@pytest.fixture(scope="module")
def clip():
    """A scene, its arrays and what the detectors made of them (observed once, judged often)."""

    scene = make_scene(Facts("square", "blue", "right_to_left", "black", "low", True), TIERS["272p"], 4)
    frames, audio = scene.frames(), scene.audio()
    return scene, frames, audio, observe(frames, audio, scene.fps, scene.sample_rate)


def _with_audio(clip, audio):
    scene, _, _, seen = clip
    return judge(scene.facts, dataclasses.replace(seen, audio=analyse_audio(audio, scene.sample_rate)))


def test_the_sample_covers_every_value():
    assert [f.motion for f in BY_MOTION] == list(scenes.MOTIONS)
    for name, values in (("shape", scenes.SHAPES), ("background", scenes.BACKGROUNDS), ("pitch", scenes.PITCHES)):
        assert {getattr(f, name) for f in BY_MOTION} == set(values), name
    assert len({f.colour for f in BY_MOTION}) == 6


def test_each_scene_run_matches_its_own_caption(scene_runs):
    for facts, folder in scene_runs:
        result = score_run(folder)
        assert result.facts == facts
        assert [v.attribute for v in result.verdicts] == list(JUDGED)
        assert result.all_match and all(v.match is True for v in result.verdicts), \
            "\n".join(v.line() for v in result.verdicts)
        assert result.verdict("beeps").value == 1.0


def _only_mismatch(result, attribute):
    wrong = [v.attribute for v in result.verdicts if v.match is False]
    assert wrong == [attribute], "\n".join(v.line() for v in result.verdicts)


@pytest.mark.parametrize("change, attribute", [
    ({"colour": "red"}, "colour"), ({"colour": "purple"}, "colour"), ({"shape": "circle"}, "shape"),
    ({"shape": "triangle"}, "shape"), ({"motion": "left_to_right"}, "motion"), ({"motion": "side_to_side"}, "motion"),
    ({"motion": "top_to_bottom"}, "motion"), ({"pitch": "high"}, "pitch"), ({"background": "white"}, "background"),
])
def test_a_changed_caption_fact_is_the_one_mismatch(clip, change, attribute):
    scene, _, _, seen = clip
    assert judge(scene.facts, seen).all_match
    _only_mismatch(judge(dataclasses.replace(scene.facts, **change), seen), attribute)


def test_shapes_drawn_in_whole_16_pixel_cells_keep_their_names():
    """The trained engine's video code draws one colour per 16-pixel cell (its centre pixel): a triangle
    becomes a staircase filling up to 0.69 of its box, a circle as little as 0.67. Fill alone called 2 of
    these 8 held-out triangles circles; the mass sitting low in an apex-up triangle tells them apart."""
    seen = {}
    for index, facts in enumerate(scenes.HELD_OUT):
        frames = make_scene(facts, TIERS["272p"], 42 + index).frames()[::2]
        cells = frames[:, 8::16, 8::16].repeat(16, axis=1).repeat(16, axis=2)
        seen[index] = (facts.shape, analyse_video(cells).shape)
    wrong = {index: pair for index, pair in seen.items() if pair[0] != pair[1]}
    assert not wrong, wrong
    assert {shape for shape, _ in seen.values()} == set(scenes.SHAPES)


@pytest.mark.parametrize("frames_shift, matches", [(1, True), (-2, True), (3, False), (-3, False), (6, False)])
def test_beeps_shifted_off_the_bounces_mismatch_beyond_two_frames(clip, frames_shift, matches):
    scene, _, audio, _ = clip
    result = _with_audio(clip, np.roll(audio, int(round(frames_shift / scene.fps * scene.sample_rate)), axis=0))
    if matches:
        assert result.all_match, "\n".join(v.line() for v in result.verdicts)
    else:
        _only_mismatch(result, "beeps")


def test_missing_or_extra_beeps_mismatch(clip):
    scene, _, audio, _ = clip
    cut = audio.copy()
    first = int(scene.bounce_times[0] * scene.sample_rate)
    cut[first:first + int(0.2 * scene.sample_rate)] = 0
    _only_mismatch(_with_audio(clip, cut), "beeps")
    extra = audio + np.roll(audio, int(0.5 * scene.sample_rate), axis=0)  # a second beep half a second later
    _only_mismatch(_with_audio(clip, extra), "beeps")


def test_an_empty_clip_or_noise_is_judged_not_crashed(clip):
    scene, frames, audio, _ = clip
    blank = np.broadcast_to(frames[:1, :2, :2].mean(axis=(1, 2), keepdims=True), frames.shape).astype(np.uint8)
    result = score_clip(scene.facts, blank, np.zeros_like(audio), scene.fps, scene.sample_rate)
    assert {v.attribute for v in result.verdicts if v.match is False} == {"colour", "shape", "motion", "beeps"}
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (25, *frames.shape[1:]), dtype=np.uint8)  # 2 s: labelling noise is slow
    result = score_clip(scene.facts, noise, rng.standard_normal(audio.shape).astype(np.float32) * 0.3,
                        scene.fps, scene.sample_rate)
    assert not result.all_match and all(v.match is not None for v in result.verdicts)


def test_i2va_first_frame_against_its_image_and_against_another(tmp_path):
    scene = make_scene(Facts("circle", "orange", "up_and_down", "grey", "high", True), TIERS["272p"], 2)
    own = write_scene_run(scene, tmp_path, image=save_first_frame(scene, tmp_path / "first.png"))
    good = score_run(own).verdict("first_frame")
    assert good.match and good.value >= FIRST_FRAME_MIN_PSNR_DB + 10, good.line()
    other = write_scene_run(scene, tmp_path, image=SAMPLE_IMAGE)
    result = score_run(other)
    bad = result.verdict("first_frame")
    assert bad.match is False and bad.value < FIRST_FRAME_MIN_PSNR_DB, bad.line()
    assert [v.attribute for v in result.verdicts if v.match is False] == ["first_frame"]


def test_540p_scene_run_matches_its_caption(tmp_path):
    scene = make_scene(scenes.HELD_OUT[10], TIERS["540p"], 1)
    result = score_run(write_scene_run(scene, tmp_path))
    assert result.all_match, "\n".join(v.line() for v in result.verdicts)


@pytest.mark.slow
def test_1080p_scene_matches_its_caption_at_25_fps():
    scene = make_scene(scenes.HELD_OUT[5], TIERS["1080p"], 1)
    result = score_clip(scene.facts, scene.frames(), scene.audio(), scene.fps, scene.sample_rate)
    assert result.all_match, "\n".join(v.line() for v in result.verdicts)


def test_a_continuous_tone_is_named_as_such_not_counted_as_missing_beeps(clip):
    """Issue 28: the trained model's one loud tone read "0/0 bounces with a beep"."""

    scene, frames, audio, _ = clip
    t = np.arange(audio.shape[0]) / scene.sample_rate
    tone = np.repeat((0.5 * np.sin(2 * np.pi * scenes.PITCHES[scene.facts.pitch] * t))[:, None], audio.shape[1], 1)
    beeps = _with_audio(clip, tone.astype(np.float32)).verdict("beeps")
    assert beeps.match is False and beeps.observed.startswith("a continuous tone (loud for 100% of the clip)")
    assert _with_audio(clip, audio).verdict("beeps").match is True  # the scene's own beeps stay beeps


def _blotches(frames: np.ndarray, rgb: tuple[int, int, int], every: int, seed: int = 0) -> np.ndarray:
    """The trained model's failure (issue 28): a soft coloured blotch that jumps to a new place every ``every``
    frames (7 distinct images in 125 frames), on the scene's background; no object moves."""

    rng = np.random.default_rng(seed)
    count, height, width = frames.shape[:3]
    background = frames[0, :3, :3].reshape(-1, 3).mean(axis=0)
    ys, xs = np.mgrid[0:height, 0:width]
    out = np.empty_like(frames)
    for start in range(0, count, every):
        cy, cx = rng.uniform(0.25, 0.75) * height, rng.uniform(0.25, 0.75) * width
        weight = np.exp(-(((ys - cy) / (0.12 * height)) ** 2 + ((xs - cx) / (0.12 * width)) ** 2))[..., None]
        out[start:start + every] = (background * (1 - weight) + np.array(rgb) * weight).astype(np.uint8)
    return out


def test_a_blotch_that_jumps_between_places_is_no_object_even_in_the_captions_colour(clip):
    scene, frames, audio, _ = clip
    cast = _blotches(frames, scenes.COLOURS[scene.facts.colour], every=18)
    result = score_clip(scene.facts, cast, audio, scene.fps, scene.sample_rate)
    colour = result.verdict("colour")
    assert colour.match is False and colour.observed.startswith("no object"), colour.line()


def test_a_whole_frame_cast_in_the_captions_colour_is_no_object(clip):
    """Issue 28, item 5: the whole frame tinted toward the caption's colour, no object anywhere, is a colour
    mismatch ("no object"), never "colour: match"."""

    scene, frames, audio, _ = clip
    background = frames[0, :3, :3].reshape(-1, 3).mean(axis=0)
    for share in (0.3, 0.6, 1.0):
        tint = background * (1 - share) + np.array(scenes.COLOURS[scene.facts.colour]) * share
        cast = np.broadcast_to(tint.astype(np.uint8), frames.shape).copy()
        colour = score_clip(scene.facts, cast, audio, scene.fps, scene.sample_rate).verdict("colour")
        assert colour.match is False and colour.observed.startswith("no object"), (share, colour.line())
