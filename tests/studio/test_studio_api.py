"""The studio's /generate endpoint through gradio_client, on the embedded engine."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError

from magi2studio.run_folder import runs
from magi2studio.errors import InputError
from magi2studio.vocabulary.layouts import Layout, check_shape, parse_layout
from magi2studio.vocabulary.request import MAX_PROMPT_FILE_BYTES, Request, build_request

from studio_support import FAST_STEPS, everything_under, generate_args

VIDEO, WAV, MANIFEST = 0, 1, 2


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def video_path(value) -> str:
    return value["video"] if isinstance(value, dict) else value


def direct_run(studio, request: Request, tmp_path: Path) -> runs.RunFolder:
    """The same request straight through runs.execute on the studio's engine (the slot is idle)."""
    return runs.execute(studio.ctx.engine, request, parse_layout("sp1-cfg1"), tmp_path / "direct")


def assert_same_files(result, direct: runs.RunFolder) -> None:
    manifest = result[MANIFEST]
    assert manifest["hashes"]["frames_sha256"] == direct.manifest["hashes"]["frames_sha256"]
    assert manifest["hashes"]["pcm_sha256"] == direct.manifest["hashes"]["pcm_sha256"]
    assert sha256(video_path(result[VIDEO])) == sha256(direct.video)
    assert sha256(result[WAV]) == sha256(direct.wav)


@pytest.mark.slow
def test_t2va_files_match_a_direct_generate(studio, tmp_path):
    client = Client(studio.url, verbose=False)
    result = client.predict(**generate_args(seed=11), api_name="/generate")
    expected = build_request(mode="t2va", prompt=generate_args()["prompt"], seed=11, steps=FAST_STEPS)
    assert Request(**result[MANIFEST]["request"]) == expected
    assert_same_files(result, direct_run(studio, expected, tmp_path))


@pytest.mark.slow
def test_i2va_files_match_a_direct_generate(studio, tmp_path):
    from PIL import Image

    image = tmp_path / "first-frame.png"
    ramp = [(x * 255 // 447, y * 255 // 255, 128) for y in range(256) for x in range(448)]
    picture = Image.new("RGB", (448, 256))
    picture.putdata(ramp)
    picture.save(image)
    client = Client(studio.url, verbose=False)
    result = client.predict(**generate_args(mode="i2va", image=handle_file(str(image)), seed=5),
                            api_name="/generate")
    recorded = Request(**result[MANIFEST]["request"])
    # The server keeps the upload under its own name; everything else is what the client sent.
    assert Path(recorded.image).read_bytes() == image.read_bytes()
    expected = build_request(mode="i2va", prompt=generate_args()["prompt"], image=recorded.image, seed=5,
                             steps=FAST_STEPS)
    assert recorded == expected
    assert_same_files(result, direct_run(studio, expected, tmp_path))


EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "generate_api.py"


@pytest.mark.slow
def test_the_documented_example_needs_only_the_prompt(studio, tmp_path):
    """docs/examples/generate_api.py sends the prompt (and here seed and steps) and nothing else:
    every other /generate parameter takes the page's default, the files and negative prompt included."""
    prompt = "A lighthouse blinks at dusk; waves slap the rocks."
    done = subprocess.run([sys.executable, str(EXAMPLE), studio.url, prompt, "--seed", "13",
                           "--steps", str(FAST_STEPS)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    expected = build_request(mode="t2va", prompt=prompt, seed=13, steps=FAST_STEPS)
    assert Request(**printed["request"]) == expected
    direct = direct_run(studio, expected, tmp_path)
    assert printed["hashes"]["frames_sha256"] == direct.manifest["hashes"]["frames_sha256"]
    assert sha256(printed["video"]) == sha256(direct.video)


def refusal(studio, **overrides) -> str:
    before = everything_under(studio.outputs)
    with pytest.raises(AppError) as caught:
        Client(studio.url, verbose=False).predict(**generate_args(**overrides), api_name="/generate")
    assert everything_under(studio.outputs) == before, "a refused request wrote to the outputs root"
    return str(caught.value)


def test_an_upload_that_is_not_an_image_is_refused_in_the_clis_words(studio, tmp_path):
    fake = tmp_path / "photo.png"
    fake.write_text("this is text, not a PNG", encoding="utf-8")
    message = refusal(studio, mode="i2va", image=handle_file(str(fake)))
    assert message.startswith("image: ") and message.endswith("is not an image. Fix: give a JPEG or PNG file")


def test_a_prompt_file_over_the_limit_is_refused_in_the_clis_words(studio, tmp_path):
    big = tmp_path / "prompt.txt"
    big.write_text("x" * (MAX_PROMPT_FILE_BYTES + 1), encoding="utf-8")
    message = refusal(studio, prompt="", prompt_file=handle_file(str(big)))
    assert message.startswith("prompt_file: ")
    assert message.endswith(f"is {MAX_PROMPT_FILE_BYTES + 1} bytes. Fix: use a prompt file under 256 KiB")


@pytest.mark.parametrize("sp, cfg, ep, layout", [(2, 3, None, Layout(2, 3)), (4, 1, 3, Layout(4, 1, 3))])
def test_a_custom_layout_that_breaks_a_rule_is_refused_in_the_vocabularys_words(studio, sp, cfg, ep, layout):
    with pytest.raises(InputError) as vocabulary:
        check_shape(layout)
    assert refusal(studio, layout_preset="custom", sp=sp, cfg=cfg, ep=ep) == str(vocabulary.value)


def test_a_layout_the_engine_cannot_run_is_refused_with_the_engines_reason(studio):
    from magi2studio.vocabulary.tiers import get_tier

    with pytest.raises(InputError) as engine:
        studio.ctx.engine.check_layout(Layout(8, 1), get_tier("272p"))
    assert refusal(studio, layout_preset="custom", sp=8, cfg=1) == str(engine.value)


def test_a_bad_field_is_refused_like_the_cli(studio):
    with pytest.raises(InputError) as vocabulary:
        build_request(prompt="p", seed=7, steps=0)
    assert refusal(studio, steps=0) == str(vocabulary.value)
    assert refusal(studio, prompt="   ").startswith("prompt: is empty")


def test_a_tier_the_engine_cannot_run_is_refused_with_its_reason(studio, monkeypatch):
    # The embedded engine runs every tier; greying out is the real engine's case (no refiner on 0.30.0).
    reason = "vLLM-Omni 0.30.0 has no MAGI-2 refiner"
    monkeypatch.setitem(studio.ctx.capabilities.tiers, "1080p", reason)
    assert reason in refusal(studio, tier="1080p")


@pytest.mark.slow
def test_1080p_runs_on_the_embedded_engine_with_the_refiner_steps_control(studio):
    """The 1080p tier from the page: the refiner-steps field sets the refiner stage's steps.

    Deterministic off: this checks the field's way to the refiner, not the bits (tests/refiner checks 1080p bit
    for bit across layouts). Its exact products made each 1080p refiner step take about 61 s on 2 cores, quiet,
    against about 4 s without: 185 s for this test before, quiet."""

    client = Client(studio.url, verbose=False)
    result = client.predict(**generate_args(tier="1080p", steps=FAST_STEPS, refiner_steps="2", seed=3,
                                            deterministic=False), api_name="/generate")
    manifest = result[MANIFEST]
    assert manifest["request"]["tier"] == "1080p" and manifest["request"]["refiner_steps"] == 2
    assert manifest["request"]["deterministic"] is False
    assert manifest["resolved"]["output_size"] == "1920x1088"
    assert manifest["timing"]["stages"]["refiner"]["steps"] == 2
    output = manifest["output"]
    assert (output["width"], output["height"], output["frames"]) == (1920, 1088, 249)
