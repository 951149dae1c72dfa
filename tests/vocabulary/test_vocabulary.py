"""Validation rules, table-driven: each bad input names its field, and nothing touches disk."""

import io
from pathlib import Path

import pytest
from PIL import Image

from magi2studio.errors import InputError
from magi2studio.vocabulary.layouts import PRESETS, Layout, memory_per_gpu_gib, parse_layout, rules_for_real_model
from magi2studio.vocabulary.request import Request, build_request, check_image, read_prompt_file
from magi2studio.vocabulary.tiers import TIERS, get_tier

from magi2studio.reproduction.samples import BUNDLED_DIR

SAMPLES = BUNDLED_DIR / "assets"  # the bundled sample set's prompt files


def _png(path: Path, size=(64, 48)) -> Path:
    Image.new("RGB", size, (10, 200, 30)).save(path)
    return path


def test_tiers_match_upstream_and_sand_ai():
    assert (TIERS["272p"].width, TIERS["272p"].height, TIERS["272p"].frames, TIERS["272p"].fps) == (448, 256, 125, 12.5)
    assert (TIERS["540p"].width, TIERS["540p"].height, TIERS["540p"].steps) == (896, 512, 100)
    hd = TIERS["1080p"]
    assert (hd.width, hd.height, hd.fps, hd.frames, hd.preview, hd.refiner_steps) == (1920, 1088, 25.0, 249, "540p", 5)
    from vllm_omni.diffusion.models.magi2.pipeline_magi2 import _RESOLUTION_PRESETS
    for name, (w, h) in _RESOLUTION_PRESETS.items():
        assert (TIERS[name].width, TIERS[name].height) == (w, h)


def test_a_refined_tier_names_its_preview_tier():
    assert TIERS["1080p"].preview_tier is TIERS["540p"]
    assert TIERS["272p"].preview_tier is TIERS["272p"] and TIERS["540p"].preview_tier is TIERS["540p"]


@pytest.mark.parametrize("text,expected", [
    ("sp2-cfg1", Layout(2, 1)), ("sp1-cfg2", Layout(1, 2)), ("sp8-cfg1-ep4", Layout(8, 1, 4)),
    ("SP4-CFG2", Layout(4, 2)), ("sp1-cfg1-offload", Layout(1, 1, offload=True)),
])
def test_layout_grammar(text, expected):
    assert parse_layout(text) == expected
    assert parse_layout(expected.name) == expected


def test_presets_cover_the_seed_rows():
    for name in ("sp8-cfg1-ep4", "sp8-cfg1-ep8", "sp8-cfg1", "sp4-cfg2", "sp4-cfg2-ep4", "sp4-cfg1-ep4",
                 "sp1-cfg1-offload"):
        assert name in PRESETS


@pytest.mark.parametrize("text,fragment", [
    ("sp2", "not a layout"), ("sp2-cfg3", "exactly two CFG branches"), ("sp8-cfg1-ep3", "does not divide"),
    ("sp2-cfg1-offload", "single-worker"), ("banana", "not a layout"),
])
def test_bad_layouts(text, fragment):
    with pytest.raises(InputError) as err:
        parse_layout(text)
    assert err.value.field == "layout" and fragment in str(err.value) and "Fix:" in str(err.value)


def test_real_model_rules():
    tier = get_tier("272p")
    assert rules_for_real_model(parse_layout("sp8-cfg1-ep4"), tier, 80) == []
    warnings = rules_for_real_model(parse_layout("sp8-cfg1-ep8"), tier, 80)
    assert "pads the 12 MoE heads to 16" in warnings[0] and "2 GPUs" in warnings[0]
    with pytest.raises(InputError, match="raise the EP degree"):
        rules_for_real_model(parse_layout("sp8-cfg1-ep2"), tier, 80)
    with pytest.raises(InputError, match="4 or 8 workers"):
        rules_for_real_model(parse_layout("sp2-cfg1"), tier)
    with pytest.raises(InputError, match="attention heads"):
        rules_for_real_model(parse_layout("sp5-cfg1"), tier)
    with pytest.raises(InputError, match="VAE patch-parallel"):
        rules_for_real_model(Layout(8, 1, 4, vae_pp=1), get_tier("1080p"))
    assert rules_for_real_model(parse_layout("sp8-cfg1-ep4"), get_tier("1080p")) == []
    assert memory_per_gpu_gib(parse_layout("sp8-cfg1-ep4")) < 80 < memory_per_gpu_gib(parse_layout("sp8-cfg1-ep2"))


def test_request_round_trips_through_yaml():
    request = build_request(prompt="a cat", seed=3, tier="540p", steps=8, compile="dynamic", negative_prompt="blur")
    assert Request.from_yaml(request.to_yaml()) == request


BAD_REQUESTS = [
    ({"prompt": "   "}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": "x", "mode": "i2va"}, "image"),
    ({"prompt": "x", "tier": "4k"}, "tier"),
    ({"prompt": "x", "steps": 0}, "steps"),
    ({"prompt": "x", "steps": 100000}, "steps"),
    ({"prompt": "x", "seed": -1}, "seed"),
    ({"prompt": "x", "seed": 1.5}, "seed"),
    ({"prompt": "x", "seed": "abc"}, "seed"),
    ({"prompt": "x", "colour": "red"}, "colour"),
    ({"prompt": "x", "video_cfg": float("nan")}, "video_cfg"),
    ({"prompt": "x", "compile": "fast"}, "compile"),
]


@pytest.mark.parametrize("fields,field", BAD_REQUESTS)
def test_bad_requests_name_their_field(fields, field):
    with pytest.raises(InputError) as err:
        build_request(**fields)
    assert err.value.field == field
    assert "\n" not in str(err.value) and "Fix:" in str(err.value)


def test_bad_request_yaml():
    with pytest.raises(InputError) as err:
        Request.from_yaml("prompt: hi\nsteps: many\n")
    assert err.value.field == "steps"
    with pytest.raises(InputError) as err:
        Request.from_yaml("prompt: [unclosed\n")
    assert err.value.field == "request"
    with pytest.raises(InputError) as err:
        Request.from_yaml("- just a list\n")
    assert err.value.field == "request"


def test_prompt_files(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        read_prompt_file(tmp_path / "missing.txt")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(InputError, match="not UTF-8"):
        read_prompt_file(tmp_path / "latin1.txt")
    (tmp_path / "big.txt").write_text("a" * 300_000)
    with pytest.raises(InputError, match="under 256 KiB"):
        read_prompt_file(tmp_path / "big.txt")
    assert read_prompt_file(SAMPLES / "sample_000.txt").startswith("# global_caption")


def test_images(tmp_path):
    assert check_image(_png(tmp_path / "ok.png")) == (64, 48)
    with pytest.raises(InputError, match="does not exist"):
        check_image(tmp_path / "none.png")
    (tmp_path / "text.png").write_text("not an image")
    with pytest.raises(InputError, match="not an image"):
        check_image(tmp_path / "text.png")
    data = io.BytesIO()
    Image.new("RGB", (256, 256), (1, 2, 3)).save(data, format="JPEG")
    (tmp_path / "cut.jpg").write_bytes(data.getvalue()[: len(data.getvalue()) // 2])
    with pytest.raises(InputError, match="truncated or corrupt"):
        check_image(tmp_path / "cut.jpg")
    with pytest.raises(InputError, match="sides from"):
        check_image(_png(tmp_path / "huge.png", (9000, 100)))
    with pytest.raises(InputError, match="aspect ratio"):
        check_image(_png(tmp_path / "thin.png", (2000, 100)))


def test_t2va_with_image_is_refused(tmp_path):
    with pytest.raises(InputError) as err:
        build_request(prompt="x", image=str(_png(tmp_path / "a.png")))
    assert err.value.field == "image"
