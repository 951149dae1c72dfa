"""Reading sample sets in Sand AI's format: resolution, seed policies and every refusal."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
import yaml

from magi2studio.cli import main
from magi2studio.errors import InputError
from magi2studio.reproduction.samples import BUNDLED_DIR, BUNDLED_SET, CONFIRM_ENTRIES, load_sample_set

REPO = Path(__file__).resolve().parents[2]


def make_repo(tmp_path: Path, entries, *, files=("sample_000.txt", "sample_000.jpeg")) -> Path:
    """A repository laid out as Sand AI's: assets/ holds the set and the files it names."""

    assets = tmp_path / "repo" / "assets"
    assets.mkdir(parents=True)
    for name in files:
        shutil.copy(BUNDLED_DIR / "assets" / name, assets / name)
    set_file = assets / "set.json"
    set_file.write_text(json.dumps(entries) if not isinstance(entries, str) else entries, encoding="utf-8")
    return set_file


def refusal(path, **options) -> InputError:
    with pytest.raises(InputError) as caught:
        load_sample_set(path, **options)
    assert "\n" not in str(caught.value)
    return caught.value


def test_bundled_set_is_sand_ai_published_files_as_pinned_in_the_lock():
    lock = yaml.safe_load((REPO / "image" / "lock.yaml").read_text())["sandai_assets"]["sha256"]
    for path in [*(BUNDLED_DIR / "assets").iterdir(), BUNDLED_DIR / "LICENSE"]:
        assert hashlib.sha256(path.read_bytes()).hexdigest() == lock[path.name], path.name


def test_bundled_set_reads_four_entries_and_reports_the_unpublished_one():
    sample_set = load_sample_set("sandai", skip_missing=True)
    assert [(s.name, s.request.mode) for s in sample_set.samples] == [
        ("sample_000-i2va", "i2va"), ("sample_001-i2va", "i2va"),
        ("sample_000-t2va", "t2va"), ("sample_001-t2va", "t2va")]
    for sample in sample_set.samples:
        assert 8_000 < len(sample.request.prompt) < 11_500  # the long published prompts, passed through
        assert sample.request.prompt == sample.request.prompt.strip()
    assert sample_set.samples[0].request.image == str(BUNDLED_DIR / "assets" / "sample_000.jpeg")
    assert [(s.index, s.name) for s in sample_set.skipped] == [(4, "sample_enhanced_t2v-t2va")]
    assert "sample_enhanced_t2v.json does not exist" in sample_set.skipped[0].reason


def test_bundled_set_without_skip_missing_is_refused_before_anything_runs():
    err = refusal(BUNDLED_SET)
    assert err.field == "samples[4].prompt_file" and "--skip-missing" in err.fix


def test_seed_policies_fixed_offset_and_an_entry_seed(tmp_path):
    set_file = make_repo(tmp_path, [{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c", "seed": 7}])
    fixed = load_sample_set(set_file, seed=42, seed_policy="fixed")
    assert [(s.request.seed, s.seed_source) for s in fixed.samples] == [(42, "fixed"), (42, "fixed"), (7, "entry")]
    offset = load_sample_set(set_file, seed=42, seed_policy="offset")
    assert [(s.request.seed, s.seed_source) for s in offset.samples] == [(42, "offset"), (43, "offset"), (7, "entry")]
    assert refusal(set_file, seed_policy="random").field == "seed_policy"


def test_paths_resolve_in_the_sets_folder_then_the_named_root(tmp_path):
    set_file = make_repo(tmp_path, [{"prompt_file": "sample_000.txt"},
                                    {"prompt_file": "assets/sample_000.txt", "image": "assets/sample_000.jpeg",
                                     "name": "x"}])
    samples = load_sample_set(set_file, root=tmp_path / "repo").samples
    assert samples[0].request.prompt_file == samples[1].request.prompt_file == str(set_file.parent / "sample_000.txt")
    assert samples[1].request.mode == "i2va" and samples[1].name == "x"


def test_entry_extras_override_the_defaults(tmp_path):
    set_file = make_repo(tmp_path, [{"prompt": "a", "tier": "540p", "steps": 9}, {"prompt": "b"}])
    a, b = load_sample_set(set_file, defaults={"tier": "272p", "steps": 3}).samples
    assert (a.request.tier, a.request.steps, b.request.tier, b.request.steps) == ("540p", 9, "272p", 3)


@pytest.mark.parametrize("entries, field, words", [
    ('{"prompt": "x"}', "samples", "not an array"),
    ("[{", "samples", "not valid JSON"),
    ("[]", "samples", "empty"),
    ([{"image": "sample_000.jpeg"}], "samples[0]", "neither prompt nor prompt_file"),
    ([{"prompt": "a", "prompt_file": "sample_000.txt"}], "samples[0]", "both"),
    (["just text"], "samples[0]", "not an object"),
    ([{"prompt_file": "nope.txt"}], "samples[0].prompt_file", "does not exist"),
    ([{"prompt": "a", "image": "nope.jpeg"}], "samples[0].image", "does not exist"),
    ([{"prompt_file": "../../etc/passwd"}], "samples[0].prompt_file", "outside the root"),
    ([{"prompt_file": "../sample_000.txt"}], "samples[0].prompt_file", "outside the root"),
    ([{"prompt": "a", "image": "../../../x.jpeg"}], "samples[0].image", "outside the root"),
    ([{"prompt_file": "/etc/hostname"}], "samples[0].prompt_file", "absolute"),
    ([{"prompt": "a", "negative": "b"}], "samples[0].negative", "not a sample entry key"),
    ([{"prompt": "a", "tier": "720p"}], "samples[0].tier", "unknown tier"),
    ([{"prompt": "a", "mode": "i2va"}], "samples[0].image", "needs a first-frame image"),
    ([{"prompt": "a", "steps": 0}], "samples[0].steps", "out of range"),
    ([{"prompt": "a"}, {"prompt": "b", "name": "entry-0-t2va"}], "samples", "both named"),
    ([{"prompt": "a", "name": "../up"}], "samples[0].name", "not a usable sample name"),
])
def test_bad_sets_are_refused_with_the_field_named(tmp_path, entries, field, words):
    err = refusal(make_repo(tmp_path, entries))
    assert err.field == field and words in str(err)


def test_a_symlink_out_of_the_root_is_refused(tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("secret prompt")
    set_file = make_repo(tmp_path, [{"prompt_file": "link.txt"}])
    (set_file.parent / "link.txt").symlink_to(outside)
    assert "outside the root" in str(refusal(set_file))
    assert "outside the root" in str(refusal(set_file, root=tmp_path / "repo"))


def test_a_corrupt_image_is_refused_before_any_run(tmp_path):
    set_file = make_repo(tmp_path, [{"prompt": "a", "image": "sample_000.jpeg"}])
    image = set_file.parent / "sample_000.jpeg"
    image.write_bytes(image.read_bytes()[:2000])
    err = refusal(set_file)
    assert err.field == "samples[0].image" and "corrupt" in err.problem


def test_a_missing_set_file_names_the_alias():
    assert "sandai" in refusal("/nonexistent/demo_samples.json").fix


@pytest.fixture
def set_at_tmp_top():
    """A sample set directly in /tmp: its folder's parent is / (the old 'root' that leaked)."""

    path = Path(tempfile.gettempdir()) / f"magi2studio-set-{uuid.uuid4().hex[:8]}.json"
    yield path
    path.unlink(missing_ok=True)


@pytest.mark.parametrize("written", ["../etc/passwd", "../../etc/passwd", "./../etc/hostname"])
def test_a_set_at_the_top_of_tmp_cannot_reach_etc(set_at_tmp_top, tmp_path, capsys, written):
    set_at_tmp_top.write_text(json.dumps([{"prompt_file": written, "steps": 2}]))
    err = refusal(set_at_tmp_top)
    assert err.field == "samples[0].prompt_file" and "outside the root" in err.problem
    out = tmp_path / "o" / "x"
    assert main(["reproduce", str(set_at_tmp_top), "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith("error: samples[0].prompt_file: ")
    assert not (tmp_path / "o").exists()


def test_a_named_root_must_hold_the_set(tmp_path):
    set_file = make_repo(tmp_path, [{"prompt_file": "sample_000.txt"}])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert refusal(set_file, root=elsewhere).field == "root"
    assert refusal(set_file, root=tmp_path / "nope").field == "root"


def test_a_set_above_the_bound_needs_confirmation(tmp_path, capsys):
    set_file = make_repo(tmp_path, [{"prompt": f"clip {i}", "name": f"n{i}"} for i in range(CONFIRM_ENTRIES + 1)])
    err = refusal(set_file)
    assert err.field == "samples" and "--yes" in err.fix
    assert len(load_sample_set(set_file, confirm_large=True).samples) == CONFIRM_ENTRIES + 1
    assert main(["reproduce", str(set_file), "--out", str(tmp_path / "out")]) == 2
    assert "--yes" in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("make, words", [
    (lambda p: p.mkdir(), "is a folder"),
    (lambda p: os.mkfifo(p), "is a fifo"),
])
def test_a_set_or_prompt_file_that_is_not_a_regular_file_says_so(tmp_path, make, words):
    odd = tmp_path / "repo" / "assets" / "odd"
    set_file = make_repo(tmp_path, [{"prompt_file": "odd"}])
    make(odd)
    err = refusal(set_file)
    assert err.field == "samples[0].prompt_file" and words in err.problem
    err = refusal(odd)
    assert err.field == "samples" and words in err.problem
