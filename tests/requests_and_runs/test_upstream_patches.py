"""The embedded engine's CPU patches touch pinned vLLM-Omni internals: fail loudly if they move."""

import inspect

import pytest


def test_patched_platform_methods_still_exist_with_the_shape_we_patch():
    from vllm_omni.platforms.interface import UnspecifiedOmniPlatform
    from vllm_omni.diffusion.distributed import parallel_state

    for name in ("get_device_count", "set_device"):
        assert hasattr(UnspecifiedOmniPlatform, name), f"UnspecifiedOmniPlatform.{name} moved"
    # init_distributed_environment divides by the platform's device count: the reason for the patch.
    assert "get_device_count()" in inspect.getsource(parallel_state.init_distributed_environment)
    params = inspect.signature(parallel_state.initialize_model_parallel).parameters
    for name in ("cfg_parallel_size", "ulysses_degree", "sequence_parallel_size", "backend"):
        assert name in params, f"initialize_model_parallel lost {name}"


def test_apply_refuses_when_a_patched_name_is_missing(monkeypatch):
    from vllm_omni.platforms import interface

    from magi2studio.engines.embedded import upstream_patches

    class Renamed:  # an upstream that renamed set_device
        get_device_count = classmethod(lambda cls: 0)

    monkeypatch.setattr(interface, "UnspecifiedOmniPlatform", Renamed)
    with pytest.raises(RuntimeError, match="has no set_device"):
        upstream_patches.apply_cpu_patches()


def test_driver_uses_upstream_helpers_that_exist():
    from vllm_omni.diffusion.models.magi2 import pipeline_magi2

    for name in ("_resizepad", "_resize_video", "_seed_request", "DEFAULT_NEGATIVE_PROMPT"):
        assert hasattr(pipeline_magi2, name), f"pipeline_magi2.{name} moved"
    assert callable(pipeline_magi2.Magi2Pipeline._ensure_figure_token)


WORLD_UNDER_A_CAPTURED_STDOUT = r"""
import io, sys
import torch.distributed as dist
from vllm_omni.diffusion.distributed import parallel_state
from magi2studio.engines.embedded import upstream_patches as up

sys.stdout = io.StringIO()  # as pytest's capsys, Jupyter or a redirected studio leave it
up.init_parallel(world_size=1, rank=0, port=up.free_port(), ulysses_degree=1, cfg_parallel_size=1)
built = dist.is_initialized()
up.destroy_parallel()
released = not dist.is_initialized()

def broken(**kwargs):
    raise RuntimeError("group set-up failed")

parallel_state.initialize_model_parallel = broken
try:
    up.init_parallel(world_size=1, rank=0, port=up.free_port(), ulysses_degree=1, cfg_parallel_size=1)
except RuntimeError:
    pass
left_over = dist.is_initialized()
sys.__stdout__.write(f"{built} {released} {left_over}\n")
"""


def test_the_world_builds_under_a_captured_stdout_and_a_failed_build_leaves_nothing():
    """vLLM's group set-up needs ``sys.stdout.fileno()``: under a captured stdout the first CI
    run failed with ``UnsupportedOperation: fileno`` after the process group was made, and every
    later start then met "the default process group twice". Fresh interpreter: the test suite's
    own engines hold this process's world."""

    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", WORLD_UNDER_A_CAPTURED_STDOUT], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-3:] == ["True", "True", "False"], done.stdout[-2000:]
