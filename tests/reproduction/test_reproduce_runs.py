"""``magi2studio reproduce`` end to end on the embedded engine with Sand AI's published samples."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from magi2studio.reproduction import samples
from magi2studio.cli import main
from magi2studio.run_folder.runs import is_complete
from magi2studio.reproduction.samples import BUNDLED_DIR

pytestmark = pytest.mark.slow
STEPS = "3"  # steps 0 and 1 are dropped by the gate metric, so 3 is the fewest that measure


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("reproduce")
    out, reference = root / "out", root / "baseline.json"
    status = main(["reproduce", "sandai", "--skip-missing", "--steps", STEPS, "--out", str(out),
                   "--write-reference", str(reference)])
    return status, out, reference


def report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def run_folders(out: Path) -> list[Path]:
    return sorted(p for p in (out / "runs").iterdir() if not p.name.startswith("."))


def test_the_set_runs_every_published_entry_into_run_folders(first_run):
    status, out, _ = first_run
    assert status == 0
    rows = {row["name"]: row for row in report(out)["samples"]}
    assert [rows[n]["status"] for n in ("sample_000-i2va", "sample_001-i2va", "sample_000-t2va", "sample_001-t2va")] \
        == ["ran"] * 4
    assert rows["sample_enhanced_t2v-t2va"]["status"] == "skipped"
    folders = run_folders(out)
    assert len(folders) == 4 and all(is_complete(f) for f in folders)
    for folder in folders:
        manifest = json.loads((folder / "manifest.json").read_text())
        name = manifest["reproduce"]["sample"]
        assert manifest["reproduce"]["seed_policy"] == "fixed" and manifest["request"]["seed"] == 42
        assert len(manifest["request"]["prompt"]) > 8_000  # the long prompt went through whole
        assert rows[name]["frames_sha256"] == manifest["hashes"]["frames_sha256"]
        assert rows[name]["gate_ms"] == manifest["timing"]["stages"]["preview"]["gate_ms"] > 0
    assert rows["sample_000-i2va"]["frames_sha256"] != rows["sample_000-t2va"]["frames_sha256"]


def test_reports_are_markdown_html_with_posters_and_json(first_run):
    _, out, _ = first_run
    html = (out / "report.html").read_text()
    posters = [row["poster"] for row in report(out)["samples"] if row["poster"]]
    assert len(posters) == 4
    for poster in posters:
        assert f'src="{poster}"' in html and (out / poster).is_file()
    markdown = (out / "report.md").read_text()
    assert "| sample_001-t2va | ran | t2va | 42 (fixed) | 272p | 3 | sp1-cfg1 |" in markdown
    assert "embedded engine" in markdown  # what cannot be checked here, and why
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temp file left behind


def test_a_second_invocation_resumes_and_skips_every_complete_run(first_run):
    _, out, _ = first_run
    before = run_folders(out)
    assert main(["reproduce", "sandai", "--skip-missing", "--steps", STEPS, "--out", str(out)]) == 0
    assert run_folders(out) == before
    assert report(out)["summary"]["resumed"] == 4 and report(out)["summary"]["ran"] == 0


def test_the_recorded_reference_verifies_identical(first_run):
    _, out, reference = first_run
    recorded = json.loads(reference.read_text())
    assert len(recorded["samples"]) == 4
    assert main(["reproduce", "sandai", "--skip-missing", "--steps", STEPS, "--out", str(out),
                 "--expect", str(reference)]) == 0
    assert report(out)["summary"]["identical"] == 4
    checks = [c for row in report(out)["samples"] for c in row["timing"]]
    assert len(checks) == 4 and all(c["checkable"] and c["ratio"] == 1.0 for c in checks)


def test_a_tampered_reference_reports_differs(first_run, tmp_path):
    _, out, reference = first_run
    tampered = json.loads(reference.read_text())
    entry = tampered["samples"]["sample_001-i2va"]["hashes"]
    entry["pcm_sha256"] = ("0" if entry["pcm_sha256"][0] != "0" else "1") + entry["pcm_sha256"][1:]
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(tampered))
    assert main(["reproduce", "sandai", "--skip-missing", "--steps", STEPS, "--out", str(out),
                 "--expect", str(path)]) == 0
    rows = {row["name"]: row for row in report(out)["samples"]}
    assert rows["sample_001-i2va"]["verdict"] == "differs"
    assert rows["sample_001-i2va"]["verdict_notes"][0].startswith("pcm_sha256")
    assert [rows[n]["verdict"] for n in ("sample_000-i2va", "sample_000-t2va", "sample_001-t2va")] == ["identical"] * 3


def test_against_the_blog_reference_every_sample_is_not_in_it_and_the_report_says_why(first_run):
    _, out, _ = first_run
    assert main(["reproduce", "sandai", "--skip-missing", "--steps", STEPS, "--out", str(out), "--expect", "blog"]) == 0
    data = report(out)
    assert data["summary"]["not in reference"] == 4
    assert any("8x MTT S5000" in note for note in data["cannot_check_here"])


def test_an_entry_failing_during_the_run_is_reported_and_the_rest_still_run(tmp_path, monkeypatch):
    shutil.copytree(BUNDLED_DIR / "assets", tmp_path / "assets")
    set_file = tmp_path / "assets" / "two.json"
    set_file.write_text(json.dumps([{"prompt_file": "assets/sample_000.txt", "image": "assets/sample_000.jpeg"},
                                    {"prompt": "A red kite over a windy beach, waves and gulls.", "name": "kite"}]))
    real_load = samples.load_sample_set

    def load_then_lose_the_image(*args, **kwargs):
        loaded = real_load(*args, **kwargs)
        (tmp_path / "assets" / "sample_000.jpeg").unlink()  # the file vanishes after validation
        return loaded

    monkeypatch.setattr(samples, "load_sample_set", load_then_lose_the_image)
    out = tmp_path / "out"
    assert main(["reproduce", str(set_file), "--root", str(tmp_path), "--steps", STEPS, "--out", str(out)]) == 1
    rows = {row["name"]: row for row in report(out)["samples"]}
    assert rows["sample_000-i2va"]["status"] == "failed" and "sample_000.jpeg" in rows["sample_000-i2va"]["error"]
    assert rows["kite"]["status"] == "ran" and len(run_folders(out)) == 1


@pytest.mark.parametrize("argv, field", [
    (["reproduce", "sandai"], "samples[4].prompt_file"),
    (["reproduce", "sandai", "--skip-missing", "--seed-policy", "shuffle"], "seed_policy"),
    (["reproduce", "sandai", "--skip-missing", "--expect", "/nonexistent.json"], "expect"),
    (["reproduce", "sandai", "--skip-missing", "--layout", "sp8-cfg1-ep4"], "layout"),
    (["reproduce", "sandai", "--skip-missing", "--tier", "720p"], "tier"),
])
def test_bad_input_exits_2_before_any_run(tmp_path, capsys, argv, field):
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {field}: ")
    assert not out.exists()
