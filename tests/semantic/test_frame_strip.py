"""scripts/frame_strip.py: the scene asked for above the run's frames, at the same frame numbers."""

import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from frame_strip import GAP, LABEL, THUMB_WIDTH, strip  # noqa: E402


def test_the_asked_row_is_above_the_got_row_at_the_same_frame_numbers():
    count, height, width = 9, 64, 112
    asked = np.zeros((count, height, width, 3), dtype=np.uint8)
    got = np.zeros_like(asked)
    asked[..., 0] = np.arange(count)[:, None, None] * 20  # frame i of the scene: red 20 i
    got[..., 2] = np.arange(count)[:, None, None] * 20  # frame i of the run: blue 20 i
    image = np.asarray(strip(asked, got, 3, ["a line"], "title"))
    thumb = round(height * THUMB_WIDTH / width)
    assert image.shape[1] == 3 * THUMB_WIDTH + 2 * GAP
    for column, frame in enumerate((0, 4, 8)):  # evenly spaced over 9 frames
        x = column * (THUMB_WIDTH + GAP) + THUMB_WIDTH // 2
        assert tuple(image[2 * LABEL + thumb // 2, x]) == (20 * frame, 0, 0)
        assert tuple(image[3 * LABEL + thumb + thumb // 2, x]) == (0, 0, 20 * frame)


def test_a_folder_that_is_not_a_run_is_one_line_and_nothing_written(tmp_path):
    out = tmp_path / "strip.png"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "frame_strip.py"), str(tmp_path / "nope"),
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and not out.exists() and not list(tmp_path.iterdir())
    assert done.stderr.strip().splitlines()[-1].startswith("frame_strip.py: run: ")


def test_an_out_in_a_missing_folder_is_one_line_before_any_work(tmp_path):
    """It used to be a FileNotFoundError traceback from the PNG's save, after the run was scored."""
    out = tmp_path / "missing" / "strip.png"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "frame_strip.py"), str(tmp_path / "nope"),
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and not list(tmp_path.iterdir())
    assert done.stderr.strip().splitlines() == [f"frame_strip.py: out: {out.parent} is not a folder. "
                                                "Fix: create it or pick another --out"]
