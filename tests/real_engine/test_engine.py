"""VllmOmniEngine on this GPU-less host: what it selects, what it refuses, and that it starts nothing."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from magi2studio.engines.vllm_omni.capabilities import detect
from magi2studio.engines import get_engine
from magi2studio.engines.base import Plan
from magi2studio.errors import InputError
from magi2studio.vocabulary.layouts import parse_layout
from magi2studio.vocabulary.request import build_request
from magi2studio.vocabulary.tiers import get_tier


def structurally_complete_tree(root):
    """Every file upstream requires, each a well-formed (tiny) file of its kind."""

    for relative in detect().required_checkpoint_paths:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if relative.endswith(".safetensors.index.json"):
            save_file({"w": torch.ones(2)}, str(path.parent / "model-00001-of-00001.safetensors"))
            path.write_text(json.dumps({"weight_map": {"w": "model-00001-of-00001.safetensors"}}))
        elif relative.endswith(".safetensors"):
            save_file({"w": torch.ones(2)}, str(path))
        elif relative.endswith((".pth", ".ckpt")):
            torch.save({"w": torch.ones(2)}, path)
        else:
            path.write_text("{}")
    return root


@pytest.fixture
def engine(tmp_path):
    engine = get_engine("vllm-omni", checkpoint_root=str(structurally_complete_tree(tmp_path / "ckpt")),
                        work_dir=str(tmp_path / "work"))
    yield engine
    engine.close()


def test_start_selects_the_layout_and_restarts_only_on_change(engine, tmp_path):
    assert engine.layout is None
    assert engine.start(parse_layout("sp4-cfg2")) is True
    assert engine.start(parse_layout("sp4-cfg2")) is False
    assert engine.layout == parse_layout("sp4-cfg2")
    assert engine.start(parse_layout("sp8-cfg1")) is True
    assert not (tmp_path / "work").exists()  # the child starts with the first request's options


def test_generate_refuses_before_any_child_starts_on_a_host_without_gpus(engine, tmp_path):
    layout = parse_layout("sp4-cfg2")
    with pytest.raises(InputError, match=r"^layout: no layout was selected"):
        engine.generate(Plan(build_request(prompt="x"), get_tier("272p"), layout, {}))  # a plan made elsewhere
    engine.start(layout)
    with pytest.raises(InputError, match=r"^video_cfg: "):
        engine.plan(build_request(prompt="x", video_cfg=6.0), layout)
    with pytest.raises(InputError, match=r"^layout: sp4-cfg2 needs 8 GPUs; this machine has 0"):
        engine.plan(build_request(prompt="x"), layout)
    assert not (tmp_path / "work").exists()


def test_capabilities_grey_out_every_tier_here(engine):
    caps = engine.capabilities()
    assert caps.engine == "vllm-omni" and caps.devices == [] and caps.max_world_size == 0
    assert "no CUDA/MUSA GPU" in caps.tiers["272p"] and "no CUDA/MUSA GPU" in caps.tiers["540p"]
    assert "no MAGI-2 refiner" in caps.tiers["1080p"]
    assert any("expert parallel: refused" in note for note in caps.notes)


def test_each_engine_start_gets_its_own_folder_beside_an_earlier_engines(tmp_path):
    """The H100 run's second engine on one work folder stopped with FileExistsError on engine-1."""

    from magi2studio.engines.vllm_omni.engine import fresh_engine_dir

    (tmp_path / "engine-1" / "metrics").mkdir(parents=True)
    (tmp_path / "engine-1" / "metrics" / "steps.jsonl").write_text("{}\n")
    second = fresh_engine_dir(tmp_path)
    assert second == tmp_path / "engine-2" and not any(second.iterdir())
    assert fresh_engine_dir(tmp_path) == tmp_path / "engine-3"
    assert (tmp_path / "engine-1" / "metrics" / "steps.jsonl").read_text() == "{}\n"
