"""The reference schema, the bundled blog reference and hash verdicts."""

from __future__ import annotations

import copy
import json

import pytest

from magi2studio.errors import InputError
from magi2studio.reproduction.references import DIFFERS, IDENTICAL, hash_verdict, load_reference, timing_checks
from magi2studio.reproduction.reproduce import run_key
from magi2studio.vocabulary.request import build_request
from magi2studio.reproduction.samples import BUNDLED_DIR

FULL = {"frames_sha256": "61e6da48517e0d0f" + "a" * 48, "pcm_sha256": "3188e16c3487fc50" + "b" * 48}


def test_blog_reference_carries_the_published_figures_with_sources():
    reference = load_reference("blog")
    (name, entry), = reference["samples"].items()
    assert entry["hashes"] == {"frames_sha256": "61e6da48517e0d0f", "pcm_sha256": "3188e16c3487fc50"}
    wanted = {"tier": "272p", "steps": 100, "compile": "static", "layout": "sp8-cfg1-ep4", "seed": 42}
    assert {key: entry["conditions"][key] for key in wanted} == wanted
    figures = [(f["layout"], f["gate_ms"]) for f in entry["timing"] if "section 5.3" in f["source"]]
    assert figures == [("sp8-cfg1-ep4", 565.0), ("sp8-cfg1-ep4", 566.3), ("sp8-cfg1-ep4", 565.0),
                       ("sp8-cfg1-ep8", 633.4), ("sp8-cfg1", 697.8)]
    assert all(f["source"].strip() for f in entry["timing"])


def test_published_prefixes_match_full_hashes_and_a_changed_digit_differs():
    prefixes = load_reference("blog")["samples"]["gate-benchmark-prompt-t2va"]["hashes"]
    assert hash_verdict(prefixes, FULL) == (IDENTICAL, [])
    changed = dict(FULL, pcm_sha256="3188e16c3487fc51" + "b" * 48)
    verdict, notes = hash_verdict(prefixes, changed)
    assert verdict == DIFFERS and notes[0].startswith("pcm_sha256")


def test_timing_figures_on_another_layout_or_engine_say_why_they_cannot_be_checked():
    entry = load_reference("blog")["samples"]["gate-benchmark-prompt-t2va"]
    manifest = {"request": {"mode": "t2va", "tier": "272p", "seed": 42, "steps": 3, "compile": None},
                "resolved": {"steps": 3, "compile": "eager"}, "layout": {"name": "sp1-cfg1"},
                "engine": {"name": "embedded"}}
    checks = timing_checks(entry, manifest, 120.0)
    assert checks and not any(c["checkable"] for c in checks)
    assert any("engine: reference vllm-omni, this run embedded" in r for r in checks[0]["why_not"])
    assert any(r.startswith("layout: figure sp8-cfg1-ep4") for r in checks[0]["why_not"])


def write(tmp_path, data) -> str:
    path = tmp_path / "ref.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(path)


def broken_variants():
    good = load_reference("blog")
    entry = lambda r: r["samples"]["gate-benchmark-prompt-t2va"]  # noqa: E731
    cases = {}
    for label, change in {
        "no format": lambda r: r.pop("format"),
        "samples a list": lambda r: r.__setitem__("samples", []),
        "hash not hex": lambda r: entry(r)["hashes"].__setitem__("pcm_sha256", "zzzzzzzzzzzz"),
        "prefix too short": lambda r: entry(r)["hashes"].__setitem__("pcm_sha256", "3188e1"),
        "unknown hash key": lambda r: entry(r)["hashes"].__setitem__("md5", "3188e16c3487fc50"),
        "no hashes": lambda r: entry(r).pop("hashes"),
        "figure without source": lambda r: entry(r)["timing"][0].pop("source"),
        "negative ms": lambda r: entry(r)["timing"][0].__setitem__("gate_ms", -1),
        "ms as text": lambda r: entry(r)["timing"][0].__setitem__("gate_ms", "565"),
        "bad layout": lambda r: entry(r)["timing"][0].__setitem__("layout", "eight gpus"),
        "unknown condition": lambda r: entry(r)["conditions"].__setitem__("gpus", 8),
    }.items():
        data = copy.deepcopy(good)
        change(data)
        cases[label] = data
    return cases


@pytest.mark.parametrize("label", sorted(broken_variants()))
def test_a_reference_with_a_wrong_schema_is_one_clear_error(tmp_path, label):
    with pytest.raises(InputError) as caught:
        load_reference(write(tmp_path, broken_variants()[label]))
    assert caught.value.field in ("expect", "layout") and "\n" not in str(caught.value)


def test_a_reference_that_is_not_json_or_not_there(tmp_path):
    for path in (write(tmp_path, "{not json"), str(tmp_path / "missing.json")):
        with pytest.raises(InputError) as caught:
            load_reference(path)
        assert caught.value.field == "expect"


def test_the_resume_key_is_the_request_by_content(tmp_path):
    image = tmp_path / "first.jpeg"
    image.write_bytes((BUNDLED_DIR / "assets" / "sample_000.jpeg").read_bytes())
    base = build_request(mode="i2va", prompt="p", image=str(image), prompt_file="/a/sample_000.txt", steps=3)
    key = run_key(base.model_dump(mode="json"), "sp1-cfg1", "embedded")
    moved = base.model_copy(update={"prompt_file": "/elsewhere/sample_000.txt"}).model_dump(mode="json")
    assert run_key(moved, "sp1-cfg1", "embedded") == key  # a moved or re-uploaded set still resumes
    for changed in (base.model_copy(update={"seed": 43}), base.model_copy(update={"steps": 4})):
        assert run_key(changed.model_dump(mode="json"), "sp1-cfg1", "embedded") != key
    assert run_key(base.model_dump(mode="json"), "sp1-cfg2", "embedded") != key
    assert run_key(base.model_dump(mode="json"), "sp1-cfg1", "vllm-omni") != key
    image.write_bytes((BUNDLED_DIR / "assets" / "sample_001.jpeg").read_bytes())
    assert run_key(base.model_dump(mode="json"), "sp1-cfg1", "embedded") != key  # same path, other picture
    image.unlink()
    assert run_key(base.model_dump(mode="json"), "sp1-cfg1", "embedded") is None


def test_resume_takes_a_run_folder_only_while_it_verifies(tmp_path):
    """An edited manifest (or a changed file) is run again, not resumed as the sample's result."""
    import time

    import numpy as np

    from magi2studio.engines.base import Generation, Plan
    from magi2studio.reproduction.reproduce import find_complete_run, manifest_key
    from magi2studio.run_folder import runs
    from magi2studio.vocabulary.layouts import parse_layout
    from magi2studio.vocabulary.tiers import get_tier

    request = build_request(prompt="a red circle on grey", steps=1)
    generation = Generation(frames=np.full((8, 64, 64, 3), 90, dtype=np.uint8),
                            audio=np.zeros((4410, 2), dtype=np.float32), fps=24.0, sample_rate=44100,
                            step_records=[], stage_ms={}, resolved={"steps": 1}, engine_info={"name": "embedded"})
    plan = Plan(request, get_tier(request.tier), parse_layout("sp1-cfg1"), generation.resolved)
    folder = runs.write_run(tmp_path, plan, generation, time.time()).path
    manifest_file = folder / "manifest.json"
    key = manifest_key(json.loads(manifest_file.read_text()))
    assert find_complete_run(tmp_path, key) == folder
    manifest = json.loads(manifest_file.read_text())
    manifest["hashes"]["frames_sha256"] = "0" * 64
    manifest_file.write_text(json.dumps(manifest, indent=1))
    assert manifest_key(manifest) == key
    assert find_complete_run(tmp_path, key) is None


def test_resume_takes_only_a_run_of_the_same_weights(tmp_path):
    """A set begun under the seeded random weights (yesterday's default) and resumed under the shipped
    checkpoint (today's) runs its entries again: the old folders' hashes are another model's."""
    import time

    import numpy as np

    from magi2studio.engines.base import Generation, Plan
    from magi2studio.engines.embedded.engine import EmbeddedEngine
    from magi2studio.reproduction.reproduce import engine_weights, find_complete_run
    from magi2studio.run_folder import runs
    from magi2studio.vocabulary.layouts import parse_layout
    from magi2studio.vocabulary.tiers import get_tier

    request = build_request(prompt="a red circle on grey", steps=1)
    random_info = EmbeddedEngine(weights="random").info()
    generation = Generation(frames=np.full((8, 64, 64, 3), 90, dtype=np.uint8),
                            audio=np.zeros((4410, 2), dtype=np.float32), fps=24.0, sample_rate=44100,
                            step_records=[], stage_ms={}, resolved={"steps": 1}, engine_info=random_info)
    plan = Plan(request, get_tier(request.tier), parse_layout("sp1-cfg1"), generation.resolved)
    folder = runs.write_run(tmp_path, plan, generation, time.time()).path
    fields = (request.model_dump(mode="json"), "sp1-cfg1", "embedded")
    assert find_complete_run(tmp_path, run_key(*fields, engine_weights(EmbeddedEngine(weights="random")))) == folder
    assert find_complete_run(tmp_path, run_key(*fields, engine_weights(EmbeddedEngine(weights="trained")))) is None


def test_a_recorded_reference_names_the_weights_a_run_of_other_weights_differs_by(tmp_path):
    """A reference written from seeded random runs, checked against a run of the shipped checkpoint (the default
    since the default changed): the verdict says the weights differ, not only the hashes; the ms/step compares."""
    from magi2studio.engines.embedded.tiny_weights import TRAINED_SHA256
    from magi2studio.reproduction.references import reference_from_report
    from magi2studio.reproduction.reproduce import SampleResult, judge

    def manifest(engine):
        return {"request": {"mode": "t2va", "tier": "272p", "seed": 42, "steps": 3, "compile": None},
                "resolved": {"steps": 3, "compile": "eager"}, "layout": {"name": "sp1-cfg1"}, "engine": engine,
                "hashes": FULL, "created": "2026-12-06T00:00:00"}

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps(manifest({"name": "embedded", "embedded": True,
                                                               "weights": "random"})))
    report = {"samples": [{"name": "s", "run_path": str(folder), "run_name": "run", "gate_ms": 10.0}]}
    reference = load_reference(write(tmp_path, reference_from_report(report, "random weights")))
    trained = manifest({"name": "embedded", "embedded": True, "weights": "/x/tiny-trained",
                        "weights_sha256": TRAINED_SHA256})
    trained["hashes"] = {"frames_sha256": "c" * 64, "pcm_sha256": "d" * 64}
    result = SampleResult(0, "s", "ran", "t2va", 42, "fixed", "272p", "sp1-cfg1", manifest=trained, gate_ms=10.5)
    judge(result, reference)
    assert result.verdict == DIFFERS
    assert any(f"weights: reference random, this run {TRAINED_SHA256}" in note for note in result.verdict_notes)
    assert result.timing[0]["checkable"]
