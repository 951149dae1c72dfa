"""The test checkpoint's depth switch: refused for unmarked trees, applied to upstream's config, recorded.

The tree itself (real widths, ~21 GiB) is written and loaded on the GPU by gpu_omni_e2e.py; here
the switch, the marker and the plugin's record are checked against the installed vLLM-Omni.
"""

from __future__ import annotations

import json

import pytest

from magi2studio import plugin
from magi2studio.engines import test_checkpoint
from magi2studio.engines.test_checkpoint import (
    ENV_TEST_CHECKPOINT,
    MARKER_FILE,
    TestCheckpointError,
    TestCheckpointSpec,
)


@pytest.fixture
def upstream_config():
    """Upstream's module-level configs, restored after the test (the switch replaces them process-wide)."""

    from vllm_omni.diffusion.models.magi2 import configuration_magi2, pipeline_magi2

    released = configuration_magi2.MAGI2_PREVIEW_CONFIG
    yield configuration_magi2, pipeline_magi2
    configuration_magi2.MAGI2_PREVIEW_CONFIG = released
    pipeline_magi2.MAGI2_PREVIEW_CONFIG = released


def marked_tree(folder, spec=TestCheckpointSpec(), **overrides):
    folder.mkdir(exist_ok=True)
    (folder / MARKER_FILE).write_text(json.dumps({**spec.marker(), **overrides}), encoding="utf-8")
    return folder


def test_unset_changes_nothing(upstream_config):
    config, pipeline = upstream_config
    assert test_checkpoint.apply_from_env({}) is None
    assert config.MAGI2_PREVIEW_CONFIG.num_layers == pipeline.MAGI2_PREVIEW_CONFIG.num_layers == 40


@pytest.mark.parametrize("marker", [None, {"test_checkpoint": False}, {"test_checkpoint": "yes"}])
def test_refused_unless_the_tree_marks_itself_a_test_checkpoint(tmp_path, upstream_config, marker):
    if marker is not None:
        marked_tree(tmp_path, **marker)
    with pytest.raises(TestCheckpointError, match=f"{ENV_TEST_CHECKPOINT}: .* Fix: unset"):
        test_checkpoint.apply_from_env({ENV_TEST_CHECKPOINT: str(tmp_path)})
    config, pipeline = upstream_config
    assert pipeline.MAGI2_PREVIEW_CONFIG.num_layers == 40
    assert test_checkpoint.worker_env(tmp_path) == {}


def test_marked_tree_reduces_depth_in_the_pipeline_module_and_keeps_every_width(tmp_path, upstream_config):
    config, pipeline = upstream_config
    released = config.MAGI2_PREVIEW_CONFIG
    applied = test_checkpoint.apply_from_env({ENV_TEST_CHECKPOINT: str(marked_tree(tmp_path))})
    assert applied["root"] == str(tmp_path) and applied["test_checkpoint"] is True
    for module in (config, pipeline):  # the pipeline builds its transformer from its own copy of the name
        reduced = module.MAGI2_PREVIEW_CONFIG
        assert (reduced.num_layers, reduced.multimodal_layers, reduced.moe.layers) == (6, (0, 1, 4, 5), (2, 3))
        for name in ("hidden_size", "head_dim", "num_query_groups", "text_in_channels", "mhc"):
            assert getattr(reduced, name) == getattr(released, name)
        assert (reduced.moe.num_heads, reduced.moe.num_experts, reduced.moe.top_k) == (12, 256, 6)
    assert test_checkpoint.worker_env(tmp_path) == {ENV_TEST_CHECKPOINT: str(tmp_path)}


@pytest.mark.parametrize("fields", [dict(multimodal_layers=(0, 5)), dict(moe_layers=(2,), num_layers=5,
                                                                          multimodal_layers=(0, 1, 3, 4)),
                                    dict(text_layers=0)])
def test_spec_keeps_every_kind_of_block(fields):
    with pytest.raises(ValueError):
        TestCheckpointSpec(**fields)


def test_plugin_applies_and_records_the_depth_and_refuses_an_unmarked_tree(tmp_path, monkeypatch, upstream_config):
    metrics = tmp_path / "metrics"
    monkeypatch.setenv("MAGI2STUDIO_METRICS_DIR", str(metrics))
    monkeypatch.setenv(ENV_TEST_CHECKPOINT, str(marked_tree(tmp_path / "tree")))
    monkeypatch.setattr(plugin, "_state", None)
    state = plugin.register()
    assert state["test_checkpoint"]["spec"]["num_layers"] == 6
    assert json.loads((metrics / "test-checkpoint.json").read_text())["spec"]["moe_layers"] == [2, 3]
    assert upstream_config[1].MAGI2_PREVIEW_CONFIG.num_layers == 6

    monkeypatch.setenv(ENV_TEST_CHECKPOINT, str(tmp_path / "real-weights"))
    monkeypatch.setattr(plugin, "_state", None)
    with pytest.raises(TestCheckpointError):
        plugin.register()


def test_the_text_encoder_writer_trains_its_tokenizer_on_the_corpus_it_names(tmp_path, monkeypatch):
    """The first device run stopped here: the corpus path still pointed at the module's old folder."""

    from magi2studio.engines import test_checkpoint

    spec = test_checkpoint.TestCheckpointSpec(seed=0, num_layers=6, multimodal_layers=(0, 1, 4, 5),
                                              moe_layers=(2, 3), text_layers=1)
    writer = test_checkpoint._Writer(tmp_path, seed=0, device="cpu")

    class Stop(Exception):
        pass

    def stop_after_tokenizer(*args, **kwargs):  # the tokenizer is written; the 27B-wide weights are not needed here
        raise Stop

    monkeypatch.setattr("transformers.Qwen3_5TextConfig.save_pretrained", stop_after_tokenizer)
    with pytest.raises(Stop):
        test_checkpoint._write_text_encoder(writer, spec)
    assert (tmp_path / "text_encoder" / "tokenizer.json").is_file()


def test_the_serve_command_carries_the_offline_childs_env(tmp_path):
    """A server started with the printed command gets what the offline engine's child gets: the depth switch
    for a marked test tree (its workers otherwise build 40 layers and the strict loader refuses the tree) and the
    deterministic variables; a plain tree and a non-deterministic server get neither."""

    import shlex

    from magi2studio.determinism import DETERMINISTIC_ENV
    from magi2studio.engines.vllm_omni.server_client import serve_command
    from magi2studio.vocabulary.layouts import parse_layout
    from magi2studio.vocabulary.tiers import TIERS

    def env_of(model, **kwargs):
        words = shlex.split(serve_command(parse_layout("sp1-cfg1"), TIERS["272p"], model=str(model), port=8000,
                                          **kwargs))
        return dict(word.split("=", 1) for word in words[:words.index("vllm-omni")])

    tree = marked_tree(tmp_path / "test-tree")
    env = env_of(tree, metrics_dir=str(tmp_path / "metrics"))
    assert env[ENV_TEST_CHECKPOINT] == str(tree)
    assert env["MAGI2STUDIO_METRICS_DIR"] == str(tmp_path / "metrics")
    assert {key: env[key] for key in DETERMINISTIC_ENV} == DETERMINISTIC_ENV
    plain = tmp_path / "released"
    plain.mkdir()
    assert env_of(plain, deterministic=False) == {}
