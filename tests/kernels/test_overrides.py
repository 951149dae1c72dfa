"""install_overrides: selection parsing, idempotence, restoring upstream, loud failure when upstream moved."""

from __future__ import annotations

import pytest

from magi2_kernels import overrides
from magi2_kernels.platform import current_platform

pytest.importorskip("vllm_omni.diffusion.models.magi2.modeling_magi2")
from vllm_omni.diffusion.models.magi2 import attention, layers, mh_moe, modeling_magi2  # noqa: E402

UPSTREAM = {
    (mh_moe.Magi2MultiHeadMoE, "_local_forward"): mh_moe.Magi2MultiHeadMoE._local_forward,
    (layers.MHCHandler, "compute_post_residual"): layers.MHCHandler.compute_post_residual,
    (layers.MHCHandler, "hyper_connect"): layers.MHCHandler.hyper_connect,
    (layers.MHCHandler, "apply_pre"): layers.MHCHandler.apply_pre,
    (layers.MHCHandler, "compute_logits"): layers.MHCHandler.compute_logits,
    (attention, "packed_attention_with_sink"): attention.packed_attention_with_sink,
    (modeling_magi2.Magi2Attention, "output"): modeling_magi2.Magi2Attention.output,
}


@pytest.fixture(autouse=True)
def restore_upstream():
    yield
    overrides.install_overrides("off")
    for (owner, name), original in UPSTREAM.items():
        assert getattr(owner, name) is original


def test_parse_selection():
    assert overrides.parse_selection("off") == dict.fromkeys(overrides.KERNELS, False)
    assert overrides.parse_selection("on") == dict.fromkeys(overrides.KERNELS, True)
    picked = overrides.parse_selection("moe=ours, routing=upstream")
    assert picked["moe"] and not picked["routing"] and not picked["sinkhorn"]
    picked = overrides.parse_selection("on,routing=upstream")
    assert not picked["routing"] and all(v for k, v in picked.items() if k != "routing")
    assert overrides.parse_selection({"sinkhorn": "ours"})["sinkhorn"]
    for bad in ("moe=maybe", "attention=ours", "sometimes", "moe=ours,on"):
        with pytest.raises(ValueError):
            overrides.parse_selection(bad)


def test_selection_from_env(monkeypatch):
    monkeypatch.delenv(overrides.ENV_VAR, raising=False)
    assert overrides.selection_from_env() == "off"
    monkeypatch.setenv(overrides.ENV_VAR, "moe=ours")
    assert overrides.selection_from_env() == "moe=ours"


def test_on_patches_every_name_and_off_restores():
    report = overrides.install_overrides("on")
    expected = "ours:triton" if current_platform().triton else "ours:reference"
    assert report == {**dict.fromkeys(overrides.KERNELS, expected), "platform": current_platform().name}
    for (owner, name), original in UPSTREAM.items():
        assert getattr(owner, name) is not original
        assert getattr(getattr(owner, name), "__magi2_override__", False)
    assert overrides.install_overrides("on") == report  # idempotent
    overrides.install_overrides("off")
    for (owner, name), original in UPSTREAM.items():
        assert getattr(owner, name) is original


def test_per_kernel_selection_keeps_shared_target_until_both_off():
    report = overrides.install_overrides("moe=upstream,routing=ours,sinkhorn=ours")
    assert report["moe"] == "upstream" and report["routing"] != "upstream" and report["mhc_mix"] == "upstream"
    assert mh_moe.Magi2MultiHeadMoE._local_forward is not UPSTREAM[(mh_moe.Magi2MultiHeadMoE, "_local_forward")]
    assert layers.MHCHandler.hyper_connect is UPSTREAM[(layers.MHCHandler, "hyper_connect")]
    assert overrides.active_selection()["routing"] and not overrides.active_selection()["moe"]


def test_gpu_platform_without_triton_stays_upstream():
    gpu = current_platform().__class__(**{**current_platform().__dict__, "name": "cuda", "triton": False})
    report = overrides.install_overrides("on", platform=gpu)
    assert set(report.values()) == {"upstream", "cuda"}
    assert layers.MHCHandler.apply_pre is UPSTREAM[(layers.MHCHandler, "apply_pre")]


@pytest.mark.parametrize(
    "owner,name,selection",
    [
        (layers.MHCHandler, "compute_post_residual", "sinkhorn=ours"),
        (mh_moe, "global_sort_routes", "moe=ours"),
        (attention, "packed_attention_with_sink", "on"),
    ],
)
def test_renamed_upstream_name_raises_before_patching(monkeypatch, owner, name, selection):
    overrides.install_overrides("on")  # also covers a name that vanished after we patched it
    overrides.install_overrides("off")
    monkeypatch.delattr(owner, name)
    with pytest.raises(overrides.UpstreamMismatch, match=name):
        overrides.install_overrides(selection)
    # Nothing was patched by the failed call.
    assert layers.MHCHandler.apply_pre is UPSTREAM[(layers.MHCHandler, "apply_pre")]
    assert overrides.install_overrides("off")["moe"] == "upstream"  # off needs no upstream names
