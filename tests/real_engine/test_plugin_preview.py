"""The live preview on the real engine's path: the plugin's step hook writes it into the metrics
folder (rank 0 only, under CFG-parallel's ``_step_guided`` too), and no host sync inside the loop."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from magi2studio import plugin
from magi2studio.engines import live_preview
from magi2studio.engines.live_preview import PREVIEW_MAPS, LinearPreviewMap, LivePreview, read_latest
from magi2studio.engines.metrics_folder import preview_folder

from .tiny_sampler import spawn

MAP_FILE = PREVIEW_MAPS / "tiny-trained.json"


@pytest.mark.slow
def test_plugin_writes_rank0_preview_into_the_metrics_folder_under_cfg_parallel(tmp_path, monkeypatch):
    monkeypatch.setenv("MAGI2STUDIO_PREVIEW_MAP", str(MAP_FILE))
    monkeypatch.setenv("MAGI2STUDIO_PREVIEW_EVERY", "1")
    spawn(2, 2, 3, str(tmp_path))
    latest = read_latest(preview_folder(tmp_path))
    assert (latest["stage"], latest["step"], latest["total"], latest["frames"]) == ("preview", 2, 3, 2)
    with Image.open(latest["path"]) as image:  # the tiny sampler's latent: 2 frames of 2 x 4 cells, 8 px a cell
        assert image.n_frames == 2 and image.size == (4 * 8 * 6, 2 * 8 * 6)
    assert len(list(preview_folder(tmp_path).glob("*.gif"))) == live_preview.KEEP  # the newest two


def test_plugin_preview_off_without_a_map(tmp_path):
    assert plugin.live_preview_from_env(tmp_path, {}) is None
    assert plugin.live_preview_from_env(tmp_path, {"MAGI2STUDIO_PREVIEW_MAP": str(MAP_FILE),
                                                   "MAGI2STUDIO_PREVIEW_EVERY": "0"}) is None
    on = plugin.live_preview_from_env(tmp_path, {"MAGI2STUDIO_PREVIEW_MAP": str(MAP_FILE)})
    assert on.every == 10 and on.folder == preview_folder(tmp_path)


def test_the_requests_rate_in_the_metrics_folder_wins_over_the_env(tmp_path):
    """Workers start once per start options; the engine writes each request's rate (or 0: off) for rank 0."""

    from magi2studio.engines.metrics_folder import write_preview_request

    env = {"MAGI2STUDIO_PREVIEW_MAP": str(MAP_FILE), "MAGI2STUDIO_PREVIEW_EVERY": "10"}
    (preview_folder(tmp_path) / "old").mkdir(parents=True)
    write_preview_request(tmp_path, 3)
    assert plugin.live_preview_from_env(tmp_path, env).every == 3
    assert not preview_folder(tmp_path).exists()  # the previous request's pictures are gone
    write_preview_request(tmp_path, 0)
    assert plugin.live_preview_from_env(tmp_path, env) is None
    write_preview_request(tmp_path, 4)
    assert plugin.live_preview_from_env(tmp_path, {}) is None  # no map fitted: off whatever the rate


class CountingEvent:
    """A device copy's event: not done for ``busy`` polls; counts queries and waits."""

    queries = syncs = 0

    def __init__(self, busy: int) -> None:
        self.busy = busy

    def query(self) -> bool:
        CountingEvent.queries += 1
        self.busy -= 1
        return self.busy < 0

    def synchronize(self) -> None:
        CountingEvent.syncs += 1
        self.busy = -1


class DeviceLikePreview(LivePreview):
    """The device path's bookkeeping on the CPU: each copy lands only after two later polls."""

    def _start_copy(self, small):
        return small, CountingEvent(busy=2)


class Scheduler:
    predict_x0 = True

    def __init__(self) -> None:
        self.model_outputs = [None, torch.zeros(1, 48, 2, 2, 4)]


def test_no_wait_inside_the_loop_and_one_per_pending_copy_after_it(tmp_path, monkeypatch):
    CountingEvent.queries = CountingEvent.syncs = 0
    blocking = []
    monkeypatch.setattr(torch.Tensor, "item", lambda self: blocking.append("item"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: blocking.append("cuda.synchronize"))
    preview = DeviceLikePreview(tmp_path, 1, LinearPreviewMap.read(MAP_FILE))
    scheduler = Scheduler()
    for step in range(6):
        preview.after_step("preview", step, 6, scheduler)
    assert CountingEvent.syncs == 0 and blocking == []
    written_in_loop = [row["step"] for row in preview.written]
    assert written_in_loop == [0, 1, 2, 3, 4]  # each written at the next step's end; none waited for
    preview.flush()  # after the loop (the timer's own sync has run): the last, waited for once
    assert CountingEvent.syncs == 1 and [row["step"] for row in preview.written] == [0, 1, 2, 3, 4, 5]
    info = json.loads((tmp_path / "preview.json").read_text())
    assert info["step"] == 5 and (tmp_path / info["image"]).is_file()


def test_map_turns_a_latent_cell_into_its_patch():
    fitted = LinearPreviewMap.read(MAP_FILE)
    latent = torch.randn(48, 2, 3, 5, generator=torch.Generator().manual_seed(0))
    picture = fitted.apply(latent).numpy()
    assert picture.shape == (2, 3 * 8, 5 * 8, 3) and picture.dtype == np.uint8
    cell = latent[:, 1, 2, 4].numpy() @ fitted.weight + fitted.bias  # (colour, row, column)
    expected = np.clip(cell.reshape(3, 8, 8).transpose(1, 2, 0) * 127.5 + 127.5, 0, 255).astype(np.uint8)
    assert np.abs(picture[1, 16:24, 32:40].astype(int) - expected.astype(int)).max() <= 1


def test_frames_are_picked_by_a_view_at_most_eight():
    from magi2studio.engines.live_preview import MAX_FRAMES, pick_frames

    assert [len(range(count)[pick_frames(count)]) for count in (1, 4, 8, 9, 32, 63)] == [1, 4, 8, 5, 8, 8]
    assert all(len(range(count)[pick_frames(count)]) <= MAX_FRAMES for count in range(1, 200))
