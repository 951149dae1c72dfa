"""The kernels' interpreter tests under Triton 3.2.0, the Triton of Moore Threads' MUSA toolchain.

``scripts/setup-triton32`` makes a second small venv (.venv/triton32: CPU torch 2.13.0,
triton==3.2.0, the numpy/pytest pins of kernels/requirements-triton32.txt), once; this test then
runs the fast kernel tests in it. The portable path (no TMA, no inline PTX) must import and
pass there; the TMA tests skip (no ``triton.tools.tensor_descriptor`` in 3.2).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VENV_PYTHON = ROOT / ".venv" / "triton32" / "bin" / "python"
KERNEL_TESTS = ["test_moe.py", "test_mhc.py", "test_routing.py", "test_attention_sink.py"]


@pytest.mark.slow
def test_kernels_pass_under_triton_3_2():
    subprocess.run([str(ROOT / "scripts" / "setup-triton32")], check=True, timeout=1200)
    version = subprocess.run([str(VENV_PYTHON), "-c", "import triton; print(triton.__version__)"], check=True,
                             capture_output=True, text=True).stdout.strip()
    assert version == "3.2.0"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(ROOT / "kernels")
    here = Path(__file__).parent
    run = subprocess.run(
        [str(VENV_PYTHON), "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--confcutdir={here}", "-m", "not slow",
         *(str(here / name) for name in KERNEL_TESTS)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )
    sys.stdout.write(run.stdout[-4000:])
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    passed = int(re.search(r"(\d+) passed", run.stdout).group(1))
    assert passed >= 30, run.stdout[-2000:]
