"""CI runs the cpu target's install script in a fresh venv: the recipe resolves from the
project's own files (pip's cache is reused, so this costs minutes, not a download)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_cpu_install_script_in_a_fresh_venv(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}:{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    result = subprocess.run(["bash", str(ROOT / "image" / "install.sh"), "--target", "cpu"], env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "installed for target cpu" in result.stdout
    check = subprocess.run([str(venv / "bin" / "magi2studio"), "weights", "check", "--root", str(tmp_path / "none")],
                           env=env, capture_output=True, text=True, cwd=tmp_path)
    assert check.returncode == 2 and "weights root" in check.stderr
