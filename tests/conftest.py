"""The suite runs under the deterministic environment, as the CLI and the image do.

Gradio's cache goes to a folder of this session's own, removed at its end: /tmp/gradio, shared and never
emptied, held 2.5 GB of earlier runs' videos on this machine, and CI's disk also holds the image builds."""

import os
import shutil
import tempfile

from magi2studio import determinism

determinism.apply_defaults()  # before any test starts torch

# The embedded engine's default weights are the shipped trained checkpoint; the wiring tests pin the seeded random
# tree's hashes and times, so the suite asks for it by name (subprocesses inherit it). A test of the default
# removes the variable itself.
os.environ["MAGI2_EMBEDDED_WEIGHTS"] = "random"

_GRADIO_CACHE = None if os.environ.get("GRADIO_TEMP_DIR") else tempfile.mkdtemp(prefix="magi2studio-tests-gradio-")
if _GRADIO_CACHE:
    os.environ["GRADIO_TEMP_DIR"] = _GRADIO_CACHE  # before gradio is imported; studios the tests start inherit it


def pytest_sessionfinish(session, exitstatus):
    if _GRADIO_CACHE:
        shutil.rmtree(_GRADIO_CACHE, ignore_errors=True)
