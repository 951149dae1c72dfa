"""History's listing, search, identical-run badge and delete (fast: run folders written by hand, no engine)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from magi2studio.errors import InputError
from magi2studio.run_folder.runs import MANIFEST_VERSION, RUN_FILES
from magi2studio.studio import history as H


def run_folder(root: Path, name: str, *, prompt: str, seed: int, tier: str = "272p", layout: str = "sp1-cfg1",
               frames: str = "a", when: float = 0.0, seed_asked: int | None = None, mode: str = "t2va") -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    for file in RUN_FILES:
        (folder / file).write_bytes(b"x")
    resolved = {"steps": 3, **({"seed_asked": seed_asked} if seed_asked is not None else {})}
    manifest = {"manifest_version": MANIFEST_VERSION, "created": "2026-12-04T01:02:03+0000",
                "request": {"mode": mode, "prompt": prompt, "seed": seed, "tier": tier}, "resolved": resolved,
                "layout": {"name": layout}, "engine": {"name": "embedded"}, "files": {},
                "hashes": {"frames_sha256": frames * 64, "pcm_sha256": "b" * 64}}
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    os.utime(folder, (when, when))
    return folder


@pytest.fixture
def outputs(tmp_path) -> Path:
    root = tmp_path / "outputs"
    run_folder(root, "run-old", prompt="A red kite over a grey sea", seed=7, when=1000, frames="a")
    run_folder(root, "run-new", prompt="A lighthouse at dusk", seed=11, tier="540p", layout="sp2-cfg1", when=3000,
               frames="c", seed_asked=-1)
    run_folder(root, "run-twin", prompt="A red kite over a grey sea", seed=7, when=2000, frames="a")
    (root / "not-a-run").mkdir()
    (root / ".run-hidden.tmp").mkdir()
    return root


def test_runs_are_listed_newest_first_and_a_repeat_is_marked_identical_to_the_first(outputs):
    entries = H.list_entries(outputs)
    assert [e.name for e in entries] == ["run-new", "run-twin", "run-old"]
    twin = entries[1]
    assert twin.identical_to == "run-old" and entries[2].identical_to is None
    assert "= identical to run-old" in twin.caption() and "identical to run run-old" in H.details(twin)
    assert entries[0].seed_drawn and "drawn at random" in H.details(entries[0])


def test_a_caption_starts_with_the_seed_so_a_cut_one_keeps_it(outputs):
    caption = H.list_entries(outputs)[0].caption()
    assert caption.startswith("seed 11 · 540p · sp2-cfg1 · 2026-12-04 01:02")


def test_a_t2va_and_an_i2va_run_of_one_seed_have_cards_that_tell_them_apart(tmp_path):
    """The audit's defect: two runs with seed 42, one T2VA and one I2VA, had the same card."""

    long_prompt = "A red circle moves from left to right on a white background; a high beep each time it bounces"
    run_folder(tmp_path, "run-t2va", prompt=long_prompt, seed=42, when=1000)
    run_folder(tmp_path, "run-i2va", prompt="A lighthouse at dusk", seed=42, when=2000, mode="i2va", frames="c")
    i2va, t2va = (entry.caption() for entry in H.list_entries(tmp_path))
    assert i2va != t2va
    assert i2va.splitlines()[1] == "I2VA · A lighthouse at dusk"
    second = t2va.splitlines()[1]
    assert second.startswith("T2VA · A red circle moves from left to right") and second.endswith("…")
    assert len(second) <= 7 + H.CAPTION_PROMPT_CHARS + 1


@pytest.mark.parametrize("query, names", [
    ("kite", ["run-twin", "run-old"]),
    ("KITE grey", ["run-twin", "run-old"]),
    ("11", ["run-new"]),
    ("sp2-cfg1", ["run-new"]),
    ("540p lighthouse", ["run-new"]),
    ("2026-12-04", ["run-new", "run-twin", "run-old"]),
    ("kite 540p", []),
    ("", ["run-new", "run-twin", "run-old"]),
])
def test_search_matches_every_word_in_prompt_seed_tier_layout_and_date(outputs, query, names):
    assert [e.name for e in H.search(H.list_entries(outputs), query)] == names


def test_delete_removes_a_run_folder_and_nothing_else(outputs):
    assert H.delete_run(outputs, outputs / "run-old") == "run-old"
    assert not (outputs / "run-old").exists()
    assert "run-old" not in [e.name for e in H.list_entries(outputs)]
    H.forget_deleted(outputs)  # the next delete or the studio's exit
    assert sorted(p.name for p in outputs.iterdir()) == [".run-hidden.tmp", "not-a-run", "run-new", "run-twin"]


def test_the_last_delete_can_be_undone_until_the_next(outputs):
    """The audit: delete had no undo."""
    files = sorted(p.relative_to(outputs) for p in (outputs / "run-old").rglob("*"))
    H.delete_run(outputs, outputs / "run-old")
    assert H.undo_delete(outputs, "run-old") == "run-old"
    assert sorted(p.relative_to(outputs) for p in (outputs / "run-old").rglob("*")) == files
    assert "run-old" in [e.name for e in H.list_entries(outputs)] and not (outputs / H.DELETED).exists()
    H.delete_run(outputs, outputs / "run-old")
    H.delete_run(outputs, outputs / "run-new")
    with pytest.raises(InputError, match=r"^run: run-old is no longer kept to be restored .*Fix: press Refresh"):
        H.undo_delete(outputs, "run-old")
    assert not (outputs / "run-old").exists()
    assert H.undo_delete(outputs, "run-new") == "run-new" and (outputs / "run-new").is_dir()


@pytest.mark.parametrize("target", ["not-a-run", ".run-hidden.tmp", "..", "../outputs/run-new/../../elsewhere",
                                    "/etc", "link-to-run"])
def test_delete_refuses_what_is_not_a_run_folder_under_the_outputs_root(outputs, tmp_path, target):
    elsewhere = run_folder(tmp_path / "elsewhere-root", "elsewhere", prompt="p", seed=1)
    (outputs / "link-to-run").symlink_to(elsewhere)
    path = target if target.startswith("/") else outputs / target
    before = sorted(p.name for p in outputs.iterdir())
    with pytest.raises(InputError, match=r"^run: .*Fix: pick a run in History"):
        H.delete_run(outputs, path)
    assert sorted(p.name for p in outputs.iterdir()) == before and elsewhere.is_dir()
