"""The studio's own Gradio cache is bounded by age while it runs (issue 32 item 7: it grew by every run shown)."""

import os
import subprocess
import sys
import time

from magi2studio.studio.served import CacheSweeper, sweep_cache


def _made(path, text="x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return os.lstat(path).st_ctime


def test_the_sweep_removes_what_was_made_before_the_age_and_keeps_the_rest(tmp_path):
    old_ctime = _made(tmp_path / "abc123" / "video.mp4")
    time.sleep(0.05)
    new_ctime = _made(tmp_path / "def456" / "audio.wav")
    gap = new_ctime - old_ctime
    assert gap > 0
    removed = sweep_cache(tmp_path, max_age_s=gap / 2, now=new_ctime + gap / 4)
    assert removed == 1
    assert not (tmp_path / "abc123").exists()  # its folder, left empty, went too
    assert (tmp_path / "def456" / "audio.wav").is_file()
    assert tmp_path.is_dir()  # the cache folder itself stays


def test_a_fresh_copy_of_an_old_run_stays(tmp_path):
    """Gradio copies with copy2, which keeps the run's mtime: age is when the copy was made (ctime)."""
    copy = tmp_path / "abc123" / "video.mp4"
    _made(copy)
    two_days_ago = time.time() - 2 * 86400
    os.utime(copy, (two_days_ago, two_days_ago))
    assert sweep_cache(tmp_path, max_age_s=3600) == 0
    assert copy.is_file()


def test_the_sweeper_thread_sweeps_until_closed(tmp_path):
    _made(tmp_path / "abc123" / "poster.jpg")
    sweeper = CacheSweeper(tmp_path, max_age_s=0.0, every_s=0.05)
    try:
        deadline = time.monotonic() + 10
        while (tmp_path / "abc123").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not (tmp_path / "abc123").exists()
    finally:
        sweeper.close()
    _made(tmp_path / "ghi789" / "poster.jpg")
    time.sleep(0.3)
    assert (tmp_path / "ghi789" / "poster.jpg").is_file()  # closed: no more sweeps


def test_a_cache_age_of_zero_is_one_line(tmp_path):
    command = [sys.executable, "-c", "from magi2studio.cli import main; raise SystemExit(main())",
               "studio", "--cache-hours", "0", "--out", str(tmp_path / "out")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: cache-hours: 0.0 is not above 0. Fix: use --cache-hours 1 or more, e.g. 24"]
    assert not (tmp_path / "out").exists()
