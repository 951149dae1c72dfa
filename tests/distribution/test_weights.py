"""weights check and doctor on a synthetic checkpoint in the released layout (tiny files)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from magi2studio.run_folder import provenance
from magi2studio.cli import main
from magi2studio.errors import InputError
from magi2studio.weights import check_weights, upstream_required_paths


def _sharded(folder: Path, shards: int = 2) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        tensors = {f"layer{i}.weight": torch.ones(4, 4), f"layer{i}.bias": torch.zeros(4)}
        save_file(tensors, str(folder / name))
        weight_map.update({t: name for t in tensors})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def synthetic_tree(root: Path) -> Path:
    """The released layout with tiny files (also mounted into the built image by test_image_build)."""

    root.mkdir(parents=True)
    _sharded(root / "preview")
    _sharded(root / "text_encoder", 1)
    (root / "vae").mkdir()
    torch.save({"w": torch.ones(2)}, root / "vae" / "Wan2.2_VAE.pth")
    (root / "turbo_vae").mkdir()
    (root / "turbo_vae" / "TurboV3-Wan22-TinyShallow_7_7.json").write_text("{}")
    torch.save({"ema_state_dict": {}}, root / "turbo_vae" / "checkpoint.ckpt")
    (root / "stable-audio-open-1.0").mkdir()
    (root / "stable-audio-open-1.0" / "model_config.json").write_text('{"sample_rate": 44100}')
    save_file({"d": torch.ones(3)}, str(root / "stable-audio-open-1.0" / "model.safetensors"))
    _sharded(root / "refiner")
    return root


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return synthetic_tree(tmp_path / "MAGI-2-preview")


def problems(report) -> dict[str, str]:
    return dict(report.problems)


def test_complete_tree_passes_for_every_tier(tree):
    assert set(upstream_required_paths()) >= {"preview/model.safetensors.index.json", "vae/Wan2.2_VAE.pth"}
    for tier in ("272p", "540p", "1080p"):
        report = check_weights(tree, tier)
        assert report.ok, report.lines()
    assert main(["weights", "check", "--root", str(tree), "--tier", "1080p"]) == 0


def test_missing_folder_is_bad_input(tmp_path, capsys):
    with pytest.raises(InputError, match="is not a folder"):
        check_weights(tmp_path / "absent")
    assert main(["weights", "check", "--root", str(tmp_path / "absent")]) == 2
    assert "Fix:" in capsys.readouterr().err


def test_empty_folder_is_named(tmp_path):
    found = problems(check_weights(tmp_path))
    assert list(found) == ["."] and "empty" in found["."]


def test_partial_download_names_every_missing_file(tree, capsys):
    (tree / "vae" / "Wan2.2_VAE.pth").unlink()
    (tree / "preview" / "model-00002-of-00002.safetensors").unlink()
    (tree / "stable-audio-open-1.0" / "model_config.json").unlink()
    found = problems(check_weights(tree))
    assert set(found) == {"vae/Wan2.2_VAE.pth", "preview/model-00002-of-00002.safetensors",
                          "stable-audio-open-1.0/model_config.json"}
    assert main(["weights", "check", "--root", str(tree)]) == 1
    out = capsys.readouterr().out
    assert all(name in out for name in found)


def test_truncated_shard_and_checkpoint_are_named(tree):
    shard = tree / "preview" / "model-00001-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    vae = tree / "vae" / "Wan2.2_VAE.pth"
    vae.write_bytes(vae.read_bytes()[:40])
    found = problems(check_weights(tree))
    assert "truncated" in found["preview/model-00001-of-00002.safetensors"]
    assert "truncated or corrupt" in found["vae/Wan2.2_VAE.pth"]
    assert len(found) == 2


def test_corrupt_index_and_wrong_shard_content_are_named(tree):
    (tree / "text_encoder" / "model.safetensors.index.json").write_text('{"weight_map": ')
    save_file({"other": torch.ones(1)}, str(tree / "preview" / "model-00002-of-00002.safetensors"))
    found = problems(check_weights(tree))
    assert "corrupt index" in found["text_encoder/model.safetensors.index.json"]
    assert "lacks 2 tensor(s)" in found["preview/model-00002-of-00002.safetensors"]


def test_1080p_needs_the_refiner(tree):
    for path in (tree / "refiner").iterdir():
        path.unlink()
    assert check_weights(tree, "540p").ok
    assert "refiner" in problems(check_weights(tree, "1080p"))["refiner/"]


def test_hash_compares_with_recorded_download_metadata(tree, capsys):
    meta = tree / ".cache" / "huggingface" / "download" / "vae"
    meta.mkdir(parents=True)
    digest = hashlib.sha256((tree / "vae" / "Wan2.2_VAE.pth").read_bytes()).hexdigest()
    (meta / "Wan2.2_VAE.pth.metadata").write_text(f"{'a' * 40}\n{digest}\n1700000000.0\n")
    report = check_weights(tree, hash_files=True)
    assert report.ok and report.revisions == {"a" * 40} and "vae/Wan2.2_VAE.pth" not in report.unverified
    (meta / "Wan2.2_VAE.pth.metadata").write_text(f"{'a' * 40}\n{'0' * 64}\n1700000000.0\n")
    assert "does not match" in problems(check_weights(tree, hash_files=True))["vae/Wan2.2_VAE.pth"]
    assert main(["weights", "check", "--root", str(tree), "--hash"]) == 1


def test_doctor_reports_on_this_machine(tree, tmp_path, monkeypatch, capsys):
    info = tmp_path / "build-info.json"
    info.write_text(json.dumps({"git_revision": "abc123", "lock_sha256": "f" * 64, "pip_freeze": ["x==1"]}))
    monkeypatch.setattr(provenance, "BUILD_INFO_PATH", info)
    monkeypatch.setenv("TORCHINDUCTOR_DETERMINISTIC", "1")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")  # the CLI fills unset values, never set ones
    assert main(["doctor", "--root", str(tree)]) == 0
    out = capsys.readouterr().out
    assert "platform: cpu" in out and "git_revision=abc123" in out
    assert "TORCHINDUCTOR_DETERMINISTIC=1 ok" in out and "CUBLAS_WORKSPACE_CONFIG=:16:8 DIFFERS (want :4096:8" in out
    assert "mux: PyAV" in out and f"weights: ok at {tree}" in out
    assert "engine embedded:" in out and "engine vllm-omni:" in out and "tier 272p:" in out
    assert "engine vllm-omni-server:" in out and "not reachable" in out  # no server listens here
    (tree / "vae" / "Wan2.2_VAE.pth").unlink()
    assert main(["doctor", "--root", str(tree), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["weights"]["ok"] is False and report["platform"]["platform"] == "cpu"


@pytest.mark.slow
def test_embedded_engines_tiny_checkpoint_passes_and_a_broken_copy_is_named(tmp_path):
    import shutil

    from magi2studio.engines.embedded.checkpoint import ensure_checkpoint
    from magi2studio.engines.embedded.tiny import TinyConfig

    tiny = ensure_checkpoint(TinyConfig())  # the engine's own cache: generated once per machine
    assert check_weights(tiny, "540p").ok, check_weights(tiny, "540p").lines()
    broken = shutil.copytree(tiny, tmp_path / "tiny")
    shard = sorted((broken / "preview").glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    (broken / "turbo_vae" / "checkpoint.ckpt").unlink()
    found = problems(check_weights(broken))
    assert set(found) == {f"preview/{shard.name}", "turbo_vae/checkpoint.ckpt"}
    assert "truncated" in found[f"preview/{shard.name}"]


def test_doctor_says_when_the_image_mount_point_is_empty(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MAGI2_CKPT_ROOT", str(tmp_path / "not-mounted"))
    assert main(["doctor"]) == 0
    assert f"weights: nothing mounted there (the embedded engine needs no weights; vllm-omni does) " \
           f"at {tmp_path / 'not-mounted'}" in capsys.readouterr().out


def test_a_file_this_user_cannot_read_is_named_with_the_fix(tree, monkeypatch):
    import os

    unreadable = {tree / "preview" / "model-00001-of-00002.safetensors", tree / "vae" / "Wan2.2_VAE.pth"}
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) not in unreadable and real_access(path, mode))
    found = problems(check_weights(tree))
    assert set(found) == {"preview/model-00001-of-00002.safetensors", "vae/Wan2.2_VAE.pth"}
    assert all("not readable by uid" in why and "chmod -R a+rX" in why for why in found.values())
