"""The Generate form derived from the request model, the seed draw, refusals naming the user's file, and
the layout picker's view of the embedded engine (fast: no run, no server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from magi2studio.engines.embedded.engine import EmbeddedEngine
from magi2studio.errors import InputError
from magi2studio.vocabulary.layouts import PRESETS, parse_layout
from magi2studio.vocabulary.request import DRAWN_SEED_BOUND, RANDOM_SEED, Request, build_request
from magi2studio.studio import form as F
from magi2studio.studio import layout_picker as LP
from magi2studio.vocabulary.tiers import TIERS


@pytest.fixture(scope="module")
def engine():
    engine = EmbeddedEngine()  # not started: plan and check_layout need no ranks
    yield engine
    engine.close()


def plan(engine, **values):
    return F.plan_from_form({"layout_preset": "sp1-cfg1", **values}, engine.capabilities(), engine)


def test_the_form_has_every_request_field_in_the_models_order_then_the_layout():
    assert F.FIELDS[: len(Request.model_fields)] == tuple(Request.model_fields)
    assert F.FIELDS[len(Request.model_fields):] == ("layout_preset", "sp", "cfg", "ep")
    assert {"output_width", "output_height"} <= set(F.FIELDS)
    assert set(F.OPTIONAL_WHOLE) == {"steps", "refiner_steps", "preview_every", "output_width", "output_height"}


def test_every_field_has_an_error_line_next_to_it_and_a_label():
    for name in F.FIELDS:
        assert F.box_for(name) != "general", f"{name} has no error line of its own group"
    for name in Request.model_fields:
        assert F.label(name) != name, f"{name} has no title in the request model"
    for name in ("video_cfg", "audio_cfg", "compile", "deterministic"):
        assert len(F.help_text(name) or "") > 30, f"{name} has no help text"


def test_a_manifest_refills_the_form_and_the_form_plans_the_same_request(engine):
    request = build_request(prompt="a kite", seed=9, steps=4, tier="1080p", refiner_steps=2, output_height=1080,
                            video_cfg=4.5, compile="eager")
    layout = parse_layout("sp2-cfg1")
    values = F.values_from_manifest({"request": request.model_dump(mode="json"), "layout": layout.as_dict()})
    by_name = dict(zip(F.FIELDS, values))
    assert (by_name["steps"], by_name["output_width"], by_name["output_height"]) == (4, "", 1080)
    assert (by_name["layout_preset"], by_name["sp"], by_name["ep"]) == ("sp2-cfg1", 2, "")
    assert (by_name["image"], by_name["prompt_file"], by_name["negative_prompt"]) == (None, None, "")
    again = F.plan_from_form(by_name, engine.capabilities(), engine)
    assert again.request == request and again.layout == layout


def test_the_output_size_fields_reach_the_request_and_are_refused_in_the_clis_words(engine):
    assert plan(engine, prompt="p", tier="1080p", output_height="1080").resolved["output_size"] == "1920x1080"
    with pytest.raises(InputError, match=r"^output_height: 1000 is not an output size of the 1080p tier"):
        plan(engine, prompt="p", tier="1080p", output_height="1000")
    with pytest.raises(InputError, match=r"^output_width: 'wide' is not a whole number"):
        plan(engine, prompt="p", output_width="wide")


def test_seed_minus_one_draws_a_seed_and_the_plan_records_what_was_asked(engine):
    seeds = {plan(engine, prompt="p", seed=RANDOM_SEED).request.seed for _ in range(6)}
    assert len(seeds) > 1 and all(0 <= seed < DRAWN_SEED_BOUND for seed in seeds)
    drawn = plan(engine, prompt="p", seed="-1")
    assert drawn.resolved["seed_asked"] == RANDOM_SEED
    assert "seed_asked" not in plan(engine, prompt="p", seed=5).resolved
    with pytest.raises(InputError, match=r"^seed: -2 is out of range\. Fix: .*or -1 for a random seed$"):
        plan(engine, prompt="p", seed=-2)


def test_a_bad_upload_is_refused_naming_the_users_file_not_the_temp_copy(engine, tmp_path):
    upload = tmp_path / "3f9a1c0de" / "my prompt.txt"
    upload.parent.mkdir()
    upload.write_text("   \n", encoding="utf-8")
    with pytest.raises(InputError) as caught:
        plan(engine, prompt="", prompt_file=str(upload))
    assert "my prompt.txt" in str(caught.value) and str(upload.parent) not in str(caught.value)
    picture = tmp_path / "9b2e" / "frame.png"
    picture.parent.mkdir()
    picture.write_bytes(b"not a png")
    with pytest.raises(InputError) as caught:
        F.check_image_upload(str(picture))
    assert str(caught.value).startswith("image: frame.png is not an image") and str(picture.parent) not in str(
        caught.value)


def test_the_picker_offers_what_the_embedded_engine_runs_and_marks_the_rest_with_the_reason(engine):
    states = LP.preset_states(engine, TIERS["272p"])
    choices = LP.choices(states)
    refused = [label for label, _ in choices if label.startswith(LP.REFUSED_MARK)]
    assert any(label.startswith(f"{LP.REFUSED_MARK} sp8-cfg1-ep4:") and "at most 4" in label for label in refused)
    values = [value for _, value in choices]
    assert sorted(values) == sorted([*PRESETS, F.CUSTOM])
    first_refused = next(i for i, (label, _) in enumerate(choices) if label.startswith(LP.REFUSED_MARK))
    assert all(label.startswith(LP.REFUSED_MARK) for label, _ in choices[first_refused:]), "runnable ones come first"


def test_the_preset_and_its_fields_agree_on_first_load(engine):
    states = LP.preset_states(engine, TIERS["272p"])
    preset = LP.default_preset(engine, None, states)
    assert next(s for s in states if s.name == preset).refusal is None
    assert LP.fields_for(preset) == (PRESETS[preset][0].sp, PRESETS[preset][0].cfg, "")
    assert LP.default_preset(engine, parse_layout("sp1-cfg2"), states) == "sp1-cfg2"


def test_the_embedded_engine_starts_the_form_at_its_demo_defaults_and_says_so(engine, tmp_path):
    """A first result in about 20 s (docs/studio.md): the Steps field and the Layout start at the embedded
    engine's demo values, the page says so, and the API's defaults are the same; the engine's own default
    (a blank Steps, the CLI) stays the real model's."""
    from magi2studio.engines.embedded.engine import DEMO_LAYOUT, DEMO_STEPS
    from magi2studio.studio.app import create_app

    caps = engine.capabilities()
    assert (caps.demo_steps, caps.demo_layout) == (DEMO_STEPS, "sp1-cfg1") and caps.default_steps == 100
    assert DEMO_STEPS < caps.default_steps
    states = LP.preset_states(engine, TIERS["272p"])
    assert LP.default_preset(engine, None, states, caps.demo_layout) == DEMO_LAYOUT
    assert LP.default_preset(engine, parse_layout("sp1-cfg2"), states, caps.demo_layout) == "sp1-cfg2"
    demo, ctx = create_app(engine, tmp_path / "outputs")
    try:
        parameters = {p["parameter_name"]: p["parameter_default"]
                      for p in demo.get_api_info()["named_endpoints"]["/generate"]["parameters"]}
        assert (parameters["steps"], parameters["layout_preset"], parameters["sp"]) == (DEMO_STEPS, DEMO_LAYOUT, 1)
        said = demo.config["components"]
        line = next(c["props"]["value"] for c in said if c["props"].get("elem_id") == "demo-defaults")
        assert f"{DEMO_STEPS} steps on one rank ({DEMO_LAYOUT})" in line and "engine default, 100" in line
    finally:
        ctx.slot.close()
        ctx.close()


def test_the_cpu_engine_speaks_of_ranks_and_puts_no_fit_verdict_beside_its_check(engine):
    """First load on the embedded engine: no "4 GPUs" in the presets, no "does NOT fit" beside the ✓."""
    caps = engine.capabilities()
    labels = [label for label, _ in LP.choices(LP.preset_states(engine, TIERS["272p"]))]
    assert not any("GPU" in label for label in labels if "offload" not in label), labels
    assert any(label.startswith("sp2-cfg2: 4 ranks") for label in labels), labels
    for preset in ("sp1-cfg1", "sp2-cfg1"):
        line = LP.verdict({"layout_preset": preset, "tier": "272p"}, caps, engine, 80.0)
        assert line.startswith(f"✓ **{preset} runs on embedded**")
        assert "does NOT fit" not in line and "fits" not in line and "Not this engine's limit" in line


def test_the_verdict_is_this_engines_and_the_memory_line_only_advice_off_the_real_checkpoint(engine):
    caps = engine.capabilities()
    good = LP.verdict({"layout_preset": "sp2-cfg1", "tier": "272p"}, caps, engine, 80.0)
    assert good.startswith("✓ **sp2-cfg1 runs on embedded**") and "a GPU run of the real checkpoint" in good
    bad = LP.verdict({"layout_preset": "sp8-cfg1-ep4", "tier": "272p"}, caps, engine, 80.0)
    assert bad.startswith('<span class="m2s-refusal" role="alert">✗ layout: sp8-cfg1-ep4 needs 8 ranks')
    assert "Fix:" in bad and "✓" not in bad


def test_read_uploaded_prompt_keeps_the_text(tmp_path):
    path = Path(tmp_path / "p.txt")
    path.write_text("  a kite  \n", encoding="utf-8")
    assert F.read_uploaded_prompt(str(path)) == "a kite"
