"""The worker plugin, installed through its vllm.general_plugins entry point, on upstream's sampler.

The ranks are spawned processes on gloo (tiny_sampler.py): one rank runs the plain
``step`` path, two ranks with ``cfg_parallel_size=2`` run ``_step_guided``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from magi2studio import plugin
from magi2studio.engines import timing
from magi2studio.engines.timing import read_jsonl

from .tiny_sampler import spawn

STEPS = 3  # the fewest that leave a step for the MUSA report's metric after steps 0 and 1


def _results(folder, world_size):
    return [torch.load(folder / f"result-rank{rank}.pt") for rank in range(world_size)]


@pytest.mark.slow
def test_one_record_per_step_per_rank_single_and_cfg_parallel(tmp_path):
    single, parallel = tmp_path / "single", tmp_path / "cfg2"
    spawn(1, 1, STEPS, str(single))
    spawn(2, 2, STEPS, str(parallel))

    (one,) = _results(single, 1)
    assert one["cfg_world_size"] == 1 and one["closed_by"] == {"step": STEPS}
    rows = read_jsonl(single / "steps-rank0.jsonl")
    assert [(r["rank"], r["stage"], r["step"]) for r in rows] == [(0, "preview", s) for s in range(STEPS)]
    assert all(r["ms"] > 0 for r in rows)
    assert [p["step"] for p in read_jsonl(single / "progress.jsonl")] == list(range(STEPS))

    ranks = _results(parallel, 2)
    for rank, result in enumerate(ranks):
        assert result["cfg_world_size"] == 2 and result["closed_by"] == {"_step_guided": STEPS}
        rows = read_jsonl(parallel / f"steps-rank{rank}.jsonl")
        assert [(r["rank"], r["step"]) for r in rows] == [(rank, s) for s in range(STEPS)]
    # The timed CFG-parallel run is the same computation as the single-rank one (the guided
    # combine runs in another order, so equal to float32 rounding, not bit for bit).
    for result in ranks:
        for key in ("latent", "audio"):
            error = (result[key] - one[key]).norm() / one[key].norm()
            assert error < 1e-4, (key, float(error))
    summary = timing.gate_summary([*read_jsonl(parallel / "steps-rank0.jsonl"),
                                   *read_jsonl(parallel / "steps-rank1.jsonl")])
    assert summary["ranks"] == [0, 1] and summary["steps"] == STEPS and summary["excluded_steps"] == [0, 1]
    assert summary["gate_ms"] is not None
    assert read_jsonl(single / "kernels.json") == [{"installed": {}, "selection": "off"}]


def test_register_is_idempotent_and_loud_when_upstream_renamed_a_method(monkeypatch):
    from vllm_omni.diffusion.models.magi2.sampler_magi2 import Magi2PreviewSampler

    monkeypatch.delenv(plugin.ENV_METRICS_DIR, raising=False)
    monkeypatch.setattr(plugin, "_state", None)
    first = plugin.register()
    wrapped_sample = Magi2PreviewSampler.sample
    assert plugin.register() is first and Magi2PreviewSampler.sample is wrapped_sample
    assert first["timer"] is None and first["kernels"] == {"selection": "off", "installed": {}}

    monkeypatch.setattr(plugin, "_state", None)
    guided = Magi2PreviewSampler.__dict__["_step_guided"]
    monkeypatch.delattr(Magi2PreviewSampler, "_step_guided")
    monkeypatch.setattr(Magi2PreviewSampler, "_step_guided_v2", guided, raising=False)
    with pytest.raises(RuntimeError, match=r"Magi2PreviewSampler has no _step_guided: the pinned vLLM-Omni sampler"):
        plugin.register()
    assert plugin._state is None  # a failed start is not remembered as a success


def test_entry_point_is_declared_for_vllm_general_plugins():
    """What vLLM-Omni's loader sees (in a fresh interpreter, outside the repo's sys.path)."""

    code = ("from importlib.metadata import entry_points;"
            "print([e.value for e in entry_points(group='vllm.general_plugins') if e.name == 'magi2studio'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.strip() == "['magi2studio.plugin:register']"


KERNELS_SCRIPT = r"""
import json, os, sys
from magi2studio import plugin
from vllm_omni.diffusion.models.magi2 import mh_moe
original = mh_moe.Magi2MultiHeadMoE.__dict__["_local_forward"]
del mh_moe.Magi2MultiHeadMoE._local_forward
mh_moe.Magi2MultiHeadMoE._local_forward_v2 = original
try:
    plugin.register()
except Exception as err:
    print("REFUSED", type(err).__name__, err)
else:
    sys.exit("register() accepted a vLLM-Omni without Magi2MultiHeadMoE._local_forward")
assert plugin._state is None and mh_moe.Magi2MultiHeadMoE._local_forward_v2 is original
mh_moe.Magi2MultiHeadMoE._local_forward = original
state = plugin.register()
print("INSTALLED", json.dumps(state["kernels"], sort_keys=True))
print("FILE", open(os.path.join(os.environ["MAGI2STUDIO_METRICS_DIR"], "kernels.json")).read())
print("PATCHED", mh_moe.Magi2MultiHeadMoE._local_forward is not original)
"""


def test_kernel_overrides_by_env_and_refused_when_a_patched_name_moved(tmp_path):
    pytest.importorskip("magi2_kernels.overrides")
    env = {**os.environ, "MAGI2_KERNELS": "on", plugin.ENV_METRICS_DIR: str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", KERNELS_SCRIPT], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.split(" ", 1)[0].isupper())
    assert "Magi2MultiHeadMoE._local_forward" in lines["REFUSED"]
    installed = json.loads(lines["INSTALLED"])
    assert installed["selection"] == "on" and installed["installed"]["moe"].startswith("ours")
    assert json.loads(lines["FILE"]) == installed
    assert lines["PATCHED"] == "True"


@pytest.mark.slow
def test_an_aborted_request_stops_at_the_next_step_boundary_on_every_rank(tmp_path):
    """Upstream's abort flag (what DELETE /v1/videos/{id} sets through abort_request) stops MAGI-2's sampler at
    a step end, every rank at the same step. Without the plugin's opt-in the sampler ran all its steps (seen on
    the H100: a job deleted after step 1 of 40 denoised to the end)."""

    from multiprocessing.shared_memory import SharedMemory

    from .tiny_sampler import spawn_aborted

    steps = 6
    for world_size, cfg in ((1, 1), (2, 2)):
        out = tmp_path / f"world{world_size}"
        out.mkdir()
        flag = SharedMemory(create=True, size=1)
        flag.buf[0] = 0
        try:
            spawn_aborted(world_size, cfg, steps, str(out), flag.name, abort_at_step=1)
        finally:
            flag.close()
            flag.unlink()
        ends = [json.loads((out / f"aborted-rank{rank}.json").read_text()) for rank in range(world_size)]
        assert {end["ended"] for end in ends} == {"DiffusionRequestAbortedError"}, ends
        ran = {end["steps"] for end in ends}
        assert len(ran) == 1 and ran <= {2, 3}, ends  # the flag is set as step 1 begins; a rank may see it a step later


@pytest.mark.slow
def test_the_cancel_file_stops_every_rank_at_the_same_step_when_one_rank_sees_it(tmp_path):
    """Each rank looked for the studio's cancel file on its own at a step end: touched between two ranks' looks,
    one rank stopped and the other went on into the next step's collectives, and the engine hung until the step
    watchdog ended it. The ranks now agree: once any rank sees it, every rank stops at that step."""

    from .tiny_sampler import spawn_cancel_file

    spawn_cancel_file(2, str(tmp_path))
    ends = [json.loads((tmp_path / f"cancel-file-rank{rank}.json").read_text())["ended"] for rank in range(2)]
    assert ends == ["Cancelled", "Cancelled"], ends
