"""``magi2studio score RUN_DIR``: 0 when every stated attribute matches, 1 when one does not,
2 when the caption (or the folder) cannot be read; and the random-weight engine's run is
judged (at about chance), not crashed."""

import json

import pytest

from magi2studio.semantic import scenes
from magi2studio.cli import main
from magi2studio.semantic.scenes import make_scene
from magi2studio.vocabulary.tiers import TIERS

from .conftest import write_scene_run


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    return make_scene(scenes.HELD_OUT[1], TIERS["272p"], 9)


def _score(capsys, *args):
    code = main(["score", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_exit_0_when_all_match_and_1_when_one_does_not(scene, tmp_path, capsys):
    frames, audio = scene.frames(), scene.audio()
    good = write_scene_run(scene, tmp_path, frames=frames, audio=audio)
    code, out, _ = _score(capsys, good)
    assert code == 0, out
    assert out.splitlines()[0] == f"caption: {scene.caption}"
    assert "colour: match" in out and "beeps: match" in out and "all stated attributes match" in out
    wrong = write_scene_run(scene, tmp_path, frames=frames, audio=audio,
                            caption=scene.caption.replace("green", "red").replace("high", "low"))
    code, out, _ = _score(capsys, wrong)
    assert code == 1
    assert "colour: MISMATCH — expected red, observed green" in out and "pitch: MISMATCH" in out
    code, out, _ = _score(capsys, wrong, "--json")
    report = json.loads(out)
    assert code == 1 and report["all_match"] is False
    assert {v["attribute"] for v in report["verdicts"] if v["match"] is False} == {"colour", "pitch"}


@pytest.mark.parametrize("caption, field", [
    ("a clay figure waves at the camera", "shape"),
    ("a purple hexagon spins", "shape"),
    ("a square slides left to right", "colour"),
])
def test_exit_2_names_what_the_caption_lacks(scene, tmp_path, capsys, caption, field):
    folder = write_scene_run(scene, tmp_path, caption=caption)
    code, out, err = _score(capsys, folder)
    assert code == 2 and out == ""
    assert err.startswith(f"error: {field}: ") and ". Fix: " in err and "Traceback" not in err


def test_exit_2_for_a_folder_that_is_not_a_run(tmp_path, capsys):
    code, _, err = _score(capsys, tmp_path)
    assert code == 2 and err.startswith("error: run: ")


def test_the_random_weight_engine_run_is_judged_not_crashed(tmp_path, capsys):
    from magi2studio.run_folder import runs
    from magi2studio.engines import get_engine
    from magi2studio.vocabulary.layouts import parse_layout
    from magi2studio.vocabulary.request import build_request
    from magi2studio.semantic.score import score_run

    engine = get_engine("embedded")
    layout = parse_layout("sp1-cfg1")
    engine.start(layout)
    caption = scenes.caption_for(scenes.HELD_OUT[0], 0)
    folder = runs.execute(engine, build_request(prompt=caption, steps=2, seed=3), layout, tmp_path)
    result = score_run(folder.path)
    assert result.facts == scenes.HELD_OUT[0]
    assert all(v.match is not None for v in result.verdicts)
    assert not result.all_match  # random weights: noise, about chance per attribute
    code, out, _ = _score(capsys, folder.path)
    assert code == 1 and out.count("MISMATCH") >= 1


def test_score_heldout_script_refuses_a_missing_checkpoint_in_one_line_and_writes_nothing(tmp_path):
    """Run as a script (its __main__ block went missing once and the script did nothing, exit 0)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "score_heldout.py"
    out = tmp_path / "heldout.json"
    done = subprocess.run([sys.executable, str(script), "--weights", str(tmp_path / "nope"), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("score_heldout.py:")]
    assert len(lines) == 1 and "weights:" in lines[0] and "Fix:" in lines[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not out.exists() and list(tmp_path.iterdir()) == []
